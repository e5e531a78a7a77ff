"""``ragr1.v1.Policy`` over gRPC: protobuf in, plain calls on ``Policy``, protobuf out."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from ragr1.services.common.errors import InvalidArgument
from ragr1.services.common.provenance import code_commit
from ragr1.services.policy.rollouts import SEARCH_MODES, Scorer, build_rollouts, expand, sampling_params, task_of
from ragr1.services.policy.runtime import Policy
from ragr1.services.policy.weights import InFlight
from ragr1.v1 import common_pb2, policy_pb2, policy_pb2_grpc


class PolicyServicer(policy_pb2_grpc.PolicyServicer):
    def __init__(self, policy: Policy, scorer: Scorer | None) -> None:
        self.policy = policy
        self.scorer = scorer
        self._commit: str | None = None

    def _sampling(self, s: common_pb2.SamplingParams) -> Any:
        return self.policy.sampling(s.temperature, s.top_p, s.max_tokens, s.seed, list(s.stop))

    async def Rollout(self, request: policy_pb2.RolloutRequest, context: Any) -> policy_pb2.RolloutResponse:
        tasks = expand(request.tasks, self.policy.limits.max_batch)
        sampling = self._sampling(request.sampling)
        trajectories = await self.policy.rollout([task_of(t) for t in tasks], sampling)
        rollouts = await build_rollouts(trajectories, tasks, self.policy.tokenizer, self.scorer, sampling)
        return policy_pb2.RolloutResponse(rollouts=rollouts)

    async def Generate(
        self, request: policy_pb2.GenerateRequest, context: Any
    ) -> policy_pb2.GenerateResponse:
        generations, version = await self.policy.generate(
            list(request.prompts), self._sampling(request.sampling), chat=request.apply_chat_template
        )
        decode = self.policy.tokenizer.decode
        return policy_pb2.GenerateResponse(
            completions=[
                policy_pb2.Completion(
                    text=decode(g.token_ids, skip_special_tokens=True),
                    token_ids=g.token_ids,
                    logprobs=g.logprobs,
                    finish_reason=g.finish_reason,
                )
                for g in generations
            ],
            weight_version=version,
        )

    async def UpdateWeights(
        self, request: policy_pb2.UpdateWeightsRequest, context: Any
    ) -> policy_pb2.UpdateWeightsResponse:
        in_flight = None
        if request.in_flight != policy_pb2.IN_FLIGHT_POLICY_UNSPECIFIED:
            try:
                in_flight = InFlight(request.in_flight)
            except ValueError:
                raise InvalidArgument(
                    f"in_flight {request.in_flight} is not a known InFlightPolicy"
                ) from None
        seconds = await self.policy.update_weights(request.version, request.checkpoint_path, in_flight)
        return policy_pb2.UpdateWeightsResponse(version=request.version, seconds=seconds)

    async def GetWeightVersion(
        self, request: policy_pb2.GetWeightVersionRequest, context: Any
    ) -> policy_pb2.GetWeightVersionResponse:
        gate = self.policy.gate
        return policy_pb2.GetWeightVersionResponse(version=gate.version, checkpoint_path=gate.checkpoint_path)

    async def Info(self, request: policy_pb2.PolicyInfoRequest, context: Any) -> policy_pb2.PolicyInfoResponse:
        policy = self.policy
        cfg = policy.loop.config
        if self._commit is None:
            self._commit = await asyncio.to_thread(code_commit)
        reply = policy_pb2.PolicyInfoResponse(
            mode=SEARCH_MODES[cfg.search_mode],
            max_turns=cfg.max_turns,
            max_queries_per_search=cfg.max_queries_per_search,
            query_separator=cfg.query_separator,
            top_k=cfg.top_k,
            tokens_per_query=cfg.tokens_per_query,
            max_model_len=cfg.max_model_len,
            default_sampling=sampling_params(policy.default_sampling),
            engine_seed=policy.engine_seed,
            code_commit=self._commit,
        )
        try:
            version, path, sha = await policy.served_checkpoint()
            reply.checkpoint_sha256 = sha
        except OSError as exc:
            version, path = policy.gate.version, Path(policy.gate.checkpoint_path or policy.model_dir)
            reply.checkpoint_error = f"{type(exc).__name__}: {exc}"
        reply.weight_version, reply.checkpoint_path = version, str(path)
        retriever, error = await policy.retriever_info()
        if retriever is not None:
            reply.retriever.CopyFrom(retriever)
        reply.retriever_error = error
        return reply
