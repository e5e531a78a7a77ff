"""`ragr1 scale` against a running stack's supervisor: real processes, a real Redis and real gRPC servers.

The replicas here are reward servers named as policy replicas: the scaling is the supervisor's and does not
depend on what the service is. A replica that joins with a vLLM engine and loads the announced weights
before its first prompt, and one scaled away mid-rollout, are `make test-faults`'s (tests/faults/harness.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ragr1 import cli
from ragr1.services.common.process import wait_serving
from ragr1.services.common.redis_server import free_port
from ragr1.stack import wiring
from ragr1.stack.config import StackConfig
from ragr1.stack.scale import REQUEST, Scaler, replica_name
from ragr1.stack.supervisor import RestartPolicy, ServiceSpec, Supervisor, port_in_use
from tests.common.waiting import wait_for


def stand_in(i: int) -> ServiceSpec:
    port, metrics_port = free_port(), free_port()
    return ServiceSpec(replica_name(i), ["serve", "reward", "--port", str(port), "--metrics-port", str(metrics_port)],
                       port, metrics_port, start_timeout=120)


def ragr1_scale(run_dir: Path, *flags: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "ragr1", "scale", "--run-dir", str(run_dir), *flags],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def run_until_done(supervisor: Supervisor, scaler: Scaler, command: subprocess.Popen[str],
                   timeout: float = 120.0) -> str:
    """The `ragr1 up` loop (watch, then the scaler) until ``command`` exits; returns its output."""

    def returned() -> bool:
        if command.poll() is not None:
            return True
        assert supervisor.watch(RestartPolicy()) is None
        scaler.tick()
        return False

    wait_for(returned, "ragr1 scale did not return", timeout, 0.2)
    out = command.stdout.read() if command.stdout else ""
    assert command.returncode == 0, out
    return out


def listed(run_dir: Path) -> list[str]:
    return list(json.loads((run_dir / "endpoints.json").read_text())["services"])


def test_scale_up_then_down_through_the_running_supervisor(tmp_path: Path) -> None:
    first = stand_in(0)
    with Supervisor(tmp_path, [first], free_port()) as supervisor:
        scaler = Scaler(supervisor, stand_in)
        out = run_until_done(supervisor, scaler, ragr1_scale(tmp_path, "--policy-replicas", "3"))
        assert listed(tmp_path) == ["policy", "policy-1", "policy-2"]
        assert "3 policy replicas serving" in out
        added = [spec for spec in supervisor.specs if spec.name != "policy"]
        for spec in added:
            wait_serving(spec.target, 5)  # `ragr1 scale` returned only once each one served

        out = run_until_done(supervisor, scaler, ragr1_scale(tmp_path, "--policy-replicas", "1"))
        assert listed(tmp_path) == ["policy"] and "1 policy replicas serving" in out
        # Stopped, not left running, and not restarted by the next looks.
        assert not any(port_in_use("127.0.0.1", spec.port) for spec in added)
        for _ in range(3):
            assert supervisor.watch(RestartPolicy()) is None and not supervisor.dead()
        wait_serving(first.target, 5)
    assert not port_in_use("127.0.0.1", first.port)


def test_a_bad_request_file_is_ignored_and_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    supervisor = Supervisor(tmp_path, [stand_in(0)], free_port())  # not started: the scaler only reads the file
    scaler = Scaler(supervisor, stand_in)
    for text, why in (("[1]", "not a scale request"), ('{"policy_replicas": 0}', "got 0"),
                      ('{"policy_replicas": "2"}', "whole number"), ('{"policy_replicas": true}', "got True")):
        (tmp_path / REQUEST).write_text(text)
        scaler.tick()
        assert why in capsys.readouterr().out
        assert [spec.name for spec in supervisor.specs] == ["policy"]


@pytest.mark.parametrize(("flags", "code", "message"), [
    (("--policy-replicas", "0"), 2, "policy_replicas"),
    ((), 2, "policy_replicas"),
    (("--policy-replicas", "2"), 1, "endpoints.json does not exist"),
])
def test_ragr1_scale_refuses_what_it_cannot_do(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                               flags: tuple[str, ...], code: int, message: str) -> None:
    assert cli.main(["scale", "--run-dir", str(tmp_path), *flags]) == code
    assert message in capsys.readouterr().err


def test_a_folder_whose_stack_is_gone_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "endpoints.json").write_text(json.dumps({"supervisor_pid": 2**22 + 1, "services": {}}))
    assert cli.main(["scale", "--run-dir", str(tmp_path), "--policy-replicas", "2"]) == 1
    assert "is not running" in capsys.readouterr().err
    assert not (tmp_path / REQUEST).exists()


@pytest.mark.parametrize("base_port", [0, 30000])
def test_replica_ports_are_clear_of_every_other_port_of_the_stack(base_port: int) -> None:
    ports = wiring.Ports.of(StackConfig(base_port=base_port, num_shards=4))
    replicas = [ports.replica(i) for i in range(8)]
    others = [ports.redis, ports.http, ports.router, ports.reward, ports.trainer, *ports.shards]
    assert replicas[0] == ports.policy and len(set(replicas)) == 8 and not set(replicas) & set(others)
