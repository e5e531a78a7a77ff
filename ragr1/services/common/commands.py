"""How every ``ragr1`` command is declared: its flags generated from one config dataclass (defaults and
help written on the fields), the config loaded (defaults < file < environment < flags) and validated by
the dataclass itself, logging set up here and nowhere else, then the command's function called."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import importlib
import logging
from collections.abc import Callable
from typing import Any, TypeVar

from ragr1.services.common.config import add_arguments, from_args

C = TypeVar("C")

# A ``ragr1 <group>`` subparser set, as argparse's add_subparsers returns it.
Parsers = Any


def configure_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # FAISS logs each CPU-feature build it tries and fails to load, as INFO: noise around a command's output.
    logging.getLogger("faiss.loader").setLevel(logging.WARNING)


def command(
    parsers: Parsers,
    name: str,
    config_cls: type[C],
    run: Callable[[C], int | None],
    *,
    help: str,
    prepare: Callable[[argparse.Namespace], None] | None = None,
    fixed: dict[str, Any] | None = None,
) -> argparse.ArgumentParser:
    """Adds ``name`` with one flag per field of ``config_cls``; running it calls ``run(config)``.
    ``prepare`` may adjust the parsed flags first (``ragr1 demo --preset`` picks the config file);
    ``fixed`` are settings this command always runs with (``rollout-worker``: ``worker=True``).
    The parser keeps ``config_class`` and ``fixed_settings`` as defaults, for the settings reference, and
    ``command_name`` (``ragr1 serve reward``) for error messages."""
    # add_help=False: add_arguments gives it ``--help [GROUP]``. The usage line stays short: a service has
    # a hundred settings or more, and --help lists them by group below it.
    parser: argparse.ArgumentParser = parsers.add_parser(
        name, help=help, add_help=False,
        usage="%(prog)s [-h [GROUP]] [--config FILE] [--SETTING VALUE ...]",
    )
    add_arguments(parser, config_cls)
    fixed = dict(fixed or {})

    def invoke(args: argparse.Namespace) -> int:
        if prepare is not None:
            prepare(args)
        config = from_args(config_cls, args)
        if fixed:
            config = dataclasses.replace(config, **fixed)  # type: ignore[type-var]
        configure_logging(getattr(config, "log_level", "INFO"))
        return int(run(config) or 0)

    parser.set_defaults(run=invoke, config_class=config_cls, fixed_settings=fixed, command_name=parser.prog)
    return parser


def service(
    parsers: Parsers, name: str, config_cls: type[C], server_module: str, *, help: str,
    check: Callable[[C], None] | None = None, **overrides: Any,
) -> argparse.ArgumentParser:
    """``ragr1 serve <name>``: ``server_module.serve(config)`` until it returns the exit code. The module is
    imported when the command runs: torch and vLLM are heavy, and ``ragr1 --help`` should not pay for
    them; ``check(config)`` runs before it, to refuse bad input (a model folder without a model) at once.
    ``overrides`` are fixed settings of this command (``rollout-worker``: ``worker=True``)."""

    def run(config: C) -> int:
        if check is not None:
            check(config)
        serve = importlib.import_module(server_module).serve
        return int(asyncio.run(serve(config)))

    return command(parsers, name, config_cls, run, help=help, fixed=overrides)
