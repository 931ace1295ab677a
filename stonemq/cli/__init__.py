"""The ``stonemq`` command line: thin commands over the broker's parts.

``stonemq serve`` parses its flags with argparse (``stonemq.cli.serve``), so the broker
process loads neither Typer nor the admin commands' Kafka client library, nor hypothesis (kio
registers its types with hypothesis whenever it is importable): the broker's memory is a
benchmark figure. Every other command, and ``stonemq --help``, uses the full app in ``commands``.
"""

from __future__ import annotations

import sys
from typing import Any


def main() -> None:
    if sys.argv[1:2] == ["serve"]:
        sys.modules.setdefault("hypothesis", None)  # import fails; kio then skips it
        from stonemq.cli.serve import main as serve

        sys.exit(serve(sys.argv[2:]))
    from stonemq.cli.commands import app

    app()


def __getattr__(name: str) -> Any:
    if name == "app":
        from stonemq.cli.commands import app

        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["app", "main"]
