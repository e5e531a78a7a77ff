"""The metrics every gRPC server exports, and the endpoint that serves them.

Names follow ``ragr1_<component>_<what>_<unit>``; latencies are histograms in seconds. Each service
defines its own metrics in its ``metrics.py``; this module holds the shared ones.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram, start_http_server

# Buckets from 1 ms to 5 min: retrieval calls take milliseconds, rollouts and weight updates minutes.
LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
)
SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)

RPC_REQUESTS = Counter(
    "ragr1_grpc_server_requests_total",
    "gRPC calls handled, by service, method and status code.",
    ["service", "method", "code"],
)
RPC_LATENCY_NAME = "ragr1_grpc_server_handling_seconds"
RPC_LATENCY = Histogram(
    RPC_LATENCY_NAME,
    "Time from receiving a gRPC call to sending its answer.",
    ["service", "method"],
    buckets=LATENCY_BUCKETS,
)
RPC_IN_FLIGHT = Gauge(
    "ragr1_grpc_server_in_flight",
    "gRPC calls being handled now.",
    ["service"],
)
SERVING = Gauge(
    "ragr1_grpc_server_serving",
    "1 while the server reports SERVING to health checks, else 0.",
    ["service"],
)


def serve_metrics(host: str, port: int) -> int:
    """Starts the Prometheus endpoint (``/metrics``) on a daemon thread; returns the bound port."""
    try:
        server, _thread = start_http_server(port, addr=host)
    except OSError as exc:
        raise OSError(f"metrics port {host}:{port}: {exc.strerror or exc} (set --metrics-port)") from exc
    return int(server.server_port)
