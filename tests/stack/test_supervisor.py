"""The supervisor owns its processes: a started stack used as a context manager is neither started twice
nor left running (a real Redis and a real reward service)."""

from __future__ import annotations

from pathlib import Path

from ragr1.services.common.redis_server import free_port
from ragr1.stack.supervisor import ServiceSpec, Supervisor, port_in_use


def test_a_started_stack_in_a_with_block_stops_everything_on_exit(tmp_path: Path) -> None:
    reward_port, metrics_port, redis_port = free_port(), free_port(), free_port()
    spec = ServiceSpec("reward", ["serve", "reward", "--port", str(reward_port), "--metrics-port",
                                  str(metrics_port)], reward_port, metrics_port, start_timeout=120)
    supervisor = Supervisor(tmp_path, [spec], redis_port).start()
    with supervisor as same:  # must not re-check its own ports and fail, which would orphan them all
        assert same is supervisor and not supervisor.dead()
        assert port_in_use("127.0.0.1", redis_port) and port_in_use("127.0.0.1", reward_port)
    assert not port_in_use("127.0.0.1", redis_port) and not port_in_use("127.0.0.1", reward_port)
