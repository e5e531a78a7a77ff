"""Redis over TLS as the chart and the compose overlay deploy it: the chart's own Redis command line and
readiness probe run for real against a real redis-server, and its queue users reach it with the
environment the chart gives them; the compose overlay gives the same settings."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import helm_python

from ragr1.services.common.config import load
from ragr1.services.common.redis_server import free_port
from ragr1.services.trainer.config import PPOConfig
from tests.common.pki import write_pki
from tests.common.waiting import wait_for
from tests.deploy.charts import container, env, render
from tests.deploy.compose import config as compose_config

TLS_DIR = "/var/run/secrets/ragr1/tls"  # where the chart mounts its TLS Secret


def test_the_charts_redis_serves_tls_only_and_its_probe_and_queue_users_get_in(
        chart: helm_python.Chart, tmp_path: Path) -> None:
    """tls.enabled + tls.mutual: the Redis pod's command (password file, TLS-only port, client certificates
    required) run as the pod runs it, its readiness probe, and the trainer's settings from the chart's env."""
    objects = render(chart, {"tls": {"enabled": True, "secretName": "ragr1-tls", "mutual": True}})
    secret = tmp_path / "tls"
    secret.mkdir()
    pki = write_pki(secret, names=["ragr1-redis"])
    for source, name in (("ca", "ca.crt"), ("server_cert", "tls.crt"), ("server_key", "tls.key")):
        shutil.copy(pki[source], secret / name)
    port = free_port()

    def here(text: str) -> str:
        """The pod's paths and port on this machine."""
        for pod, local in ((TLS_DIR, str(secret)), ("/tmp/auth.conf", str(tmp_path / "auth.conf")),
                           ("--dir /data", f"--dir {tmp_path}"), ("--tls-port 6379", f"--tls-port {port}"),
                           ("redis-cli ", f"redis-cli -p {port} ")):
            text = text.replace(pod, local)
        return text

    redis_pod = container(objects, "StatefulSet", "redis")
    shell, flag, script = redis_pod["command"]
    assert "--port 0 --tls-port 6379" in script and "--tls-auth-clients yes" in script
    pod_env = {**os.environ, "REDIS_PASSWORD": "pod-password"}
    server = subprocess.Popen([shell, flag, here(script) + " --bind 127.0.0.1"], env=pod_env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        probe = redis_pod["readinessProbe"]["exec"]["command"]

        def ready() -> bool:
            assert server.poll() is None, "the chart's redis-server command exited"
            return subprocess.run([*probe[:2], here(probe[2])], env=pod_env).returncode == 0

        wait_for(ready, "the chart's readiness probe never passed", 20, 0.2)
        trainer_env = {e["name"]: e.get("value", "") for e in container(objects, "Deployment", "trainer")["env"]}
        assert trainer_env["RAGR1_REDIS_URL"].startswith("rediss://")
        trainer_env["RAGR1_REDIS_URL"] = (trainer_env["RAGR1_REDIS_URL"].replace("$(REDIS_PASSWORD)", "pod-password")
                                          .replace("ragr1-redis:6379", f"ragr1-redis:{port}"))
        settings = load(PPOConfig, env={k: here(v) for k, v in trainer_env.items() if k.startswith("RAGR1_REDIS")})
        client = settings.redis_client()
        # The Service's DNS name does not resolve here: the same server through 127.0.0.1, which the test
        # certificate names too (the hostname check stays on).
        client.connection_pool.connection_kwargs["host"] = "127.0.0.1"
        assert client.xadd("prompts", {"id": "p1"}) and client.xlen("prompts") == 1
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_without_tls_the_charts_redis_and_its_users_speak_plain_redis(chart: helm_python.Chart) -> None:
    objects = render(chart)
    assert "--tls" not in " ".join(container(objects, "StatefulSet", "redis")["command"])
    trainer_env = env(container(objects, "Deployment", "trainer"))
    assert trainer_env["RAGR1_REDIS_URL"].startswith("redis://")
    assert not {"RAGR1_REDIS_CA_FILE", "RAGR1_REDIS_CERT_FILE"} & set(trainer_env)
    # An external rediss:// Redis gets the chart's CA with tls.enabled; a plain external one does not.
    for url, ca in (("rediss://redis.example:6379/0", True), ("redis://redis.example:6379/0", False)):
        external = render(chart, {"redis": {"enabled": False, "url": url},
                                  "tls": {"enabled": True, "secretName": "ragr1-tls"}})
        assert ("RAGR1_REDIS_CA_FILE" in env(container(external, "Deployment", "trainer"))) == ca, url


def test_the_compose_tls_overlay_gives_the_queue_users_rediss_and_their_files() -> None:
    services = compose_config("docker-compose.yml", "docker-compose.auth.yml", "docker-compose.tls.yml")["services"]
    assert "--tls-port 6379" in services["redis"]["environment"]["RAGR1_REDIS_TLS_ARGS"]
    assert "RAGR1_REDIS_TLS_ARGS" in " ".join(services["redis"]["command"])
    for name in ("policy", "trainer"):
        variables = services[name]["environment"]
        assert variables["RAGR1_REDIS_URL"] == "rediss://redis:6379/0", name
        mounted = {f"/run/secrets/{s['source']}" for s in services[name]["secrets"]}
        for what in ("CA", "CERT", "KEY", "PASSWORD"):
            assert variables[f"RAGR1_REDIS_{what}_FILE"] in mounted, (name, what)
    plain = compose_config("docker-compose.yml")["services"]
    assert plain["trainer"]["environment"]["RAGR1_REDIS_URL"] == plain["policy"]["environment"]["RAGR1_REDIS_URL"]
