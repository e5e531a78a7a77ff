"""`make test-docker`: the CPU images (one per role) built and the compose stack run under a real Docker
engine, then checked the way a user would check it; once as docker-compose.yml is, once with auth on (the
auth overlay, and Redis over TLS with client certificates: docker-compose.tls.yml).

    .venv/bin/python -m tests.docker.harness [--modes plain,auth] [--keep-going]

1. The engine: `dockerd` is started when it is installed and not running (and stopped at the end);
   when it is not installed, this says how to install it.
2. Images, cached between runs: a Python 3.11 base made from Debian packages (debootstrap, then
   tests/docker/images/python.Dockerfile) for machines that reach no registry, stand-ins for the
   Redis and Prometheus images compose pulls (Debian's redis-server and prometheus) where those
   cannot be pulled, and the project's images, one per role (the targets of docker/Dockerfile), with
   the build arguments a machine behind a proxy needs (pip's CA bundle, and pip's local torch wheel).
   Built twice, to time a build from cache too; the time of the first build without any cache is kept
   in .cache/docker-test/cold-build.json.
3. The images' contents and run-time needs: the reward and retriever images hold no torch and no vLLM
   (and the reward image is under 1 GB); vLLM's extension loads in the policy image (libnuma), and
   torch.compile works inside a policy container run with compose's settings (a compiler, Python's
   headers, an executable /tmp).
4. For each mode, `docker-compose up` of every service but Grafana (no image), and the checks: every
   container healthy (the index job exited 0) and none restarted; `curl` to the router's /retrieve
   returns passages; a gRPC client generated from proto/ alone calls the retriever through the
   published port (with auth on: refused without the token, answered with it; and Redis refuses a
   client without its password, and one without TLS); the trainer makes at least two PPO updates through Redis and the
   policy's GetWeightVersion follows them; Prometheus reports every ragr1 target up and every dashboard
   query returns data; `down -v` leaves no container, volume or network of the project. Figures: each
   image's size, build times, the time from `up` to every container healthy, the trainer's peak memory.
5. In the plain run, the rollout fleet grows while training: after the trainer's first update,
   `up -d --scale policy=2 --no-recreate policy` (as docs/deployment.md tells a user) adds a replica to
   the running stack. It must become healthy; the fleet in Redis (`ragr1:replicas` and each replica's
   report) must show both replicas serving the newest announced version; each replica's count of
   acknowledged prompts (`ragr1_policy_worker_prompts_total`, one Prometheus target per replica found by
   DNS) must rise after the scale, so both take prompts; Prometheus must report both policy targets up.
   Figures: the time from the scale to the new replica healthy and to both replicas taking prompts,
   the prompts each acknowledged since, the version the fleet serves.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from tests.common.pki import write_pki
from tests.common.waiting import poll_until

ROOT = Path(__file__).resolve().parents[2]
IMAGES = Path(__file__).resolve().parent / "images"
STATE = ROOT / ".cache" / "docker-test"
PROJECT = "ragr1test"
# The targets of docker/Dockerfile, the lightest first; each image is ragr1-<role>:<TAG> (docker-compose.yml).
ROLES = ("reward", "retriever", "index", "trainer", "policy")
TAG = "cpu"
# Roles whose images must not carry these (the point of one image per role).
WITHOUT = {"reward": ("torch", "vllm"), "retriever": ("torch", "vllm")}
REWARD_IMAGE_MAX_BYTES = 1_000_000_000
DEBIAN = "ragr1-local/debian:bookworm"
PYTHON = "ragr1-local/python:3.11"
# compose's variable -> (its default image, the Debian stand-in's Dockerfile)
THIRD_PARTY = {"RAGR1_REDIS_IMAGE": "redis", "RAGR1_PROMETHEUS_IMAGE": "prometheus"}
# The first N passages of the shipped corpus: an index in about a minute instead of half an hour.
INDEX_PASSAGES = 2000
HEALTHY_TIMEOUT_S = 1800
PPO_UPDATES = 2
PPO_TIMEOUT_S = 5400  # a CPU update takes tens of minutes on a loaded, shared machine
SERVICES = [
    "redis",
    "index-build",
    "retriever-shard-0",
    "retriever-shard-1",
    "retriever",
    "reward",
    "policy",
    "trainer",
    "prometheus",
]  # every service but Grafana
RAGR1_TARGETS = 5  # router, two shards, reward, trainer; plus one per policy replica
POLICY_PORT, POLICY_METRICS_PORT = 50052, 51052
# The plain run scales the policy to this many replicas after the trainer's first update.
POLICY_REPLICAS = 2
# From the scale to both replicas serving the newest version and having taken prompts: a new vLLM engine
# starting on a loaded CPU, then at least one admission of prompts that the new replica wins.
SCALED_TIMEOUT_S = 2400

START = time.monotonic()


class Failed(Exception):
    """A check failed; the message says which and why."""


def say(message: str) -> None:
    print(f"[{time.monotonic() - START:7.1f}s] {message}", flush=True)


def run(
    args: Sequence[str],
    *,
    env: dict[str, str] | None = None,
    timeout: float = 600,
    check: bool = True,
    log: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    if log is not None:
        with log.open("w") as out:
            result = subprocess.run(args, env=env, stdout=out, stderr=subprocess.STDOUT, text=True, timeout=timeout)
        result.stdout = log.read_text()
    else:
        result = subprocess.run(args, env=env, capture_output=True, text=True, timeout=timeout)
    if check and result.returncode != 0:
        output = (result.stdout or "") + (result.stderr or "")
        raise Failed(f"{' '.join(args[:6])} ... exited {result.returncode}:\n{output[-4000:]}")
    return result


# -- the engine ----------------------------------------------------------------------------------------
def engine_running() -> bool:
    return shutil.which("docker") is not None and run(["docker", "info"], check=False, timeout=30).returncode == 0


@contextlib.contextmanager
def docker_engine() -> Iterator[None]:
    """Starts dockerd when it is installed and not running; stops it again at the end."""
    if engine_running():
        yield
        return
    dockerd = shutil.which("dockerd")
    if dockerd is None or shutil.which("docker") is None:
        raise Failed(
            "no Docker engine: install one (Debian: `apt-get install -y docker.io docker-compose`, as root), "
            "then run `make test-docker` again"
        )
    if os.geteuid() != 0:
        raise Failed("dockerd is installed but not running, and only root can start it: start it, then run again")
    STATE.mkdir(parents=True, exist_ok=True)
    with (STATE / "dockerd.log").open("ab") as log:
        daemon = subprocess.Popen([dockerd], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    say(f"started dockerd (pid {daemon.pid}); its log: {STATE / 'dockerd.log'}")
    try:
        def started() -> bool:
            if engine_running():
                return True
            if daemon.poll() is not None:
                raise Failed(f"dockerd exited as it started; see {STATE / 'dockerd.log'}")
            return False

        if not poll_until(started, 60, 1):
            raise Failed(f"dockerd did not start; see {STATE / 'dockerd.log'}")
        yield
    finally:
        daemon.terminate()
        try:
            daemon.wait(timeout=60)
        except subprocess.TimeoutExpired:
            daemon.kill()
        say("stopped dockerd")


def compose_command() -> list[str]:
    if run(["docker", "compose", "version"], check=False).returncode == 0:
        return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    raise Failed("neither `docker compose` nor `docker-compose`: install one (Debian: apt-get install docker-compose)")


# -- images --------------------------------------------------------------------------------------------
def image_exists(name: str) -> bool:
    return run(["docker", "image", "inspect", name], check=False).returncode == 0


def debian_mirror() -> str:
    """The Debian mirror apt uses on this machine (debootstrap takes the base system from it)."""
    sources = [
        *Path("/etc/apt/sources.list.d").glob("*.sources"),
        Path("/etc/apt/sources.list"),
        *Path("/etc/apt/sources.list.d").glob("*.list"),
    ]
    for path in sources:
        if not path.exists():
            continue
        text = path.read_text()
        found = re.search(r"^URIs:\s*(\S+/debian)/?\s*$", text, re.MULTILINE) or re.search(
            r"^deb\s+(?:\[[^]]*\]\s+)?(\S+/debian)/?\s+\S+", text, re.MULTILINE
        )
        if found:
            return found.group(1)
    return "http://deb.debian.org/debian"


def ensure_debian_base() -> None:
    if image_exists(DEBIAN):
        return
    if shutil.which("debootstrap") is None:
        if os.geteuid() != 0:
            raise Failed("debootstrap is missing (apt-get install debootstrap)")
        run(["apt-get", "install", "-y", "-qq", "debootstrap"], timeout=600)
    mirror = debian_mirror()
    say(f"making {DEBIAN} from Debian packages ({mirror}; a few minutes)")
    with tempfile.TemporaryDirectory(prefix="ragr1-rootfs-", dir="/var/tmp") as rootfs:
        run(
            ["debootstrap", "--variant=minbase", "bookworm", rootfs, mirror],
            timeout=1800,
            log=STATE / "debootstrap.log",
        )
        for leftover in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for path in (Path(rootfs) / leftover).glob("*"):
                if path.is_file():
                    path.unlink()
        tar = subprocess.Popen(["tar", "-C", rootfs, "-c", "."], stdout=subprocess.PIPE)
        imported = subprocess.run(["docker", "import", "-", DEBIAN], stdin=tar.stdout, capture_output=True, text=True)
        tar.wait()
        if imported.returncode != 0 or tar.returncode != 0:
            raise Failed(f"docker import of the Debian base failed: {imported.stderr}")


def build_local(dockerfile: str, tag: str) -> None:
    run(
        [
            "docker",
            "build",
            "-q",
            "-f",
            str(IMAGES / dockerfile),
            "--build-arg",
            f"DEBIAN={DEBIAN}",
            "-t",
            tag,
            str(IMAGES),
        ],
        timeout=1200,
    )


def third_party_images(compose: list[str]) -> dict[str, str]:
    """compose variable -> image: the one compose names when it is here or can be pulled, else a
    stand-in from Debian's packages under a name of our own (official names are never shadowed)."""
    names = yaml_services(compose, {var: "" for var in THIRD_PARTY})
    chosen = {}
    for variable, short in THIRD_PARTY.items():
        wanted = names[short]["image"]
        if image_exists(wanted) or run(["docker", "pull", wanted], check=False, timeout=300).returncode == 0:
            chosen[variable] = wanted
            continue
        stand_in = f"ragr1-local/{short}:bookworm"
        build_local(f"{short}.Dockerfile", stand_in)
        chosen[variable] = stand_in
        say(f"{wanted} cannot be pulled here: using {stand_in}, built from Debian's packages")
    return chosen


def pip_settings() -> tuple[str | None, Path | None]:
    """This machine's pip CA bundle, and the torch CPU wheel from pip's find-links, if it has them."""
    config = run([sys.executable, "-m", "pip", "config", "list"], check=False).stdout
    values: dict[str, str] = {}
    for line in config.splitlines():
        key, _, value = line.partition("=")
        values.setdefault(key.rsplit(".", 1)[-1], value.strip().strip("'\""))
    cert = os.environ.get("PIP_CERT") or values.get("cert")
    wheel = None
    for folder in (os.environ.get("PIP_FIND_LINKS") or values.get("find-links") or "").split():
        found = sorted(Path(folder).glob("torch-2.13.0+cpu-cp311-*.whl")) if Path(folder).is_dir() else []
        wheel = found[-1] if found else wheel
    return cert if cert and Path(cert).is_file() else None, wheel


def image(role: str) -> str:
    return f"ragr1-{role}:{TAG}"


def build_images() -> dict[str, Any]:
    """Every role's target of docker/Dockerfile with this machine's build arguments; twice (the second
    from cache)."""
    local = ROOT / "docker" / "local"
    args = ["--build-arg", f"BASE_IMAGE={PYTHON}"]
    cert, wheel = pip_settings()
    if cert:
        shutil.copyfile(cert, local / "pip-ca.crt")
        args += ["--build-arg", "PIP_CERT=/tmp/local/pip-ca.crt"]
    if wheel:
        target = local / wheel.name
        if not target.exists():
            try:
                os.link(wheel, target)
            except OSError:
                shutil.copyfile(wheel, target)
        args += ["--build-arg", "PIP_EXTRA_INDEX_URL="]  # the index PyTorch serves is out of reach here
    times = []
    for attempt in ("first", "cached"):
        started = time.monotonic()
        for role in ROLES:
            log = STATE / f"build-{attempt}-{role}.log"
            say(f"docker build --target {role} ({attempt}; log: {log})")
            run(["docker", "build", "-f", "docker/Dockerfile", *args, "--target", role, "-t", image(role), str(ROOT)],
                timeout=5400, log=log)
        times.append(time.monotonic() - started)
    # Cold: the first target's build (its stages are the ones every role shares) used no cache at all.
    cold = "Using cache" not in (STATE / f"build-first-{ROLES[0]}.log").read_text()
    record = STATE / "cold-build.json"
    if cold:
        record.write_text(json.dumps({"seconds": round(times[0]), "at": time.strftime("%Y-%m-%d %H:%M")}))
    sizes = {role: int(run(["docker", "image", "inspect", "--format", "{{.Size}}", image(role)]).stdout)
             for role in ROLES}
    figures = {"sizes_gb": {r: b / 1e9 for r, b in sizes.items()}, "first_s": times[0], "first_was_cold": cold,
               "cached_s": times[1]}
    if record.exists():
        figures["cold"] = json.loads(record.read_text())
    return figures


def image_contents_checks(build: dict[str, Any]) -> None:
    """Each role's image holds what its role loads and not what it does not."""
    for role, missing in WITHOUT.items():
        program = ("import importlib.util, json, sys; "
                   "print(json.dumps([m for m in sys.argv[1:] if importlib.util.find_spec(m)]))")
        found = json.loads(run(["docker", "run", "--rm", "--entrypoint", "python", image(role), "-c", program,
                                *missing], timeout=300).stdout)
        if found:
            raise Failed(f"{image(role)} carries {found}")
        say(f"ok: {image(role)} ({build['sizes_gb'][role]:.2f} GB) holds no {' and no '.join(missing)}")
    if build["sizes_gb"]["reward"] * 1e9 >= REWARD_IMAGE_MAX_BYTES:
        raise Failed(f"{image('reward')} is {build['sizes_gb']['reward']:.2f} GB, not under 1 GB")


def image_runtime_checks(compose: list[str], env: dict[str, str]) -> None:
    """What the services load at run time, checked before anything is started."""
    # The extension vLLM itself picks for this CPU (AVX-512 or AVX2: `import vllm._C`, the AVX-512 build, dies
    # of an illegal instruction on an AVX2-only host); vLLM only logs a failed load, so its ops are checked.
    kernels = (
        "import torch\n"
        "from vllm.platforms import current_platform\n"
        "current_platform.import_kernels()\n"
        "assert hasattr(torch.ops._C, 'rms_norm'), 'vLLM CPU kernels did not load'\n"
    )
    run(["docker", "run", "--rm", "--entrypoint", "python", image("policy"), "-c", kernels], timeout=300)
    say("ok: vLLM's compiled extension loads in the policy image (libnuma)")
    program = (
        "import torch\n"
        "f = torch.compile(lambda x: torch.nn.functional.softmax(x * 2, -1).sum(), backend='inductor')\n"
        "assert abs(f(torch.ones(4, 8)).item() - 4.0) < 1e-5\n"
    )
    run([*compose, "run", "--rm", "--no-deps", "--entrypoint", "python", "policy", "-c", program], env=env, timeout=600)
    say("ok: torch.compile runs in a container with compose's settings (compiler, headers, executable /tmp)")


# -- the stack -------------------------------------------------------------------------------------------
def yaml_services(compose: list[str], env: dict[str, str]) -> dict[str, Any]:
    import yaml

    return dict(yaml.safe_load(run([*compose, "config"], env={**os.environ, **env}).stdout)["services"])


def containers() -> list[dict[str, Any]]:
    ids = run(["docker", "ps", "-aq", "--filter", f"label=com.docker.compose.project={PROJECT}"]).stdout.split()
    if not ids:
        return []
    return list(json.loads(run(["docker", "inspect", *ids]).stdout))


def service_of(container: dict[str, Any]) -> str:
    return str(container["Config"]["Labels"]["com.docker.compose.service"])


def state(container: dict[str, Any]) -> str:
    s = container["State"]
    if "Health" in s:
        return str(s["Health"]["Status"])
    return f"{s['Status']}:{s['ExitCode']}" if s["Status"] == "exited" else str(s["Status"])


def container_key(container: dict[str, Any]) -> str:
    """The service, and the replica's number from the second on (policy, policy#2)."""
    number = container["Config"]["Labels"].get("com.docker.compose.container-number", "1")
    return service_of(container) + ("" if number == "1" else f"#{number}")


def wait_healthy(timeout: float, replicas: dict[str, int] | None = None) -> dict[str, str]:
    """Every container healthy (the index job exited 0), with ``replicas`` containers of those services."""
    shown: list[str] = [""]
    seen: dict[str, str] = {}

    def healthy() -> dict[str, str] | None:
        found = containers()
        states = {container_key(c): state(c) for c in found}
        seen.clear()
        seen.update(states)
        line = ", ".join(f"{k}={v}" for k, v in sorted(states.items()))
        if line != shown[0]:
            say(f"  {line}")
            shown[0] = line
        counts = {name: sum(service_of(c) == name for c in found) for name in SERVICES}
        done = counts == {name: (replicas or {}).get(name, 1) for name in SERVICES} and all(
            v in ("healthy", "exited:0") if k == "index-build" else v in ("healthy", "running")
            for k, v in states.items()
        )
        if done and states["index-build"] == "exited:0":
            return states
        bad = {k: v for k, v in states.items() if v == "unhealthy" or (v.startswith("exited:") and v != "exited:0")}
        if bad:
            raise Failed(f"not every container became healthy: {states}")
        return None

    states = poll_until(healthy, timeout, 5)
    if states is None:
        raise Failed(f"not every container became healthy: {seen}")
    return states


def in_container(compose: list[str], env: dict[str, str], service: str, program: str) -> str:
    """Runs Python inside a running service's container, with its environment (its token, if any)."""
    return run([*compose, "exec", "-T", service, "python", "-c", program], env=env, timeout=120).stdout.strip()


VERSIONS = (
    "import json\n"
    "from ragr1.services.policy.client import PolicyClient\n"
    "from ragr1.services.trainer.client import TrainerClient\n"
    "with PolicyClient('policy:50052') as p, TrainerClient('trainer:50054') as t:\n"
    "    v = p.weight_version()\n"
    "    s = t.status()\n"
    "    print(json.dumps({'policy': v.version, 'path': v.checkpoint_path, 'trainer': s.policy_version,\n"
    "                      'trained': s.rollouts_trained}))\n"
)


def peak_memory_bytes(container_id: str) -> int | None:
    for path in (
        Path(f"/sys/fs/cgroup/memory/docker/{container_id}/memory.max_usage_in_bytes"),
        Path(f"/sys/fs/cgroup/system.slice/docker-{container_id}.scope/memory.peak"),
    ):
        if path.exists():
            return int(path.read_text())
    return None


def check_retrieve_with_curl() -> None:
    body = json.dumps({"queries": ["who wrote hamlet", "capital of france"], "topk": 3})
    out = run(
        [
            "curl",
            "-sS",
            "-f",
            "-X",
            "POST",
            "localhost:8000/retrieve",
            "-H",
            "Content-Type: application/json",
            "-d",
            body,
        ],
        timeout=60,
    ).stdout
    result = json.loads(out)["result"]
    if [len(r) for r in result] != [3, 3] or not result[0][0]["contents"]:
        raise Failed(f"/retrieve answered {out[:500]}")
    say("ok: curl POST localhost:8000/retrieve returned 3 passages per query")


GENERATED_CLIENT = """
import json, sys, grpc
from ragr1.v1 import retriever_pb2, retriever_pb2_grpc
assert "site-packages" not in retriever_pb2.__file__
stub = retriever_pb2_grpc.RetrieverStub(grpc.insecure_channel(sys.argv[1]))
token = sys.argv[2]
out = {}
for name, metadata in (("with_token", [("authorization", "Bearer " + token)] if token else []), ("without", [])):
    try:
        reply = stub.Search(retriever_pb2.SearchRequest(queries=["Hamlet author"], top_k=2), metadata=metadata,
                            timeout=60)
        out[name] = [p.title for p in reply.results[0].passages]
    except grpc.RpcError as exc:
        out[name] = exc.code().name
print(json.dumps(out))
"""


def check_generated_client(token: str) -> None:
    """A client made from proto/ alone with protoc, as a user of any language would, on the published port."""
    from grpc_tools import protoc

    proto = ROOT / "proto"
    with tempfile.TemporaryDirectory() as tmp:
        files = sorted(str(p.relative_to(proto)) for p in (proto / "ragr1" / "v1").glob("*.proto"))
        if protoc.main(["protoc", f"-I{proto}", f"--python_out={tmp}", f"--grpc_python_out={tmp}", *files]) != 0:
            raise Failed("protoc failed on proto/")
        for package in ("ragr1", "ragr1/v1"):
            (Path(tmp) / package / "__init__.py").touch()
        script = Path(tmp) / "client.py"
        script.write_text(GENERATED_CLIENT)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHONPATH": tmp}
        out = json.loads(run([sys.executable, str(script), "localhost:50051", token], env=env).stdout)
    if not isinstance(out["with_token"], list) or len(out["with_token"]) != 2:
        raise Failed(f"the generated client got {out}")
    if token and out["without"] != "UNAUTHENTICATED":
        raise Failed(f"a call without the token got {out['without']}, not UNAUTHENTICATED")
    refused = " (refused without the token)" if token else ""
    say(f"ok: a client generated from proto/ searched through localhost:50051{refused}: {out['with_token']}")


def check_redis_refuses(compose: list[str], env: dict[str, str]) -> None:
    """Redis with the auth and TLS overlays: a client with the TLS files but without the password is
    refused, and so is a plaintext client (the workers and the trainer, which read the password and the
    TLS files from their secrets, are what makes the updates further on)."""
    cli = ["exec", "-T", "redis", "sh", "-c"]
    out = run([*compose, *cli, "redis-cli $RAGR1_REDIS_CLI_TLS xlen prompts"], env=env, check=False)
    if "NOAUTH" not in out.stdout + out.stderr:
        raise Failed(f"Redis over TLS answered a client without its password: {(out.stdout + out.stderr).strip()!r}")
    plain = 'REDISCLI_AUTH="$(cat /run/secrets/ragr1-redis-password)" redis-cli xlen prompts'
    out = run([*compose, *cli, plain], env=env, check=False)
    if out.stdout.strip().isdigit():
        raise Failed(f"Redis answered a plaintext client: {out.stdout.strip()!r}")
    say("ok: Redis refused a client without its password (NOAUTH) and a plaintext one (TLS only)")


def check_failure_drills(compose: list[str], env: dict[str, str], token: str) -> None:
    """What a user sees when things go wrong, with the stack up: bad input is refused naming the
    limit; a shard down makes the router answer UNAVAILABLE naming the shard, and it serves again
    once the shard is back. (These also give the dashboards' error panels their series.)"""
    from ragr1.errors import ServiceCallError
    from ragr1.services.common.client import ChannelOptions
    from ragr1.services.retriever.client import RetrieverClient

    def search(top_k: int) -> tuple[str, str]:
        with RetrieverClient("localhost:50051", ChannelOptions(token=token), timeout=60) as client:
            try:
                reply = client.search(["Hamlet author"], top_k)
                return "OK", str(len(reply.results[0].passages))
            except ServiceCallError as exc:
                return exc.code.name, exc.message

    code, details = search(0)
    if code != "INVALID_ARGUMENT" or "top_k" not in details:
        raise Failed(f"top_k=0 got {code}: {details}")
    run([*compose, "stop", "retriever-shard-1"], env=env, timeout=300)
    code, details = search(2)
    if code != "UNAVAILABLE" or "shard 1" not in details:
        raise Failed(f"with shard 1 stopped the router answered {code}: {details}")
    run([*compose, "start", "retriever-shard-1"], env=env, timeout=300)
    wait_healthy(300)
    if search(2) != ("OK", "2"):
        raise Failed(f"the router did not serve again after shard 1 came back: {search(2)}")
    say("ok: bad input refused naming the limit; shard 1 stopped: UNAVAILABLE naming it; back: served again")


def wait_for_updates(compose: list[str], env: dict[str, str], scale: bool) -> dict[str, Any]:
    """At least PPO_UPDATES updates that the policy follows; with ``scale``, the policy is scaled to
    POLICY_REPLICAS replicas once the first is out (see scale_policy)."""
    seen: list[tuple[int, int]] = []
    trainer = next(c for c in containers() if service_of(c) == "trainer")
    scaled: dict[str, Any] = {}

    def updated() -> bool:
        versions = json.loads(in_container(compose, env, "trainer", VERSIONS))
        if scale and not scaled and versions["trainer"] >= 1:
            scaled.update(scale_policy(compose, env))
        pair = (versions["trainer"], versions["policy"])
        if not seen or seen[-1] != pair:
            say(
                f"  trainer at version {pair[0]} ({versions['trained']} rollouts trained), policy serves {pair[1]}"
                f" ({versions['path'] or 'the image model'})"
            )
            seen.append(pair)
        if versions["policy"] >= PPO_UPDATES and versions["trainer"] >= PPO_UPDATES:
            return True
        restarted = {service_of(c): c["RestartCount"] for c in containers() if c["RestartCount"]}
        if restarted:
            raise Failed(f"containers restarted during training: {restarted}")
        return False

    if not poll_until(updated, PPO_TIMEOUT_S, 15):
        raise Failed(f"fewer than {PPO_UPDATES} updates reached the policy in {PPO_TIMEOUT_S}s: {seen}")
    if [p for _, p in seen] != sorted(p for _, p in seen):
        raise Failed(f"the policy's version went backwards: {seen}")
    steps = [
        json.loads(line)
        for line in in_container(compose, env, "trainer", "print(open('/checkpoints/steps.jsonl').read())").splitlines()
        if line.strip()
    ]
    for step in steps:
        if step["announced"].get("version") != step["version"]:
            raise Failed(f"update {step['version']} was not announced to the policy: {step['announced']}")
    # The trainer is the container's first process: its peak resident set, and the container's peak
    # as the kernel's memory cgroup counts it (page cache of the checkpoints it writes included).
    status = in_container(compose, env, "trainer", "print(open('/proc/1/status').read())")
    hwm = re.search(r"^VmHWM:\s+(\d+) kB", status, re.MULTILINE)
    peak = peak_memory_bytes(trainer["Id"])
    say(f"ok: {len(steps)} PPO updates through Redis, the policy's GetWeightVersion followed: {seen}")
    if scale:
        scaled.update(check_scaled_fleet(compose, env, scaled))
    return {
        "scaled": scaled,
        "updates": len(steps),
        "trainer_rss_gib": int(hwm.group(1)) / 2**20 if hwm else None,
        "trainer_cgroup_gib": peak / 2**30 if peak else None,
        "update_seconds": [round(s.get("update_seconds", 0.0), 1) for s in steps],
    }


def policy_containers() -> dict[str, dict[str, Any]]:
    """The policy's containers by their Prometheus instance (address:metrics port): one target each."""
    out = {}
    for c in containers():
        if service_of(c) == "policy":
            for network in c["NetworkSettings"]["Networks"].values():
                out[f"{network['IPAddress']}:{POLICY_METRICS_PORT}"] = c
    return out


def prompts_acked() -> dict[str, float]:
    """Each policy target's count of prompts it finished and acknowledged, as Prometheus last scraped it."""
    found = prometheus_query('ragr1_policy_worker_prompts_total{job="ragr1",component="policy",outcome="acked"}')
    return {r["metric"]["instance"]: float(r["value"][1]) for r in found}


# The fleet as the replicas report it (common/fleet.py): the newest announced version, then each report.
FLEET = (
    "redis-cli --raw xrevrange ragr1:weights + - count 1; echo ==; "
    "for name in $(redis-cli --raw smembers ragr1:replicas); do redis-cli --raw get \"ragr1:replicas:$name\"; done"
)


def fleet(compose: list[str], env: dict[str, str]) -> tuple[int, list[dict[str, Any]]]:
    out = run([*compose, "exec", "-T", "redis", "sh", "-c", FLEET], env=env, timeout=60).stdout
    head, _, reports = out.partition("==\n")
    fields = head.split()
    newest = int(fields[fields.index("version") + 1]) if "version" in fields else 0
    return newest, [json.loads(line) for line in reports.splitlines() if line.strip()]


def scale_policy(compose: list[str], env: dict[str, str]) -> dict[str, Any]:
    """Adds replicas to the running stack the way docs/deployment.md tells a user to."""
    before = prompts_acked()
    old = {c["Id"] for c in policy_containers().values()}
    say(f"== scaling the policy: up -d --scale policy={POLICY_REPLICAS} --no-recreate policy")
    started = time.monotonic()
    run([*compose, "up", "-d", "--no-build", "--no-recreate", "--scale", f"policy={POLICY_REPLICAS}", "policy"],
        env=env, timeout=HEALTHY_TIMEOUT_S, log=STATE / "scale.log")
    wait_healthy(HEALTHY_TIMEOUT_S, {"policy": POLICY_REPLICAS})
    policies = policy_containers()
    if len(policies) != POLICY_REPLICAS or not old <= {c["Id"] for c in policies.values()}:
        raise Failed(f"scaling re-created or lost a policy container: had {old}, now {list(policies.values())}")
    seconds = time.monotonic() - started
    say(f"ok: the policy scaled to {POLICY_REPLICAS} replicas, the new one healthy {seconds:.0f}s after `up --scale`")
    return {"started": started, "healthy_s": seconds, "acked_before": before}


def check_scaled_fleet(compose: list[str], env: dict[str, str], scaled: dict[str, Any]) -> dict[str, Any]:
    """Both replicas serve the newest version in Redis's fleet, and both take prompts after the scale."""
    last: dict[str, Any] = {"line": ""}

    def both_serve_and_take() -> bool:
        policies = policy_containers()
        newest, reports = fleet(compose, env)
        # A replica names itself <hostname>-<pid>; the hostname is its container id's first 12 digits.
        by_container = {t: [r for r in reports if r["name"].startswith(c["Id"][:12] + "-")]
                        for t, c in policies.items()}
        acked = prompts_acked()
        rose = {t: acked.get(t, 0.0) - scaled["acked_before"].get(t, 0.0) for t in policies}
        serving = {t: [f"{r['state']} v{r['version']}" for r in found] for t, found in by_container.items()}
        line = f"newest v{newest}; fleet {serving}; prompts acked since the scale {rose}"
        if line != last["line"]:
            say(f"  {line}")
        last.update(line=line, newest=newest, rose=rose)
        serves = all(len(found) == 1 and found[0]["state"] == "serving" and found[0]["version"] == newest
                     for found in by_container.values())
        return len(policies) == POLICY_REPLICAS and serves and len(reports) == POLICY_REPLICAS and all(
            v > 0 for v in rose.values())

    if not poll_until(both_serve_and_take, scaled["started"] + SCALED_TIMEOUT_S - time.monotonic(), 15):
        raise Failed(f"{SCALED_TIMEOUT_S}s after the scale: {last['line']}")
    newest, rose = last["newest"], last["rose"]
    took = time.monotonic() - scaled["started"]
    fleet_metric = {f"{r['metric']['state']} v{r['metric']['version']}": r["value"][1]
                    for r in prometheus_query("ragr1_trainer_fleet_replicas")}
    say(f"ok: {POLICY_REPLICAS} replicas serve v{newest} in Redis's fleet (the trainer's gauge: {fleet_metric}); "
        f"each took prompts after the scale ({took:.0f}s after it): {rose}")
    return {"version": newest, "both_taking_s": took, "acked_since": sorted(rose.values()),
            "fleet_metric": fleet_metric}


def prometheus_query(expr: str) -> list[Any]:
    url = "http://localhost:9090/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    try:
        with urllib.request.urlopen(url, timeout=20) as reply:
            body = json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        raise Failed(f"Prometheus refused {expr!r}: {exc.read()[:300]!r}") from exc
    return list(body["data"]["result"])


def check_prometheus(policies: int) -> int:
    from tests.deploy.dashboards import expressions, filled

    targets = RAGR1_TARGETS + policies
    up = prometheus_query('up{job="ragr1"}')
    values = {r["metric"]["instance"]: r["value"][1] for r in up}
    if len(values) != targets or set(values.values()) != {"1"}:
        raise Failed(f"ragr1 targets in Prometheus: {values}")
    found = {r["metric"]["instance"] for r in up if r["metric"].get("component") == "policy"}
    if found != set(policy_containers()):
        raise Failed(f"Prometheus's policy targets {sorted(found)} are not the policy's containers "
                     f"{sorted(policy_containers())}")
    say(f"ok: Prometheus has all {targets} ragr1 targets up, the policy's {policies} found by DNS")
    empty = []
    queries = expressions()
    for board, title, expr in queries:
        expr = filled(expr)
        if not prometheus_query(expr):
            empty.append(f"{board} / {title}: {expr}")
    if empty:
        raise Failed("dashboard queries without data:\n  " + "\n  ".join(empty))
    say(f"ok: all {len(queries)} dashboard queries return data")
    return len(queries)


def leftovers() -> dict[str, list[str]]:
    label = f"label=com.docker.compose.project={PROJECT}"
    return {
        "containers": run(["docker", "ps", "-aq", "--filter", label]).stdout.split(),
        "volumes": run(["docker", "volume", "ls", "-q", "--filter", label]).stdout.split(),
        "networks": run(["docker", "network", "ls", "-q", "--filter", label]).stdout.split(),
    }


def show_logs(compose: list[str], env: dict[str, str]) -> None:
    logs = run([*compose, "logs", "--no-color", "--tail", "60"], env=env, check=False, timeout=120)
    print(logs.stdout[-20000:], flush=True)


def run_stack(compose_base: list[str], mode: str, images: dict[str, str], keep: bool) -> dict[str, Any]:
    overlays = ["docker-compose.auth.yml", "docker-compose.tls.yml"] if mode == "auth" else []
    files = [arg for name in ["docker-compose.yml", *overlays] for arg in ("-f", name)]
    compose = [*compose_base, "-p", PROJECT, "--project-directory", str(ROOT), *files]
    env = {**os.environ, **images, "RAGR1_TAG": TAG, "RAGR1_INDEX_PASSAGES": str(INDEX_PASSAGES)}
    token = ""
    secrets = Path(tempfile.mkdtemp(prefix="ragr1-secrets-"))
    if mode == "auth":
        token = os.urandom(24).hex()
        (secrets / "token").write_text(token + "\n")
        (secrets / "token").chmod(0o644)  # read by uid 10001 in the containers
        env["RAGR1_TOKEN_FILE"] = str(secrets / "token")
        (secrets / "redis-password").write_text(os.urandom(24).hex() + "\n")
        (secrets / "redis-password").chmod(0o644)
        env["RAGR1_REDIS_SECRET_FILE"] = str(secrets / "redis-password")
        # What docker-compose.tls.yml asks for: a CA and a certificate for "redis", signed by it.
        tls = secrets / "redis-tls"
        tls.mkdir()
        pki = write_pki(tls, names=["redis"])
        for source, name in (("ca", "ca.crt"), ("server_cert", "tls.crt"), ("server_key", "tls.key")):
            shutil.copy(pki[source], tls / name)
            (tls / name).chmod(0o644)  # read by Redis's user and uid 10001 in the containers
        env["RAGR1_REDIS_TLS_DIR"] = str(tls)
    figures: dict[str, Any] = {"mode": mode}
    run([*compose, "down", "-v", "--remove-orphans"], env=env, timeout=600)
    try:
        say(f"== {mode}: {' '.join(compose_base)} {' '.join(files)} up -d ({', '.join(SERVICES)})")
        started = time.monotonic()
        run([*compose, "up", "-d", "--no-build", *SERVICES], env=env, timeout=HEALTHY_TIMEOUT_S, log=STATE / "up.log")
        wait_healthy(HEALTHY_TIMEOUT_S - (time.monotonic() - started))
        figures["up_to_healthy_s"] = time.monotonic() - started
        say(f"ok: every container healthy {figures['up_to_healthy_s']:.0f}s after `up` (index build included)")
        check_retrieve_with_curl()
        check_generated_client(token)
        check_failure_drills(compose, env, token)
        if mode == "auth":
            check_redis_refuses(compose, env)
        figures.update(wait_for_updates(compose, env, scale=mode == "plain"))
        figures["dashboard_queries"] = check_prometheus(POLICY_REPLICAS if mode == "plain" else 1)
        restarted = {service_of(c): c["RestartCount"] for c in containers() if c["RestartCount"]}
        oom = [service_of(c) for c in containers() if c["State"].get("OOMKilled")]
        if restarted or oom:
            raise Failed(f"restarted: {restarted}, OOM-killed: {oom}")
    except BaseException:
        show_logs(compose, env)
        raise
    finally:
        if not keep:
            down = time.monotonic()
            run([*compose, "down", "-v", "--remove-orphans"], env=env, timeout=900)
            figures["down_s"] = time.monotonic() - down
            shutil.rmtree(secrets, ignore_errors=True)
    left = leftovers()
    if any(left.values()):
        raise Failed(f"`down -v` left {left}")
    say(f"ok: `down -v` left no container, volume or network of project {PROJECT}")
    return figures


def report(build: dict[str, Any], stacks: list[dict[str, Any]]) -> None:
    print("\n== make test-docker: figures", flush=True)
    for role, size in build["sizes_gb"].items():
        print(f"image {image(role)}: {size:.2f} GB")
    cold = build.get("cold")
    if cold:
        print(
            f"build without cache: {cold['seconds'] / 60:.1f} min (measured {cold['at']}"
            f"{', this run' if build['first_was_cold'] else ''})"
        )
    if not build["first_was_cold"]:
        print(f"build with this machine's cache, first of this run: {build['first_s']:.0f} s")
    print(f"build again, everything cached: {build['cached_s']:.0f} s")

    def gib(value: float | None) -> str:
        return f"{value:.2f} GiB" if value else "n/a"

    for s in stacks:
        print(
            f"{s['mode']}: `up` to every container healthy {s['up_to_healthy_s'] / 60:.1f} min "
            f"(index of {INDEX_PASSAGES} passages included); {s['updates']} PPO updates "
            f"({s['update_seconds']} s each); trainer peak resident memory {gib(s.get('trainer_rss_gib'))} "
            f"(container, page cache included: {gib(s.get('trainer_cgroup_gib'))}); "
            f"{s['dashboard_queries']} dashboard queries with data; `down -v` {s.get('down_s', 0):.0f} s"
        )
        scaled = s.get("scaled")
        if scaled:
            print(
                f"{s['mode']}: scaled to {POLICY_REPLICAS} policy replicas after the first update: the new one "
                f"healthy {scaled['healthy_s']:.0f} s after `up --scale`; both serving v{scaled['version']} in "
                f"Redis's fleet and both taking prompts {scaled['both_taking_s']:.0f} s after it (prompts acked "
                f"since, per replica: {scaled['acked_since']}); the trainer's fleet gauge {scaled['fleet_metric']}; "
                f"{RAGR1_TARGETS + POLICY_REPLICAS} targets up"
            )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make test-docker", description=__doc__.split("\n\n")[0])
    parser.add_argument("--modes", default="plain,auth", help="plain (docker-compose.yml) and/or auth")
    parser.add_argument("--keep", action="store_true", help="leave the stack running after the checks")
    args = parser.parse_args(argv)
    STATE.mkdir(parents=True, exist_ok=True)
    try:
        with docker_engine():
            compose = compose_command()
            base = [*compose, "-p", PROJECT, "--project-directory", str(ROOT), "-f", "docker-compose.yml"]
            ensure_debian_base()
            build_local("python.Dockerfile", PYTHON)
            images = third_party_images(base)
            build = build_images()
            sizes = ", ".join(f"{image(r)} {gb:.2f} GB" for r, gb in build["sizes_gb"].items())
            say(f"images {sizes}; built in {build['first_s']:.0f}s, again in {build['cached_s']:.0f}s")
            image_contents_checks(build)
            image_runtime_checks(base, {**os.environ, **images, "RAGR1_TAG": TAG})
            stacks = [run_stack(compose, mode, images, args.keep) for mode in args.modes.split(",")]
    except Failed as exc:
        print(f"\nmake test-docker FAILED: {exc}", file=sys.stderr, flush=True)
        return 1
    report(build, stacks)
    print("make test-docker: passed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
