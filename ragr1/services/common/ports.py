"""Default ports of every service: the one place they are written.

The metrics endpoint of a service listens on its gRPC port + ``METRICS_OFFSET`` unless configured.
The Helm chart and docker-compose file use the same numbers.
"""

from __future__ import annotations

import socket

RETRIEVER = 50051
POLICY = 50052
REWARD = 50053
TRAINER = 50054
# Shard i of the retriever listens on RETRIEVER_SHARD + i.
RETRIEVER_SHARD = 50061
# A local stack's policy replica i > 0 (the first listens on POLICY) listens on POLICY_REPLICA + i - 1.
POLICY_REPLICA = 50071
# Search-R1-compatible HTTP endpoint of the router.
RETRIEVER_HTTP = 8000
# The local stack's Redis, and the URL the policy and trainer use when none is given.
REDIS = 6379
REDIS_URL = f"redis://127.0.0.1:{REDIS}/0"

METRICS_OFFSET = 1000


def port_in_use(host: str, port: int) -> bool:
    """Whether something listens on ``host:port`` (checked by binding it, as a server would)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False
