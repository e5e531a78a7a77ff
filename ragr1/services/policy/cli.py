"""``ragr1 serve policy`` and ``ragr1 serve rollout-worker`` (the same server with the worker on)."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
from typing import Any

from ragr1.services.common.config import add_arguments, from_args
from ragr1.services.common.server import configure_logging
from ragr1.services.policy.config import PolicyConfig


def _run(args: argparse.Namespace) -> int:
    config = from_args(PolicyConfig, args)
    if args.force_worker:
        config = dataclasses.replace(config, worker=True)
    configure_logging(config.log_level)
    # Imported here: vLLM is heavy, and `ragr1 --help` should not pay for it.
    from ragr1.services.policy.server import serve

    return asyncio.run(serve(config))


def register(commands: Any, serve_commands: Any) -> None:
    p = serve_commands.add_parser(
        "policy", help="vLLM policy and RAG-R1's search agent loop (Rollout, Generate, UpdateWeights)"
    )
    add_arguments(p, PolicyConfig)
    p.set_defaults(run=_run, force_worker=False)
    w = serve_commands.add_parser(
        "rollout-worker",
        help="the policy server consuming PromptTasks from Redis and producing scored Rollouts",
    )
    add_arguments(w, PolicyConfig)
    w.set_defaults(run=_run, force_worker=True)
