"""The ``ragr1`` command: one subcommand per job.

Each service contributes its subcommands from its own ``cli.py`` (``register(commands, serve)``):
``commands`` is the top-level subparser set, ``serve`` the set under ``ragr1 serve``.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from ragr1.errors import ServiceCallError

# Modules with a ``register(commands, serve)`` function, in the order their commands are listed.
COMMAND_MODULES = [
    "ragr1.services.common.cli",
    "ragr1.services.reward.cli",
    "ragr1.services.retriever.cli",
    "ragr1.services.policy.cli",
    "ragr1.services.trainer.cli",
    "ragr1.stack.cli",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ragr1", description="RAG-R1 as gRPC services: multi-query search agents trained with RL."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    serve_parser = commands.add_parser("serve", help="run one service (gRPC server) in the foreground")
    serve = serve_parser.add_subparsers(dest="service", required=True, metavar="SERVICE")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(commands, serve)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.run(args) or 0)
    except KeyboardInterrupt:
        return 130
    except (ValueError, FileNotFoundError, ServiceCallError) as exc:
        print(f"ragr1 {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
