#!/bin/sh
# Installs one role's virtualenv in a build stage of docker/Dockerfile: scripts/install.sh with
# RAGR1_EXTRAS=<role> (the extras of pyproject.toml), pip taking the wheels in /tmp/local first and, on
# the CPU build, PyTorch's CPU index too (the CUDA build takes its torch from PyPI).
set -e
[ -n "$PIP_CERT" ] || unset PIP_CERT
export PIP_FIND_LINKS=/tmp/local
if [ "$RAGR1_GPU" = 1 ]; then export PIP_EXTRA_INDEX_URL=; fi
RAGR1_EXTRAS="$1" exec bash scripts/install.sh
