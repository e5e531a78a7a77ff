#!/usr/bin/env bash
# The README's main job: the whole system on this machine, training a real model to search, with a
# table per stage (base, SFT, RL). Extra arguments go to `ragr1 demo` (e.g. --preset quick).
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1
exec .venv/bin/ragr1 demo "$@"
