"""The archive job's entry point for ``spark-submit``: the same as ``stonemq tier run``, with
the master and resources taken from spark-submit's own flags.

    spark-submit --master spark://host:7077 "$(python -c 'import stonemq.tiering.submit as m;
    print(m.__file__)')" --once --data-dir /var/lib/stonemq
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> None:
    from stonemq.cli import app

    app(["tier", "run", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    main()
