#!/usr/bin/env bash
# The GPU check (docs/gpu-check.md): the trainer, FSDP2, the rollout loop and the retriever's exact search on
# a CUDA GPU, within a time limit, ending with one table; the JSON report goes to $OUT/gpu-check.json when
# $OUT is set (a lent GPU machine's output folder), else to --out. Arguments go to bench/gpu/check.py:
#
#   scripts/gpu-check.sh                      # on a GPU machine
#   scripts/gpu-check.sh --device cpu --tiny  # toy sizes on the CPU (make test runs it)
#
# The project is not installed there (the lent machines' Python is 3.12; it pins 3.11): it runs from this
# checkout. The wheels that scripts/gpu-wheels.sh put in .whl/ (carried with the call) are installed first,
# into RAGR1_WHEEL_SITE (default /tmp/ragr1-site), which goes ahead of the machine's own packages.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if compgen -G ".whl/*.whl" >/dev/null; then
  # They are built for the lent machines' Python 3.12; elsewhere the installed packages serve.
  if "$PY" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))'; then
    SITE=${RAGR1_WHEEL_SITE:-/tmp/ragr1-site}
    "$PY" -m pip install -q --disable-pip-version-check --no-index --no-deps --no-compile --no-cache-dir \
      --upgrade --target "$SITE" .whl/*.whl
    export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
  else
    echo "gpu-check: .whl/ holds wheels for Python 3.12, not this $("$PY" -V); using the installed packages"
  fi
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
exec "$PY" bench/gpu/check.py "$@"
