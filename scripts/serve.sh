#!/usr/bin/env bash
# Install StoneMQ into .venv (first run only) and start the broker with embedded defaults:
# listening on 127.0.0.1:9092, data in ./data. Arguments go to `stonemq serve`, e.g.
#   ./scripts/serve.sh --listen 0.0.0.0:9092 --data-dir /var/lib/stonemq
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
VENV="$ROOT/.venv"

fail() {
    echo "serve.sh: $*" >&2
    exit 1
}

if ! command -v "$PYTHON" >/dev/null 2>&1; then
    fail "$PYTHON not found; install Python 3.11+ (Debian: apt-get install python3 python3-venv)"
fi
if [ ! -x "$VENV/bin/python" ]; then
    if ! "$PYTHON" -c 'import ensurepip, venv' >/dev/null 2>&1; then
        if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
            (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
                python3-venv) >/dev/null || fail "could not install python3-venv"
        else
            fail "python3 has no venv module; install it (Debian: apt-get install python3-venv)"
        fi
    fi
    "$PYTHON" -m venv "$VENV" || fail "could not create $VENV"
fi

STAMP="$VENV/.stonemq-serve"
want="$(cat "$ROOT/pyproject.toml" "$ROOT/setup.py" "$ROOT"/stonemq/protocol/*.c | sha256sum | cut -d' ' -f1)"
if [ "$want" != "$(cat "$STAMP" 2>/dev/null || true)" ] || [ ! -x "$VENV/bin/stonemq" ] \
    || ! "$VENV/bin/python" -c 'import stonemq' >/dev/null 2>&1; then
    log="$(mktemp -t stonemq-serve-install.XXXXXX)"
    # compat editable mode, as scripts/install-test-deps.sh and bench.sh install it: the venv is
    # shared, and another mode would take the checkout off sys.path for the tests and the bench
    if ! PIP_DISABLE_PIP_VERSION_CHECK=1 "$VENV/bin/python" -m pip install --quiet -e "$ROOT" \
        --config-settings editable_mode=compat >"$log" 2>&1; then
        cat "$log" >&2
        rm -f "$log"
        fail "pip install -e . failed"
    fi
    rm -f "$log"
    echo "$want" >"$STAMP"
fi

# The package's bytecode, as pip writes it for an installed wheel: an editable install leaves it
# to the first import, which PYTHONDONTWRITEBYTECODE=1 turns off, and then every start compiles
# every module again and keeps about 3 MiB more (docs/benchmarks/analysis.md). Up-to-date files
# are skipped.
"$VENV/bin/python" -m compileall -q "$ROOT/stonemq" >/dev/null || true
exec "$VENV/bin/stonemq" serve "$@"
