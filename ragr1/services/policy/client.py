"""Clients of the policy service: ``PolicyClient`` (blocking) and ``AsyncPolicyClient`` (asyncio).

with PolicyClient("127.0.0.1:50052") as policy:
    rollouts = policy.rollout([common_pb2.PromptTask(id="1", question="Who wrote Hamlet?")])
"""

from __future__ import annotations

from collections.abc import Sequence

from ragr1.services.common.client import AsyncClient, Client
from ragr1.v1 import common_pb2, policy_pb2, policy_pb2_grpc

# Rollouts of a batch take minutes on a CPU; weight updates wait for running rollouts.
DEFAULT_TIMEOUT = 600.0
VERSION_TIMEOUT = 10.0
# Info hashes the served checkpoint the first time it is asked for a version (seconds per GB).
INFO_TIMEOUT = 300.0


def _rollout_request(
    tasks: Sequence[common_pb2.PromptTask], sampling: common_pb2.SamplingParams | None
) -> policy_pb2.RolloutRequest:
    return policy_pb2.RolloutRequest(tasks=list(tasks), sampling=sampling)


def _generate_request(
    prompts: Sequence[str], sampling: common_pb2.SamplingParams | None, chat: bool
) -> policy_pb2.GenerateRequest:
    return policy_pb2.GenerateRequest(prompts=list(prompts), sampling=sampling, apply_chat_template=chat)


def _update_request(version: int, checkpoint_path: str, in_flight: int) -> policy_pb2.UpdateWeightsRequest:
    return policy_pb2.UpdateWeightsRequest(
        version=version,
        checkpoint_path=checkpoint_path,
        in_flight=in_flight,  # type: ignore[arg-type]
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
        return list(self.stub.Rollout(_rollout_request(tasks, sampling), timeout=timeout).rollouts)

    def generate(
        self,
        prompts: Sequence[str],
        sampling: common_pb2.SamplingParams | None = None,
        *,
        chat: bool = True,
        timeout: float | None = None,
    ) -> policy_pb2.GenerateResponse:
        return self.stub.Generate(_generate_request(prompts, sampling, chat), timeout=timeout)

    def update_weights(
        self,
        version: int,
        checkpoint_path: str,
        in_flight: int = policy_pb2.IN_FLIGHT_POLICY_UNSPECIFIED,
        timeout: float | None = None,
    ) -> policy_pb2.UpdateWeightsResponse:
        return self.stub.UpdateWeights(_update_request(version, checkpoint_path, in_flight), timeout=timeout)

    def weight_version(self, timeout: float = VERSION_TIMEOUT) -> policy_pb2.GetWeightVersionResponse:
        return self.stub.GetWeightVersion(policy_pb2.GetWeightVersionRequest(), timeout=timeout)

    def info(self, timeout: float = INFO_TIMEOUT) -> policy_pb2.PolicyInfoResponse:
        return self.stub.Info(policy_pb2.PolicyInfoRequest(), timeout=timeout)


class AsyncPolicyClient(AsyncClient[policy_pb2_grpc.PolicyStub]):
    stub_type = policy_pb2_grpc.PolicyStub
    default_timeout = DEFAULT_TIMEOUT

    async def rollout(
        self,
        tasks: Sequence[common_pb2.PromptTask],
        sampling: common_pb2.SamplingParams | None = None,
        timeout: float | None = None,
    ) -> list[common_pb2.Rollout]:
        reply = await self.stub.Rollout(_rollout_request(tasks, sampling), timeout=timeout)
        return list(reply.rollouts)

    async def generate(
        self,
        prompts: Sequence[str],
        sampling: common_pb2.SamplingParams | None = None,
        *,
        chat: bool = True,
        timeout: float | None = None,
    ) -> policy_pb2.GenerateResponse:
        return await self.stub.Generate(_generate_request(prompts, sampling, chat), timeout=timeout)

    async def update_weights(
        self,
        version: int,
        checkpoint_path: str,
        in_flight: int = policy_pb2.IN_FLIGHT_POLICY_UNSPECIFIED,
        timeout: float | None = None,
    ) -> policy_pb2.UpdateWeightsResponse:
        return await self.stub.UpdateWeights(_update_request(version, checkpoint_path, in_flight), timeout=timeout)

    async def weight_version(self, timeout: float = VERSION_TIMEOUT) -> policy_pb2.GetWeightVersionResponse:
        return await self.stub.GetWeightVersion(policy_pb2.GetWeightVersionRequest(), timeout=timeout)

    async def info(self, timeout: float = INFO_TIMEOUT) -> policy_pb2.PolicyInfoResponse:
        return await self.stub.Info(policy_pb2.PolicyInfoRequest(), timeout=timeout)
