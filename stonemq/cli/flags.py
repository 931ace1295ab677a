"""The help text of the command-line flags ``stonemq serve`` shares with other commands.

Typer-free, so ``stonemq serve`` (``stonemq.cli.serve``, parsed with argparse) and the Typer
commands (``stonemq.cli.options``, ``stonemq.cli.commands``) read the same text."""

from __future__ import annotations

SERVE_HELP = """Run the broker. Every setting also comes from env STONEMQ_<NAME> or the TOML file;
a flag beats env, env beats the file, the file beats the default."""

HELP = {
    "listeners": (
        "Kafka's listeners, NAME://HOST:PORT[,...] (default: PLAINTEXT://127.0.0.1:9092)"
    ),
    "advertised_listeners": (
        "Kafka's advertised.listeners, NAME://HOST:PORT[,...] (default: listeners)"
    ),
    "listen": "HOST:PORT: alias of --listeners PLAINTEXT://HOST:PORT",
    "advertise": "HOST:PORT: alias of --advertised-listeners PLAINTEXT://HOST:PORT",
    "data_dir": "root of all broker state (default: ./data)",
    "journal_dir": "write directory (default: DATA_DIR/journal)",
    "queue_dir": "read directory (default: DATA_DIR/queues)",
    "config": "TOML settings file (Kafka names, e.g. num.partitions = 3)",
}
"""Flag (as a Python name: ``--data-dir`` is ``data_dir``) to its help line."""

SERVE_PATH_FLAGS = ("data_dir", "journal_dir", "queue_dir", "config")
"""The flags of ``stonemq serve`` that name a path (the others are strings)."""
