"""Generates the reference pages under ``docs/reference/``, each from the one place its facts live:

- ``settings.md``: every ``ragr1`` command's settings, from the config dataclass its parser is built from;
- ``helm-values.md``: the chart's values, from ``deploy/helm/ragr1/values.schema.json`` (types, descriptions)
  and ``values.yaml`` (defaults);
- ``metrics.md``: every Prometheus metric, from the collectors the code defines;
- ``api.md``: the gRPC services and messages, from the comments in ``proto/ragr1/v1/*.proto``.

Run ``make docs`` (``python -m ragr1.docgen``) after changing any of them; the pages are checked in so that
the docs build without running code, and a test fails when one is stale.
"""

from __future__ import annotations

from collections.abc import Callable

from ragr1.docgen.markdown import REFERENCE, ROOT


def pages() -> dict[str, Callable[[], str]]:
    """Page file name -> the function that renders it."""
    from ragr1.docgen import api, helm, metrics, settings

    return {"settings.md": settings.render, "helm-values.md": helm.render, "metrics.md": metrics.render,
            "api.md": api.render}


def main() -> None:
    REFERENCE.mkdir(parents=True, exist_ok=True)
    for name, render in pages().items():
        path = REFERENCE / name
        path.write_text(render())
        print(path.relative_to(ROOT))
