"""The serving process: validated settings in, the broker run until it stops, an exit status out.

``stonemq serve`` validates its settings and then replaces itself (``os.execv``, same pid) with
``python -m stonemq.server.run --settings-fd N``, N a memory file holding the handover document
(:mod:`stonemq.config_values`). This module imports neither pydantic nor the command line, so the
serving process holds only what serving needs (tests/integration/test_process_size.py)."""

from __future__ import annotations

import logging
import os
import sys
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from stonemq.config import Settings

SETTINGS_FD_FLAG = "--settings-fd"


def setup_logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


def run_broker(settings: Settings) -> int:
    """Serve with ``settings`` until stopped. Returns the exit status: 0 stopped, 1 refused to
    start or stopped on an I/O error."""
    setup_logging(settings.log_level)
    from stonemq.config_values import unknown_environment

    for name in unknown_environment(os.environ):
        logging.getLogger("stonemq.server").warning(
            "the environment variable %s names no setting and is ignored "
            "(settings are STONEMQ_<NAME>, e.g. STONEMQ_NUM_PARTITIONS)",
            name,
        )

    from stonemq.server.listener import serve
    from stonemq.server.lock import DirectoryInUseError
    from stonemq.server.malloc import tune_malloc

    tune_malloc()

    from stonemq.cluster import ClusterStartError
    from stonemq.metadata.sqlite import MetadataStoreError

    try:
        import uvloop

        uvloop.run(serve(settings))
    except (DirectoryInUseError, ClusterStartError, MetadataStoreError) as exc:
        logging.getLogger("stonemq").error("refusing to start: %s", exc)
        return 1
    except OSError as exc:
        # Binding the port, opening the data dir, or an I/O error that ended the broker.
        logging.getLogger("stonemq").error("broker stopped on an I/O error: %s", exc)
        return 1
    except KeyboardInterrupt:
        pass
    return 0


def read_handover(fd: int) -> Settings:
    """The settings handed over in file descriptor ``fd`` (read whole, then closed)."""
    from stonemq.config_values import decode_handover

    chunks = []
    with os.fdopen(fd, "rb") as f:
        f.seek(0)
        while chunk := f.read(1 << 16):
            chunks.append(chunk)
    # a SettingsValues: the model's attributes with validated values, typed as the model
    return cast("Settings", decode_handover(b"".join(chunks)))


def handover_argv(fd: int) -> list[str]:
    """The command line that serves the settings handed over in ``fd``."""
    return [sys.executable, "-m", "stonemq.server.run", SETTINGS_FD_FLAG, str(fd)]


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] != SETTINGS_FD_FLAG or not argv[1].isdigit():
        print(
            "usage: python -m stonemq.server.run --settings-fd N (started by stonemq serve)",
            file=sys.stderr,
        )
        return 2
    sys.modules.setdefault("hypothesis", None)  # import fails; kio then skips it (cli/__init__)
    try:
        settings = read_handover(int(argv[1]))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"stonemq: cannot read the settings handed over: {exc}", file=sys.stderr)
        return 2
    return run_broker(settings)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
