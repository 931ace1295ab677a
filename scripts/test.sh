#!/usr/bin/env bash
# Install the test dependencies, lint, and run the whole test suite (every marker: fast,
# slow, crash, spark). Extra arguments go to pytest, e.g.
#   ./scripts/test.sh -m 'not slow and not crash and not spark and not fuzz and not cluster' -n 4 --dist loadfile
#   ./scripts/test.sh tests/integration/test_kcat.py -x
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

"$ROOT/scripts/install-test-deps.sh"

echo "== ruff check stonemq tests"
"$ROOT/.venv/bin/ruff" check stonemq tests

# The suite starts hundreds of Python processes (brokers, clients, Spark workers); without
# bytecode caches each one compiles its imports from source again, and pytest rewrites every
# test module on every run. A machine-wide PYTHONDONTWRITEBYTECODE would forbid the caches.
unset PYTHONDONTWRITEBYTECODE

echo "== pytest $*"
exec "$ROOT/.venv/bin/pytest" "$@"
