#!/usr/bin/env bash
# Install everything the test suite needs: Debian packages (kcat, node), the Python
# virtual environment in .venv with the package and its test extras, and kafkajs under
# tests/js. Idempotent: a second run with nothing changed does nothing and prints nothing.
# Quiet on success; on failure it prints the failing step's full output and exits non-zero.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
VENV="$ROOT/.venv"
JS_DIR="$ROOT/tests/js"

LOG="$(mktemp -t stonemq-install.XXXXXX)"
trap 'rm -f "$LOG"' EXIT

STEP_PREFIX=install-test-deps
# shellcheck source=scripts/lib.sh
source "$ROOT/scripts/lib.sh"

# -- Debian packages ------------------------------------------------------------------------
missing=()
command -v kcat >/dev/null 2>&1 || missing+=(kcat)
command -v node >/dev/null 2>&1 || missing+=(nodejs)
command -v npm >/dev/null 2>&1 || missing+=(npm)
command -v "$PYTHON" >/dev/null 2>&1 || missing+=(python3)
# the spark suite (tiered storage) runs PySpark, which needs a Java 17+ runtime
command -v java >/dev/null 2>&1 || [ -n "${JAVA_HOME:-}" ] || missing+=(openjdk-17-jre-headless)
if command -v "$PYTHON" >/dev/null 2>&1 && [ ! -x "$VENV/bin/python" ] \
    && ! "$PYTHON" -c 'import ensurepip, venv' >/dev/null 2>&1; then
    missing+=(python3-venv)
fi
# the cluster tests start a real ZooKeeper (Debian's package: the jar, run with that Java)
[ -f /usr/share/java/zookeeper.jar ] || missing+=(zookeeper)
# the record validator's C walk (setup.py) builds with a C compiler and the Python headers
command -v gcc >/dev/null 2>&1 || missing+=(gcc)
if command -v "$PYTHON" >/dev/null 2>&1 && ! "$PYTHON" -c \
    'import os, sysconfig; assert os.path.exists(sysconfig.get_paths()["include"] + "/Python.h")' \
    >/dev/null 2>&1; then
    missing+=(python3-dev)
fi
if [ "${#missing[@]}" -gt 0 ]; then
    apt_install "${missing[@]}"
fi

if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    echo "install-test-deps: $PYTHON is $("$PYTHON" --version 2>&1); StoneMQ needs Python 3.11+" >&2
    exit 1
fi

# -- Python virtual environment -------------------------------------------------------------
if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c 'import sys' >/dev/null 2>&1; then
    run "create $VENV" "$PYTHON" -m venv --clear "$VENV"
fi

# compat editable mode: the checkout goes on sys.path as a folder, so PySpark's lookup of
# Python data sources (pkgutil.iter_modules, modules named pyspark_*) finds pyspark_stonemq.
# Reinstall only when the build inputs (pyproject.toml, setup.py, the C extension) changed since
# the last successful install, the editable install went missing, or another mode replaced it
# (``import bench`` works only with the checkout on sys.path; -P: not from the current directory).
PY_STAMP="$VENV/.stonemq-test-deps"
py_want="$(cat "$ROOT/pyproject.toml" "$ROOT/setup.py" "$ROOT"/stonemq/protocol/*.c | sha256sum | cut -d' ' -f1)"
py_have="$(cat "$PY_STAMP" 2>/dev/null || true)"
if [ "$py_want" != "$py_have" ] || [ ! -x "$VENV/bin/stonemq" ] || [ ! -x "$VENV/bin/pytest" ] \
    || ! "$VENV/bin/python" -P -c 'import stonemq, pyspark_stonemq, bench, confluent_kafka, kafka, aiokafka' >/dev/null 2>&1; then
    run "pip install -e .[test]" env PIP_DISABLE_PIP_VERSION_CHECK=1 \
        "$VENV/bin/python" -m pip install --quiet -e "$ROOT[test]" \
        --config-settings editable_mode=compat
    echo "$py_want" >"$PY_STAMP"
fi

# -- kafkajs ------------------------------------------------------------------------------
JS_STAMP="$JS_DIR/node_modules/.stonemq-test-deps"
if [ -f "$JS_DIR/package-lock.json" ]; then
    js_want="$(cat "$JS_DIR/package.json" "$JS_DIR/package-lock.json" | sha256sum | cut -d' ' -f1)"
else
    js_want="$(sha256sum "$JS_DIR/package.json" | cut -d' ' -f1)"
fi
js_have="$(cat "$JS_STAMP" 2>/dev/null || true)"
if [ "$js_want" != "$js_have" ] || [ ! -f "$JS_DIR/node_modules/kafkajs/package.json" ]; then
    if [ -f "$JS_DIR/package-lock.json" ]; then
        run "npm ci (tests/js)" npm --prefix "$JS_DIR" ci --no-audit --no-fund --loglevel=error
    else
        run "npm install (tests/js)" npm --prefix "$JS_DIR" install --no-audit --no-fund \
            --loglevel=error
    fi
    echo "$js_want" >"$JS_STAMP"
fi
