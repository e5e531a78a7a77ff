"""``ragr1.v1.Policy`` over gRPC: protobuf in, plain calls on ``Policy``, protobuf out."""

from __future__ import annotations

from typing import Any

from ragr1.services.common.errors import InvalidArgument
from ragr1.services.policy.rollouts import Scorer, build_rollouts, expand, task_of
from ragr1.services.policy.runtime import Policy
from ragr1.services.policy.weights import InFlight
from ragr1.v1 import common_pb2, policy_pb2, policy_pb2_grpc


class PolicyServicer(policy_pb2_grpc.PolicyServicer):
    def __init__(self, policy: Policy, scorer: Scorer | None) -> None:
        self.policy = policy
        self.scorer = scorer

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
