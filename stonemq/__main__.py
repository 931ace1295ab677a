"""``python -m stonemq``: the same command line as ``stonemq``."""

from stonemq.cli import main

main()
