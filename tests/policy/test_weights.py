from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest

from ragr1.services.common.errors import FailedPrecondition, InvalidArgument, Unavailable
from ragr1.services.policy.weights import InFlight, VersionGate, check_checkpoint
from tests.common.waiting import wait_event_async, wait_for_async


def copy_checkpoint(source: Path, target: Path) -> Path:
    shutil.copytree(source, target)
    return target


def test_the_served_checkpoint_passes(policy_model_dir: Path, tmp_path: Path) -> None:
    same = copy_checkpoint(policy_model_dir, tmp_path / "same")
    assert check_checkpoint(policy_model_dir, str(same)) == same


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (lambda d: shutil.rmtree(d), "does not exist"),
        (lambda d: (d / "config.json").unlink(), "no config.json"),
        (lambda d: [f.unlink() for f in d.glob("*.safetensors")], "no *.safetensors"),
        (lambda d: (d / "config.json").write_text("{"), "not JSON"),
        (
            lambda d: (d / "config.json").write_text(
                json.dumps({**json.loads((d / "config.json").read_text()), "vocab_size": 7})
            ),
            "vocab_size is 7",
        ),
    ],
)
def test_bad_checkpoints_are_refused_with_the_reason(
    policy_model_dir: Path, tmp_path: Path, damage: object, reason: str
) -> None:
    candidate = copy_checkpoint(policy_model_dir, tmp_path / "bad")
    damage(candidate)  # type: ignore[operator]
    with pytest.raises(FailedPrecondition, match=reason.replace("*", r"\*")):
        check_checkpoint(policy_model_dir, str(candidate))


def test_a_tensor_of_the_wrong_shape_is_refused(policy_model_dir: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    candidate = copy_checkpoint(policy_model_dir, tmp_path / "shape")
    (file,) = candidate.glob("*.safetensors")
    tensors = load_file(str(file))
    name = next(k for k in tensors if k.endswith("mlp.up_proj.weight"))
    tensors[name] = tensors[name][:-1].contiguous()
    save_file(tensors, str(file))
    with pytest.raises(FailedPrecondition, match=f"tensor {name} has shape"):
        check_checkpoint(policy_model_dir, str(candidate))


def test_empty_path_is_invalid(policy_model_dir: Path) -> None:
    with pytest.raises(InvalidArgument):
        check_checkpoint(policy_model_dir, " ")


def test_a_path_the_filesystem_refuses_is_invalid_not_a_crash(policy_model_dir: Path) -> None:
    # Found by fuzzing UpdateWeights: a 600-byte name made is_dir() raise ENAMETOOLONG, answered INTERNAL.
    with pytest.raises(InvalidArgument, match="cannot be read: File name too long"):
        check_checkpoint(policy_model_dir, "é" * 300)
    with pytest.raises(FailedPrecondition, match="does not exist"):
        check_checkpoint(policy_model_dir, "/no/such\x00dir")


def test_finish_lets_running_rollouts_end_on_the_old_version() -> None:
    async def scenario() -> list[str]:
        gate = VersionGate()
        events: list[str] = []
        release = asyncio.Event()
        started, arrived = asyncio.Event(), asyncio.Event()

        async def rollout(name: str) -> None:
            arrived.set()
            async with gate.rollout() as version:
                events.append(f"{name} starts on v{version}")
                started.set()
                await release.wait()
                events.append(f"{name} ends")

        async def load() -> None:
            events.append("load")

        first = asyncio.create_task(rollout("a"))
        await wait_event_async(started, "rollout a never started")
        update = asyncio.create_task(gate.update(1, "/ckpt", load, in_flight=InFlight.FINISH, abort=_never))
        await wait_for_async(lambda: gate.closed, "the update never closed the gate")
        arrived.clear()
        late = asyncio.create_task(rollout("b"))  # arrives during the update: waits for the new weights
        await wait_event_async(arrived, "rollout b never reached the gate")
        assert events == ["a starts on v0"]  # b reached the closed gate and waits there
        release.set()
        await asyncio.gather(first, update, late)
        assert (gate.version, gate.checkpoint_path) == (1, "/ckpt")
        return events

    assert asyncio.run(scenario()) == ["a starts on v0", "a ends", "load", "b starts on v1", "b ends"]


async def _never() -> None:
    raise AssertionError("abort called under FINISH")


def test_abort_asks_running_rollouts_to_stop() -> None:
    async def scenario() -> tuple[bool, int]:
        gate = VersionGate()
        entered, asked, seen_abort = asyncio.Event(), asyncio.Event(), asyncio.Event()
        aborted: list[bool] = []

        async def rollout() -> None:
            async with gate.rollout():
                entered.set()
                await wait_event_async(asked, "the update never called abort")
                assert gate.abort_requested  # what a rollout that polls instead of being aborted sees
                seen_abort.set()

        async def abort() -> None:
            aborted.append(True)
            asked.set()

        async def load() -> None:
            assert seen_abort.is_set()

        task = asyncio.create_task(rollout())
        await wait_event_async(entered, "the rollout never started")
        await gate.update(3, "/c", load, in_flight=InFlight.ABORT, abort=abort)
        await task
        return bool(aborted) and not gate.abort_requested, gate.version

    assert asyncio.run(scenario()) == (True, 3)


def test_a_failed_load_closes_the_gate_until_a_load_succeeds() -> None:
    """A load that fails part-way leaves the engine's weights unknown: nothing runs on them (UNAVAILABLE, with
    the reason), an older version is still refused, and a retry of the same version that loads reopens it."""
    async def scenario() -> tuple[str, int]:
        gate = VersionGate(version=4)

        async def broken() -> None:
            raise RuntimeError("disk gone")

        async def fine() -> None:
            return None

        with pytest.raises(RuntimeError):
            await gate.update(5, "/x", broken, in_flight=InFlight.FINISH, abort=_never)
        with pytest.raises(Unavailable, match="disk gone") as refused:
            async with gate.rollout():
                pass
        with pytest.raises(InvalidArgument, match="greater than the current 4"):
            await gate.update(3, "/x", fine, in_flight=InFlight.FINISH, abort=_never)
        await gate.update(5, "/x", fine, in_flight=InFlight.FINISH, abort=_never)
        async with gate.rollout() as version:
            return str(refused.value), version

    reason, version = asyncio.run(scenario())
    assert "v5 from /x" in reason and version == 5
