"""Clients of the policy service: ``PolicyClient`` (blocking) and ``AsyncPolicyClient`` (asyncio), twins.
Every call takes a ``timeout`` in seconds (``None``: the client's default) and raises
``ragr1.errors.ServiceCallError`` when it fails.

with PolicyClient("127.0.0.1:50052") as policy:
    rollouts = policy.rollout([common_pb2.PromptTask(id="1", question="Who wrote Hamlet?")])
"""

from __future__ import annotations

from collections.abc import Sequence

from ragr1.services.common.client import AsyncClient, Client, flag, integer, sequence_of, text
from ragr1.v1 import common_pb2, policy_pb2, policy_pb2_grpc

# Rollouts of a batch take minutes on a CPU; weight updates wait for running rollouts.
DEFAULT_TIMEOUT = 600.0
VERSION_TIMEOUT = 10.0
# Info hashes the served checkpoint the first time it is asked for a version (seconds per GB).
INFO_TIMEOUT = 300.0


def _rollout_request(
    tasks: Sequence[common_pb2.PromptTask], sampling: common_pb2.SamplingParams | None
) -> policy_pb2.RolloutRequest:
    return policy_pb2.RolloutRequest(tasks=sequence_of("tasks", tasks, common_pb2.PromptTask), sampling=sampling)


def _generate_request(
    prompts: Sequence[str], sampling: common_pb2.SamplingParams | None, chat: bool
) -> policy_pb2.GenerateRequest:
    return policy_pb2.GenerateRequest(
        prompts=sequence_of("prompts", prompts, str), sampling=sampling, apply_chat_template=flag("chat", chat)
    )


def _update_request(version: int, checkpoint_path: str, in_flight: int) -> policy_pb2.UpdateWeightsRequest:
    return policy_pb2.UpdateWeightsRequest(
        version=integer("version", version),
        checkpoint_path=text("checkpoint_path", checkpoint_path),
        in_flight=integer("in_flight", in_flight),  # type: ignore[arg-type]
    )


class PolicyClient(Client[policy_pb2_grpc.PolicyStub]):
    stub_type = policy_pb2_grpc.PolicyStub
    default_timeout = DEFAULT_TIMEOUT

    def rollout(
        self,
        tasks: Sequence[common_pb2.PromptTask],
        sampling: common_pb2.SamplingParams | None = None,
        timeout: float | None = None,
    ) -> list[common_pb2.Rollout]:
        return list(self._call("Rollout", lambda: _rollout_request(tasks, sampling), timeout).rollouts)

    def generate(
        self,
        prompts: Sequence[str],
        sampling: common_pb2.SamplingParams | None = None,
        *,
        chat: bool = True,
        timeout: float | None = None,
    ) -> policy_pb2.GenerateResponse:
        return self._call("Generate", lambda: _generate_request(prompts, sampling, chat), timeout)

    def update_weights(
        self,
        version: int,
        checkpoint_path: str,
        in_flight: int = policy_pb2.IN_FLIGHT_POLICY_UNSPECIFIED,
        timeout: float | None = None,
    ) -> policy_pb2.UpdateWeightsResponse:
        return self._call("UpdateWeights", lambda: _update_request(version, checkpoint_path, in_flight), timeout)

    def weight_version(self, timeout: float = VERSION_TIMEOUT) -> policy_pb2.GetWeightVersionResponse:
        return self._call("GetWeightVersion", policy_pb2.GetWeightVersionRequest(), timeout)

    def info(self, timeout: float = INFO_TIMEOUT) -> policy_pb2.PolicyInfoResponse:
        return self._call("Info", policy_pb2.PolicyInfoRequest(), timeout)


class AsyncPolicyClient(AsyncClient[policy_pb2_grpc.PolicyStub]):
    stub_type = policy_pb2_grpc.PolicyStub
    default_timeout = DEFAULT_TIMEOUT

    async def rollout(
        self,
        tasks: Sequence[common_pb2.PromptTask],
        sampling: common_pb2.SamplingParams | None = None,
        timeout: float | None = None,
    ) -> list[common_pb2.Rollout]:
        return list((await self._call("Rollout", lambda: _rollout_request(tasks, sampling), timeout)).rollouts)

    async def generate(
        self,
        prompts: Sequence[str],
        sampling: common_pb2.SamplingParams | None = None,
        *,
        chat: bool = True,
        timeout: float | None = None,
    ) -> policy_pb2.GenerateResponse:
        return await self._call("Generate", lambda: _generate_request(prompts, sampling, chat), timeout)

    async def update_weights(
        self,
        version: int,
        checkpoint_path: str,
        in_flight: int = policy_pb2.IN_FLIGHT_POLICY_UNSPECIFIED,
        timeout: float | None = None,
    ) -> policy_pb2.UpdateWeightsResponse:
        return await self._call("UpdateWeights", lambda: _update_request(version, checkpoint_path, in_flight), timeout)

    async def weight_version(self, timeout: float = VERSION_TIMEOUT) -> policy_pb2.GetWeightVersionResponse:
        return await self._call("GetWeightVersion", policy_pb2.GetWeightVersionRequest(), timeout)

    async def info(self, timeout: float = INFO_TIMEOUT) -> policy_pb2.PolicyInfoResponse:
        return await self._call("Info", policy_pb2.PolicyInfoRequest(), timeout)
