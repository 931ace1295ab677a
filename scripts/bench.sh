#!/usr/bin/env bash
# Run the benchmark suite (bench/): installs what it needs (Debian's redis-server; the package
# with its `bench` extra in .venv), then runs every workload and both baselines in one run and
# writes docs/benchmarks.md and docs/benchmarks/ (JSON, Markdown, PNG charts, py-spy profile
# of the broker, perf profile of the producer).
#   ./scripts/bench.sh            full run (well under 30 minutes on 2 cores)
#   ./scripts/bench.sh --quick    every workload at a small scale (a minute or two)
# Other arguments go to `python -m bench` (see --help). Needs root (or sudo) for apt-get the
# first time, and to drop the page cache (skipped, and said so in the report, otherwise).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PYTHON="${PYTHON:-python3}"
VENV="$ROOT/.venv"
LOG="$(mktemp -t stonemq-bench-install.XXXXXX)"
trap 'rm -f "$LOG"' EXIT

STEP_PREFIX=bench
# shellcheck source=scripts/lib.sh
source "$ROOT/scripts/lib.sh"

missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
# perf profiles the librdkafka producer at 10,000 partitions (the client's own CPU)
command -v perf >/dev/null 2>&1 || missing+=(linux-perf)
# the archive workload's PySpark job needs a JVM
command -v java >/dev/null 2>&1 || [ -n "${JAVA_HOME:-}" ] || missing+=(openjdk-17-jre-headless)
# the replication workload runs a standalone ZooKeeper (Debian's package, on that JVM)
[ -f /usr/share/java/zookeeper.jar ] || missing+=(zookeeper)
command -v "$PYTHON" >/dev/null 2>&1 || missing+=(python3)
if [ ! -x "$VENV/bin/python" ] && ! "$PYTHON" -c 'import ensurepip, venv' >/dev/null 2>&1; then
    missing+=(python3-venv)
fi
if [ "${#missing[@]}" -gt 0 ]; then
    apt_install "${missing[@]}"
fi

if [ ! -x "$VENV/bin/python" ]; then
    run "create $VENV" "$PYTHON" -m venv "$VENV"
fi
STAMP="$VENV/.stonemq-bench-deps"
want="$(cat "$ROOT/pyproject.toml" "$ROOT/setup.py" "$ROOT"/stonemq/protocol/*.c | sha256sum | cut -d' ' -f1)"
if [ "$want" != "$(cat "$STAMP" 2>/dev/null || true)" ] \
    || ! "$VENV/bin/python" -P -c 'import stonemq, bench, confluent_kafka, redis, matplotlib, psutil, pyspark' \
        >/dev/null 2>&1 || [ ! -x "$VENV/bin/py-spy" ]; then
    run "pip install -e .[bench]" env PIP_DISABLE_PIP_VERSION_CHECK=1 \
        "$VENV/bin/python" -m pip install --quiet -e "$ROOT[bench]" \
        --config-settings editable_mode=compat  # as the tests install it (one shared venv)
    echo "$want" >"$STAMP"
fi

# the brokers load the package's bytecode, as from an installed wheel (scripts/serve.sh says why)
"$VENV/bin/python" -m compileall -q "$ROOT/stonemq" >/dev/null || true
rm -f "$LOG"
trap - EXIT
exec "$VENV/bin/python" -m bench "$@"
