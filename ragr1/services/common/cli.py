"""``ragr1 redis``: a real local Redis-compatible server for the streams."""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from typing import Any

from ragr1.services.common.commands import command
from ragr1.services.common.redis_server import RedisConfig, RedisServer


def _run_redis(config: RedisConfig) -> int:
    data_dir = Path(config.aof_dir) if config.aof_dir else None
    server = RedisServer(port=config.port, host=config.host, data_dir=data_dir, password=config.password(),
                         tls=config.tls()).start()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    print(f"READY redis {server.url} (binary {server.binary}, data in {server.data_dir})", flush=True)
    try:
        while not stop.wait(0.5):
            if server.process is None or server.process.poll() is not None:
                print("redis-server exited; see redis.log in", server.data_dir)
                return 1
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0


def register(commands: Any, serve: Any) -> None:
    command(commands, "redis", RedisConfig, _run_redis, help="run a local Redis-compatible server for the queue")
