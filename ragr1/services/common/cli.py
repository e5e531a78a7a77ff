"""``ragr1 redis``: a real local Redis-compatible server for the streams."""

from __future__ import annotations

import argparse
import signal
import threading
from pathlib import Path
from typing import Any

from ragr1.services.common import ports
from ragr1.services.common.redis_server import RedisServer


def _run_redis(args: argparse.Namespace) -> int:
    server = RedisServer(port=args.port, host=args.host, data_dir=args.data_dir).start()
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
    p = commands.add_parser("redis", help="run a local Redis-compatible server for the queue")
    p.add_argument("--port", type=int, default=ports.REDIS, help="port (0 picks a free one)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--data-dir", type=Path, default=None, help="keep the append-only file here")
    p.set_defaults(run=_run_redis)
