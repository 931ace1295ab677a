#!/usr/bin/env bash
# Start a local StoneMQ cluster with one command: a standalone ZooKeeper (Debian's `zookeeper`
# package, installed if missing) and three brokers on 127.0.0.1, all data under one directory.
# Ctrl-C (or SIGTERM) stops every process.
#   ./scripts/cluster.sh                      brokers on 9092, 9093, 9094; ZooKeeper on 2181
#   ./scripts/cluster.sh --dir /tmp/stonemq   data under /tmp/stonemq (default ./cluster-data)
#   ./scripts/cluster.sh --brokers 5 --base-port 19092 --zookeeper-port 12181
# Extra settings reach every broker through the environment, e.g.
#   STONEMQ_JOURNAL_PARTITIONS=2 ./scripts/cluster.sh
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="$ROOT/cluster-data"
BROKERS=3
BASE_PORT=9092
ZK_PORT=2181
while [ $# -gt 0 ]; do
    case "$1" in
        --dir) DIR="$2"; shift 2 ;;
        --brokers) BROKERS="$2"; shift 2 ;;
        --base-port) BASE_PORT="$2"; shift 2 ;;
        --zookeeper-port) ZK_PORT="$2"; shift 2 ;;
        -h|--help) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "cluster.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done

LOG="$(mktemp -t stonemq-cluster-install.XXXXXX)"
STEP_PREFIX=cluster
# shellcheck source=scripts/lib.sh
source "$ROOT/scripts/lib.sh"
missing=()
[ -f /usr/share/java/zookeeper.jar ] || missing+=(zookeeper)
command -v java >/dev/null 2>&1 || missing+=(default-jre-headless)
if [ "${#missing[@]}" -gt 0 ]; then
    apt_install "${missing[@]}"
fi
rm -f "$LOG"

mkdir -p "$DIR/zookeeper/data"
cat >"$DIR/zookeeper/zoo.cfg" <<EOF
tickTime=2000
dataDir=$DIR/zookeeper/data
clientPort=$ZK_PORT
clientPortAddress=127.0.0.1
admin.enableServer=false
4lw.commands.whitelist=ruok,srvr
EOF

zk_pid=""
pids=()
stop_all() {
    # brokers first (each deregisters and resigns in ZooKeeper), then ZooKeeper
    trap - INT TERM EXIT
    echo "cluster.sh: stopping"
    for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
    if [ -n "$zk_pid" ]; then
        kill -TERM "$zk_pid" 2>/dev/null || true
        wait "$zk_pid" 2>/dev/null || true
    fi
}
trap stop_all INT TERM EXIT

java -Xmx256m -cp /usr/share/java/zookeeper.jar org.apache.zookeeper.server.quorum.QuorumPeerMain \
    "$DIR/zookeeper/zoo.cfg" >"$DIR/zookeeper/zookeeper.log" 2>&1 &
zk_pid=$!
zk_ok() {
    (exec 3<>"/dev/tcp/127.0.0.1/$ZK_PORT" && printf ruok >&3 && head -c 4 <&3) 2>/dev/null
}
for _ in $(seq 1 150); do
    [ "$(zk_ok)" = imok ] && break
    sleep 0.2
done
[ "$(zk_ok)" = imok ] || { echo "cluster.sh: ZooKeeper did not start:" >&2; tail -20 "$DIR/zookeeper/zookeeper.log" >&2; exit 1; }
echo "cluster.sh: ZooKeeper on 127.0.0.1:$ZK_PORT ($DIR/zookeeper/zookeeper.log)"

for i in $(seq 1 "$BROKERS"); do
    port=$((BASE_PORT + i - 1))
    STONEMQ_ZOOKEEPER_CONNECT="127.0.0.1:$ZK_PORT/stonemq" STONEMQ_BROKER_ID="$i" \
        "$ROOT/scripts/serve.sh" --listen "127.0.0.1:$port" --data-dir "$DIR/broker-$i" \
        >"$DIR/broker-$i.log" 2>&1 &
    pids+=($!)
    until grep -q " ready" "$DIR/broker-$i.log" 2>/dev/null; do
        if ! kill -0 "${pids[-1]}" 2>/dev/null; then
            echo "cluster.sh: broker $i exited:" >&2
            tail -20 "$DIR/broker-$i.log" >&2
            exit 1
        fi
        sleep 0.2
    done
    echo "cluster.sh: broker $i ready on 127.0.0.1:$port ($DIR/broker-$i.log)"
done
echo "cluster.sh: bootstrap with 127.0.0.1:$BASE_PORT; describe with"
echo "  $ROOT/.venv/bin/stonemq cluster describe --zookeeper-connect 127.0.0.1:$ZK_PORT/stonemq"
echo "cluster.sh: Ctrl-C stops the cluster"
wait
