"""The supervisor owns its processes: a started stack used as a context manager is neither started twice
nor left running; a service that dies is restarted, and one that keeps dying stops the stack (a real
Redis and a real reward service)."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
import redis

from ragr1.services.common.client import ChannelOptions
from ragr1.services.common.config import load
from ragr1.services.common.process import wait_serving
from ragr1.services.common.redis_server import free_port
from ragr1.services.reward.client import RewardClient
from ragr1.services.trainer.config import PPOConfig
from ragr1.stack.supervisor import RestartPolicy, ServiceSpec, Supervisor, port_in_use
from ragr1.v1 import reward_pb2
from tests.common.waiting import wait_for


def reward_spec() -> ServiceSpec:
    port, metrics_port = free_port(), free_port()
    return ServiceSpec("reward", ["serve", "reward", "--port", str(port), "--metrics-port", str(metrics_port)],
                       port, metrics_port, start_timeout=120)


def test_a_started_stack_in_a_with_block_stops_everything_on_exit(tmp_path: Path) -> None:
    spec, redis_port = reward_spec(), free_port()
    reward_port = spec.port
    supervisor = Supervisor(tmp_path, [spec], redis_port).start()
    with supervisor as same:  # must not re-check its own ports and fail, which would orphan them all
        assert same is supervisor and not supervisor.dead()
        assert port_in_use("127.0.0.1", redis_port) and port_in_use("127.0.0.1", reward_port)
    assert not port_in_use("127.0.0.1", redis_port) and not port_in_use("127.0.0.1", reward_port)


def watch_until(supervisor: Supervisor, policy: RestartPolicy, done: Callable[[], object],
                timeout: float = 60.0) -> str | None:
    """Runs the supervisor's watch until ``done()`` holds or it gives up; returns its reason to stop."""
    reason: list[str | None] = [None]

    def stopped() -> bool:
        reason[0] = supervisor.watch(policy)
        return reason[0] is not None or bool(done())

    wait_for(stopped, "the supervisor neither restarted the service nor gave up", timeout, 0.1)
    return reason[0]


def test_a_dead_service_is_restarted_and_one_that_keeps_dying_stops_the_stack(tmp_path: Path) -> None:
    policy = RestartPolicy(max_restarts=2, window_seconds=600, first_backoff=0.2)
    spec = reward_spec()
    with Supervisor(tmp_path, [spec], free_port()) as supervisor:
        # Redis keeps what it acknowledged across its own restart (append-only file in the run folder).
        client = supervisor.redis.client()  # type: ignore[union-attr]
        client.xadd("ragr1:prompts", {"payload": b"kept"})  # killed at once: appendfsync always, not everysec
        client.close()
        supervisor.redis.process.send_signal(signal.SIGKILL)  # type: ignore[union-attr]
        supervisor.redis.process.wait()  # type: ignore[union-attr]
        assert watch_until(supervisor, policy, lambda: "redis" not in supervisor.dead()) is None
        client = supervisor.redis.client()  # type: ignore[union-attr]
        assert client.xlen("ragr1:prompts") == 1
        client.close()

        for restart in (1, 2):
            supervisor.processes["reward"].signal(signal.SIGKILL)
            supervisor.processes["reward"].process.wait()  # type: ignore[union-attr]
            assert watch_until(supervisor, policy, lambda: not supervisor.dead()) is None
            wait_serving(spec.target, 60)  # the same address serves again, nothing else restarted
            endpoints = json.loads((tmp_path / "endpoints.json").read_text())
            assert endpoints["services"]["reward"]["restarts"] == restart and endpoints["redis_restarts"] == 1
        # A third death within the window: the supervisor gives up, naming the service and its log.
        supervisor.processes["reward"].signal(signal.SIGKILL)
        supervisor.processes["reward"].process.wait()  # type: ignore[union-attr]
        reason = watch_until(supervisor, policy, lambda: False)
        assert reason is not None and "reward died" in reason and "reward.log" in reason
        assert "gave up: restarted 2 times" in reason


def test_with_auth_every_service_needs_the_token_redis_its_password_and_no_secret_is_shown(tmp_path: Path) -> None:
    """``ragr1 up --auth``: the secrets are random, in files only their owner reads; a service started by
    the supervisor refuses a call without the token and answers with it; Redis refuses a client without
    its password; the settings of the queue's users find it through the environment the supervisor sets;
    neither secret is in endpoints.json, a log or a command line; a stack started again in the same run
    folder keeps them."""
    spec = reward_spec()
    with Supervisor(tmp_path, [spec], free_port(), auth=True) as supervisor:
        auth = supervisor.auth
        assert auth is not None
        assert (tmp_path / "secrets").stat().st_mode & 0o777 == 0o700
        assert all(f.stat().st_mode & 0o777 == 0o600 for f in (auth.token_file, auth.redis_password_file))
        assert len(auth.token) >= 40 and auth.token != auth.redis_password
        empty = reward_pb2.ScoreRequest()
        with RewardClient(spec.target, ChannelOptions(token="")) as anonymous:
            with pytest.raises(grpc.RpcError) as refused:
                anonymous.stub.Score(empty, timeout=10)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert anonymous.health(timeout=10)  # probes carry no token
        with RewardClient(spec.target, auth.channel_options()) as client:
            assert client.stub.Score(empty, timeout=10) == reward_pb2.ScoreResponse()
        assert supervisor.redis is not None
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(host=supervisor.redis.host, port=supervisor.redis.port).ping()
        # The queue settings find the password through the env the supervisor gives every service.
        trainer_settings = load(PPOConfig, env={**auth.env(), "RAGR1_REDIS_URL": supervisor.redis.url})
        assert trainer_settings.redis_password_file == str(auth.redis_password_file)
        assert trainer_settings.redis_client().ping()
        secrets = [auth.token, auth.redis_password]
        process = supervisor.processes["reward"].process
        assert process is not None
        shown = [
            (tmp_path / "endpoints.json").read_text(), (tmp_path / "logs" / "reward.log").read_text(),
            (tmp_path / "redis" / "redis.log").read_text(), Path(f"/proc/{process.pid}/cmdline").read_text(),
        ]
        assert not [s for s in secrets if any(s in text for text in shown)]
        assert json.loads(shown[0])["secrets"]["token_file"] == str(auth.token_file)
    again = Supervisor(tmp_path, [reward_spec()], free_port(), auth=True)
    assert again.auth is not None and [again.auth.token, again.auth.redis_password] == secrets


class Interrupted(Exception):
    pass


def test_a_second_ctrl_c_while_stopping_does_not_leave_services_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The services run in process groups of their own (so that a killed service's vLLM children go with
    it), which a terminal's Ctrl-C does not reach: a stop cut short by a second Ctrl-C left the retriever
    and the reward service running after `ragr1 up` had exited. The stop now finishes first."""

    def interrupt(_signum: int, _frame: object) -> None:
        raise Interrupted

    previous = signal.signal(signal.SIGINT, interrupt)
    try:
        supervisor = Supervisor(tmp_path, [reward_spec()], free_port()).start()
        reward = supervisor.processes["reward"]
        assert reward.process is not None
        stop = reward.stop

        def stop_after_ctrl_c(timeout: float = 30.0) -> int | None:
            os.kill(os.getpid(), signal.SIGINT)  # the user presses Ctrl-C again
            return stop(timeout)

        monkeypatch.setattr(reward, "stop", stop_after_ctrl_c)
        process = reward.process
        supervisor.stop()
        assert process.poll() is not None and supervisor.redis is None and not supervisor.processes
        assert signal.getsignal(signal.SIGINT) is interrupt  # Ctrl-C works as before once stopped
    finally:
        signal.signal(signal.SIGINT, previous)


def test_backoff_doubles_up_to_its_cap() -> None:
    policy = RestartPolicy(first_backoff=1.0, max_backoff=5.0)
    assert [policy.backoff(n) for n in range(5)] == [1.0, 2.0, 4.0, 5.0, 5.0]
