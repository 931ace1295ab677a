"""The replication workload (issue 20, item 5): three brokers and ZooKeeper on loopback,
1 KiB records at replication factor 3 with acks=all, from 1 to 10,000 topic partitions, with
librdkafka and with the packing producer (``bench/multiproduce.py``); the single node at
acks=1 beside it for the RF3 ÷ single-node ratio; and failover, leader SIGKILL to the first
acknowledged produce on the new leader, over repeated kills.

Owns: starting and stopping ZooKeeper and the three-broker cluster the bench measures, the
cluster's measurements (CPU and PSS of every broker, replica fetch requests counted by the
brokers' own ``stonemq_replica_fetch_requests_served_total`` metric), and the ratios against
the issue's targets (:func:`targets`, pure, unit-tested). ``python -m bench --only replication``
(``--quick`` for a small scale) runs it; ``--merge`` adds it to a full run's report.
"""

from __future__ import annotations

import bisect
import contextlib
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from multiprocessing.queues import Queue
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench import clients, multiproduce, procs

if TYPE_CHECKING:
    from bench.run import Run

KIB = 1024
STEPS = (1, 100, 1000, 10_000)
QUICK_STEPS = (1, 100)
REPLICAS = 3
SESSION_TIMEOUT_MS = 6000
ZOOKEEPER_JAR = "/usr/share/java/zookeeper.jar"
# ZooKeeper's own sample configuration (zoo_sample.cfg) and scripts/cluster.sh: tickTime 2000,
# so a 6,000 ms session is within its 2..20 tick bounds
ZOOKEEPER_TICK_MS = 2000
ACKS_ALL = -1
SERVED = "stonemq_replica_fetch_requests_served_total"
ISR_WAIT_S = 45.0  # after a killed broker's restart, before a fresh cluster takes over
CLIENT_RECONNECT_BACKOFF_MAX_S = 10.0
"""librdkafka's ``reconnect.backoff.max.ms`` default. The next kill comes at least this long
after the previous victim is back: the new leader is often that broker, and librdkafka,
which kept failing to reconnect to it while it was down (its back-off doubling up to this
cap), connects to it again only when its last back-off has run out, up to 10 s after it
returned (seen in its debug log: "Delaying next reconnect by 1659ms" after the new leader
was already serving). Kills closer together measure that back-off, not the failover."""
MAX_REJOIN_FAILURES = 8

# the targets: (key, text, goal, "ge"/"le")
TARGETS = (
    ("packing_10k_vs_1", "packing producer: throughput at 10,000 ÷ at 1 partition", 0.8, "ge"),
    ("cpu_10k_vs_1_librdkafka", "librdkafka: broker CPU/GB at 10,000 ÷ at 1", 1.5, "le"),
    ("cpu_10k_vs_1_packing", "packing producer: broker CPU/GB at 10,000 ÷ at 1", 1.5, "le"),
    ("fetch_rate_spread", "replica fetch req/s: largest deviation from their mean", 0.1, "le"),
    ("pss_10k_vs_single", "PSS per broker at 10,000 ÷ single node's", 2.0, "le"),
    ("rf3_vs_single_librdkafka", "librdkafka: RF3 acks=all ÷ single node acks=1", 0.4, "ge"),
    ("rf3_vs_single_packing", "packing: RF3 acks=all ÷ single node acks=1", 0.4, "ge"),
    ("failover_max_s", "failover, SIGKILL to first ack on the new leader (max), s", 5.0, "le"),
)


@dataclass(frozen=True)
class Scale:
    steps: tuple[int, ...]
    seconds: float  # per producer per step
    max_bytes: int
    kills: int


FULL = Scale(STEPS, 12.0, 64 << 30, 20)
QUICK = Scale(QUICK_STEPS, 2.0, 32 << 20, 2)
PROFILE_RATE_HZ = 100


def scale_for(run: Run) -> Scale:
    """The run's scale, with a development run's overrides from the environment:
    ``STONEMQ_BENCH_REPL_STEPS`` (comma-separated partition counts),
    ``STONEMQ_BENCH_REPL_SECONDS`` (per producer per step) and ``STONEMQ_BENCH_REPL_KILLS``
    (0: no failover rounds)."""
    scale = QUICK if run.scale.name == "quick" else FULL
    steps = os.environ.get("STONEMQ_BENCH_REPL_STEPS")
    seconds = os.environ.get("STONEMQ_BENCH_REPL_SECONDS")
    kills = os.environ.get("STONEMQ_BENCH_REPL_KILLS")
    return Scale(
        tuple(int(s) for s in steps.split(",")) if steps else scale.steps,
        float(seconds) if seconds else scale.seconds,
        scale.max_bytes,
        int(kills) if kills else scale.kills,
    )


@contextlib.contextmanager
def profiling(pids: list[int], out: Path | None, name: str, seconds: float) -> Iterator[None]:
    """py-spy (raw stacks, ``PROFILE_RATE_HZ``) on each broker of ``pids`` for ``seconds``
    while the block runs, into ``out/profile-<name>-<broker index>.txt``; nothing without
    ``out`` (``STONEMQ_BENCH_REPL_PROFILE``: a directory) or py-spy."""
    pyspy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if out is None or not os.path.exists(pyspy):
        yield
        return
    out.mkdir(parents=True, exist_ok=True)
    spies = [
        subprocess.Popen(
            [
                pyspy, "record", "--pid", str(pid), "--duration", str(int(seconds)),
                "--rate", str(PROFILE_RATE_HZ), "--format", "raw", "--nonblocking",
                "--output", str(out / f"profile-{name}-{i}.txt"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for i, pid in enumerate(pids)
    ]  # fmt: skip
    try:
        yield
    finally:
        for spy in spies:
            try:
                spy.wait(timeout=seconds + 60)
            except subprocess.TimeoutExpired:
                spy.kill()


# -- the ratios (pure) -------------------------------------------------------------------------


def _by(rows: list[dict[str, Any]], producer: str) -> dict[int, dict[str, Any]]:
    return {r["partitions"]: r for r in rows if r["producer"] == producer}


def _ratio(a: float | None, b: float | None) -> float | None:
    """a / b, exact (a target is judged on it; only the report rounds it)."""
    if a is None or b is None or b == 0:
        return None
    return a / b


def percentiles(values: list[float]) -> dict[str, float] | None:
    """min, median, p90 (nearest rank) and max of ``values``; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, -(-9 * len(ordered) // 10))  # ceil(0.9 n)
    return {
        "min": round(ordered[0], 3),
        "median": round(statistics.median(ordered), 3),
        "p90": round(ordered[rank - 1], 3),
        "max": round(ordered[-1], 3),
    }


def _detail(key: str, top: int | None, failover: dict[str, Any] | None) -> str:
    """Where a target's figure comes from, for the report."""
    if key.startswith("rf3_vs_single"):
        return "at 1 partition"
    if key == "failover_max_s":
        return f"distribution {failover}" if failover else ""
    if key == "fetch_rate_spread":
        return "over every step and both producers"
    return f"largest step {top:,} partitions" if top else ""


def targets(result: dict[str, Any], failover: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Each target of the issue against ``result`` (this workload's steps) and ``failover``
    (its kills): measured value, goal and whether it is reached (None: not measured in this
    run, e.g. a quick run without the 10,000-partition step)."""
    rows = result.get("steps", [])
    single = result.get("single", [])
    rdk, pack = _by(rows, "librdkafka"), _by(rows, "packing")
    s_rdk, s_pack = _by(single, "librdkafka"), _by(single, "packing")
    top = max((r["partitions"] for r in rows), default=None)

    def get(table: dict[int, dict[str, Any]], n: int | None, key: str) -> float | None:
        row = table.get(n) if n is not None else None
        return row.get(key) if row is not None else None

    rates = [r["fetch_req_s"] for r in rows if r.get("fetch_req_s") is not None]
    spread = None
    if rates and statistics.mean(rates) > 0:
        mean = statistics.mean(rates)
        spread = max(abs(r - mean) for r in rates) / mean
    pss_cluster = max(
        (get(t, 10_000, "pss_peak_per_broker_mb") or 0 for t in (rdk, pack)), default=0
    )
    pss_single = max((get(t, 10_000, "pss_peak_mb") or 0 for t in (s_rdk, s_pack)), default=0)
    fail = (failover or {}).get("to_first_ack_s")
    measured = {
        "packing_10k_vs_1": _ratio(get(pack, 10_000, "mb_s"), get(pack, 1, "mb_s")),
        "cpu_10k_vs_1_librdkafka": _ratio(
            get(rdk, 10_000, "cpu_s_per_gb"), get(rdk, 1, "cpu_s_per_gb")
        ),
        "cpu_10k_vs_1_packing": _ratio(
            get(pack, 10_000, "cpu_s_per_gb"), get(pack, 1, "cpu_s_per_gb")
        ),
        "fetch_rate_spread": spread if len(rates) > 1 else None,
        "pss_10k_vs_single": _ratio(pss_cluster or None, pss_single or None),
        "rf3_vs_single_librdkafka": _ratio(get(rdk, 1, "mb_s"), get(s_rdk, 1, "mb_s")),
        "rf3_vs_single_packing": _ratio(get(pack, 1, "mb_s"), get(s_pack, 1, "mb_s")),
        "failover_max_s": fail["max"] if fail else None,
    }
    out = []
    for key, text, goal, how in TARGETS:
        value = measured[key]
        # judged on the exact value: 0.3996 rounds to 0.4 but does not reach "≥ 0.4"
        reached = None if value is None else (value >= goal if how == "ge" else value <= goal)
        shown = None if value is None else round(value, 3)
        if shown == goal and value != goal:
            shown = round(value, 6)  # three decimals would show the goal itself
        out.append(
            {
                "key": key,
                "target": text,
                "goal": f"{'≥' if how == 'ge' else '≤'} {goal}",
                "measured": shown,
                "detail": _detail(key, top, fail),
                "reached": reached,
                "largest_step": top,
            }
        )
    return out


# -- ZooKeeper and the cluster -------------------------------------------------------------


def zookeeper_available() -> bool:
    return os.path.exists(ZOOKEEPER_JAR) and shutil.which("java") is not None


class ZooKeeper:
    """A standalone ZooKeeper (Debian's package) on a free loopback port."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.port = procs.free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def connect(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 60.0) -> None:
        (self.root / "data").mkdir(parents=True, exist_ok=True)
        cfg = self.root / "zoo.cfg"
        cfg.write_text(
            f"tickTime={ZOOKEEPER_TICK_MS}\ndataDir={self.root / 'data'}\n"
            f"clientPort={self.port}\nclientPortAddress=127.0.0.1\n"
            "admin.enableServer=false\n4lw.commands.whitelist=ruok\n"
        )
        main = "org.apache.zookeeper.server.quorum.QuorumPeerMain"
        cmd = ["java", "-Xmx256m", "-cp", ZOOKEEPER_JAR, main, str(cfg)]
        self.proc = procs.spawn(cmd, self.root / "zookeeper.log")
        deadline = time.monotonic() + timeout
        while not self._ok():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("ZooKeeper did not start (see zookeeper.log)")
            time.sleep(0.1)

    def _ok(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as sock:
                sock.sendall(b"ruok")
                return sock.recv(4) == b"imok"
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc is not None:
            procs.stop(self.proc)


class Cluster:
    """Three brokers (ids 1..3) in their own ZooKeeper chroot, replication factor 3."""

    def __init__(self, root: Path, zk: ZooKeeper, name: str, **settings: Any) -> None:
        self.chroot = f"{zk.connect}/{name}"
        self.metrics_ports: dict[int, int] = {}
        self.brokers: dict[int, procs.Broker] = {}
        for b in range(1, REPLICAS + 1):
            self.metrics_ports[b] = procs.free_port()
            self.brokers[b] = procs.Broker(
                root / f"{name}-broker{b}",
                {
                    "zookeeper.connect": self.chroot,
                    "broker.id": b,
                    "default.replication.factor": REPLICAS,
                    "zookeeper.session.timeout.ms": SESSION_TIMEOUT_MS,
                    "metrics.listen": f"127.0.0.1:{self.metrics_ports[b]}",
                    **settings,
                },
            )

    @property
    def bootstrap(self) -> str:
        return ",".join(b.bootstrap for b in self.brokers.values())

    def pids(self) -> list[int]:
        return [b.pid for b in self.brokers.values()]

    def start(self) -> None:
        started = {b: broker.spawn() for b, broker in self.brokers.items()}
        for b, broker in self.brokers.items():
            broker.wait_ready(started[b], timeout=180)

    def stop(self) -> None:
        for broker in self.brokers.values():
            broker.stop()
        for broker in self.brokers.values():
            shutil.rmtree(broker.data_dir, ignore_errors=True)

    def served(self) -> int:
        """Replica fetch requests answered, summed over the brokers (their metric)."""
        return sum(scrape(port).get(SERVED, 0) for port in self.metrics_ports.values())

    def journal_state(self) -> dict[int, tuple[int, tuple[int, ...]]]:
        """Each journal partition's (leader, ISR), read from ZooKeeper."""
        from kazoo.client import KazooClient

        from stonemq.cluster.controller import read_journal_partitions

        zk = KazooClient(self.chroot)
        zk.start(10)
        try:
            parts = read_journal_partitions(zk)
            return {j: (p.state.leader, tuple(p.state.isr)) for j, p in parts.items()}
        finally:
            zk.stop()
            zk.close()

    def wait_isr_full(self, timeout: float = 120.0) -> float:
        """Wait until every journal partition has a leader and all replicas in its ISR."""
        started = time.monotonic()
        while True:
            state = self.journal_state()
            if state and all(leader > 0 and len(isr) == REPLICAS for leader, isr in state.values()):
                return time.monotonic() - started
            if time.monotonic() - started > timeout:
                raise RuntimeError(f"ISR not full after {timeout:.0f} s: {state}")
            time.sleep(0.2)


def scrape(port: int) -> dict[str, float]:
    """``name value`` samples without labels from a Prometheus text endpoint."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return parse_metrics(text)


def parse_metrics(text: str) -> dict[str, float]:
    """The unlabelled samples of Prometheus text exposition (comments skipped)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#") or "{" in line:
            continue
        name, _, value = line.partition(" ")
        with contextlib.suppress(ValueError):
            out[name] = float(value.split()[0])
    return out


def create_topic(bootstrap: str, topic: str, partitions: int, replicas: int) -> float:
    """Create ``topic`` and wait until every partition has a leader; returns seconds taken."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap, "socket.timeout.ms": 300_000})
    started = time.monotonic()
    futures = admin.create_topics(
        [NewTopic(topic, num_partitions=partitions, replication_factor=replicas)],
        operation_timeout=300,
        request_timeout=300,
    )
    futures[topic].result(300)
    while True:
        meta = admin.list_topics(topic, timeout=30).topics.get(topic)
        parts = meta.partitions if meta is not None and meta.error is None else {}
        if len(parts) == partitions and all(p.leader >= 0 for p in parts.values()):
            return time.monotonic() - started
        if time.monotonic() - started > 300:
            raise RuntimeError(f"{topic}: partitions without a leader after 300 s")
        time.sleep(0.2)


# -- measuring a load on several brokers --------------------------------------------------


@contextlib.contextmanager
def monitors(pids: list[int]) -> Iterator[list[procs.Monitor]]:
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(procs.Monitor(pid)) for pid in pids]


def measure(run: Run, pids: list[int], served: Any, target: Any, *args: Any) -> dict[str, Any]:
    """Run a producer worker; CPU and PSS of every broker in ``pids`` and replica fetch
    requests (``served()``, or None on the single node) over the producer's run."""
    from bench.run import expect, worker

    with worker(target, *args) as q:
        expect(q, "start", 120)
        before = served() if served else None
        with monitors(pids) as mons:
            result = expect(q, "done", 900)
        after = served() if served else None
    seconds = max(result["seconds"], 1e-9)
    gb = result["bytes"] / 1e9
    cpu = sum(m.cpu for m in mons)
    out: dict[str, Any] = {
        "msgs": result["msgs"],
        "bytes": result["bytes"],
        "seconds": round(seconds, 3),
        "msg_s": round(result["msgs"] / seconds, 1),
        "mb_s": round(result["bytes"] / seconds / 1e6, 2),
        "errors": result.get("errors", 0),
        "cpu_s": round(cpu, 3),
        "cpu_s_per_gb": round(cpu / gb, 2) if gb > 0 else None,
        "pss_peak_mb": round(max(m.peak for m in mons) / 1e6, 1),
        "pss_peak_per_broker_mb": round(max(m.peak for m in mons) / 1e6, 1),
        "pss_peak_brokers_mb": [round(m.peak / 1e6, 1) for m in mons],
        "pss_steady_brokers_mb": [round(m.steady / 1e6, 1) for m in mons],
    }
    for key in ("batches", "partitions_per_request", "records_per_batch", "leaders"):
        if key in result:
            out[key] = result[key]
    if before is not None and after is not None:
        out["fetch_requests"] = int(after - before)
        out["fetch_req_s"] = round((after - before) / seconds, 1)
    return out


def _loads(
    run: Run, bootstrap: str, pids: list[int], served: Any, n: int, acks: str, scale: Scale
) -> list[dict[str, Any]]:
    """librdkafka, then the packing producer, on topic ``scale`` of ``n`` partitions."""
    keys = max(4 * n, 1000)
    conf = clients.producer_conf(bootstrap, acks)
    rows = []
    r = measure(
        run, pids, served, clients.entry, "produce", conf, "scale", KIB, scale.seconds,
        scale.max_bytes, keys,
    )  # fmt: skip
    rows.append({"producer": "librdkafka", "partitions": n, "acks": acks, **r})
    for pid in pids:
        procs.wait_quiet(pid, timeout=60)
    r = measure(
        run, pids, served, multiproduce.entry, "multi_produce_leaders", bootstrap, "scale", n,
        KIB, scale.seconds, scale.max_bytes, ACKS_ALL if acks == "all" else 1,
    )  # fmt: skip
    rows.append({"producer": "packing", "partitions": n, "acks": acks, **r})
    profile = os.environ.get("STONEMQ_BENCH_REPL_PROFILE")
    if profile and served is not None and n == min(scale.steps):
        # a separate repeat under py-spy: sampling would disturb the measured run
        for pid in pids:
            procs.wait_quiet(pid, timeout=60)
        with profiling(pids, Path(profile), f"replication-{n}p-packing", scale.seconds - 2):
            measure(
                run, pids, served, multiproduce.entry, "multi_produce_leaders", bootstrap,
                "scale", n, KIB, scale.seconds, scale.max_bytes, ACKS_ALL,
            )  # fmt: skip
    return rows


def _log(rows: list[dict[str, Any]], what: str) -> None:
    from bench.run import log

    for r in rows:
        log(
            f"  {what} {r['partitions']:>6} partitions {r['producer']:<10}: "
            f"{r['mb_s']:>7.2f} MB/s cpu {r['cpu_s_per_gb']} s/GB "
            f"pss {r['pss_peak_brokers_mb']} MB fetch {r.get('fetch_req_s', '-')} req/s"
            f" errors {r['errors']}"
        )


# -- failover -----------------------------------------------------------------------------


def failover_producer(q: Queue[Any], bootstrap: str, topic: str, stop: Any) -> None:
    """An acks=all librdkafka producer sending one record every 2 ms to ``topic``-0 until
    ``stop`` is set; reports the CLOCK_MONOTONIC time of every acknowledgement."""
    try:
        from confluent_kafka import Producer

        acked: list[float] = []
        errors = [0]

        def on_delivery(err: Any, _msg: Any) -> None:
            if err is None:
                acked.append(time.monotonic())
            else:
                errors[0] += 1

        conf = clients.producer_conf(bootstrap, "all", linger_ms=0)
        producer = Producer({**conf, "on_delivery": on_delivery})
        producer.list_topics(topic, timeout=30)
        payload = os.urandom(KIB)
        q.put(("start", os.getpid()))
        while not stop.is_set():
            with contextlib.suppress(BufferError):
                producer.produce(topic, payload, partition=0)
            producer.poll(0.002)
        producer.flush(60)
        q.put(("done", {"acked": acked, "errors": errors[0]}))
    except BaseException:
        q.put(("error", traceback.format_exc()))


class _Watcher:
    """Polls ZooKeeper every 20 ms during a kill: when the killed broker's registration went
    (its session expired) and when no journal partition was led by it any more (elected)."""

    def __init__(self, chroot: str, killed: int) -> None:
        from kazoo.client import KazooClient

        self.killed = killed
        self.expired: float | None = None
        self.elected: float | None = None
        self._zk = KazooClient(chroot)
        self._zk.start(10)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        from stonemq.cluster.controller import read_journal_partitions
        from stonemq.cluster.membership import BROKER_IDS_PATH

        while not self._stop.is_set() and (self.expired is None or self.elected is None):
            with contextlib.suppress(Exception):
                if self.expired is None:
                    ids = self._zk.get_children(BROKER_IDS_PATH)
                    if str(self.killed) not in ids:
                        self.expired = time.monotonic()
                if self.elected is None:
                    parts = read_journal_partitions(self._zk)
                    if parts and all(p.state.leader != self.killed for p in parts.values()):
                        self.elected = time.monotonic()
            time.sleep(0.02)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._zk.stop()
        self._zk.close()


def _leader(bootstrap: str, topic: str) -> int:
    from confluent_kafka.admin import AdminClient

    meta = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=30)
    return int(meta.topics[topic].partitions[0].leader)


def _kill_round(cluster: Cluster) -> dict[str, Any]:
    """SIGKILL the leader of ``failover``-0, watch ZooKeeper until a new leader is elected
    and the killed broker's session expired, read the surviving brokers' logs for when each
    step happened, and restart the killed broker (a broker id still registered by a live
    session is refused, as by Kafka: the restart waits for the expiry)."""
    time.sleep(1.0)  # acknowledgements flowing before the kill
    leader = _leader(cluster.bootstrap, "failover")
    controller = _controller(cluster)
    broker = cluster.brokers[leader]
    marks = {
        b: other.log_path.stat().st_size
        for b, other in cluster.brokers.items()
        if b != leader and other.log_path.exists()
    }
    watcher = _Watcher(cluster.chroot, leader)
    watcher.start()
    killed_at = time.monotonic()
    killed_wall = time.time()
    broker.kill()  # SIGKILL
    deadline = time.monotonic() + 60
    while (watcher.elected is None or watcher.expired is None) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(1.0)  # the producer's first acks on the new leader
    watcher.close()
    texts = []
    for b, mark in marks.items():
        with open(cluster.brokers[b].log_path, "rb") as fh:
            fh.seek(mark)
            texts.append(fh.read().decode(errors="replace"))
    steps = log_steps(texts, leader, killed_wall)
    broker.start(timeout=180)
    return {
        "restarted_at": time.monotonic(),
        "killed": leader,
        "was_controller": controller == leader,
        "killed_at": killed_at,
        "expired_s": _since(watcher.expired, killed_at),
        "elected_s": _since(watcher.elected, killed_at),
        **steps,
    }


_LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) ", re.M)


def log_steps(texts: list[str], killed: int, killed_wall: float) -> dict[str, float | None]:
    """Seconds from the kill (``killed_wall``, the epoch) to each step of a failover as the
    surviving brokers logged it (their lines start with the local time to the millisecond):
    ``judged_dead_s``, a broker judged ``killed`` dead (its connection closed and its listener
    refused); ``log_elected_s``, the controller wrote a new leader for a journal partition
    ``killed`` led; ``leading_s``, a new leader took its first append (its epoch checkpointed).
    The earliest of each over ``texts``; None when no line says it."""
    patterns = {
        "judged_dead_s": re.compile(rf"broker {killed} judged dead"),
        "log_elected_s": re.compile(rf"journal partition \d+: leader {killed} -> \d+"),
        "leading_s": re.compile(r"journal partition \d+: leading in epoch"),
    }
    out: dict[str, float | None] = dict.fromkeys(patterns)
    for text in texts:
        for line in text.splitlines():
            m = _LOG_TIME.match(line)
            if m is None:
                continue
            for key, pattern in patterns.items():
                if pattern.search(line):
                    at = time.mktime(time.strptime(m.group(1), "%Y-%m-%d %H:%M:%S"))
                    since = round(at + int(m.group(2)) / 1000 - killed_wall, 3)
                    if since >= -0.5 and (out[key] is None or since < out[key]):
                        out[key] = since
    return out


def failover(run: Run, zk: ZooKeeper, kills: int) -> dict[str, Any]:
    """``kills`` rounds: SIGKILL the leader of ``failover``-0 while an acks=all producer
    writes to it, time to its first acknowledgement after the kill; restart the killed
    broker and wait for full ISRs before the next round. When the ISR does not fill again
    (a restarted broker that cannot rejoin), that is recorded with the brokers' logs and the
    rounds go on in a fresh cluster."""
    from bench.run import _CTX, expect, log, worker

    rounds: list[dict[str, Any]] = []
    rejoin_failures: list[dict[str, Any]] = []
    kept_logs: list[str] = []
    acked: list[float] = []
    errors = 0
    generation = 0
    while len(rounds) < kills and len(rejoin_failures) <= MAX_REJOIN_FAILURES:
        generation += 1
        cluster = Cluster(run.tmp, zk, f"failover{generation}")
        cluster.start()
        try:
            create_topic(cluster.bootstrap, "failover", 1, REPLICAS)
            cluster.wait_isr_full()
            stop = _CTX.Event()
            with worker(failover_producer, cluster.bootstrap, "failover", stop) as q:
                expect(q, "start", 120)
                while len(rounds) < kills:
                    if rounds and rounds[-1].get("restarted_at") is not None:
                        back = rounds[-1]["restarted_at"] + CLIENT_RECONNECT_BACKOFF_MAX_S
                        time.sleep(max(0.0, back - time.monotonic()))
                    r = _kill_round(cluster)
                    rounds.append(r)
                    log(f"  kill {len(rounds)}/{kills}: {r}")
                    try:
                        cluster.wait_isr_full(ISR_WAIT_S)
                    except RuntimeError as exc:
                        logs = _keep_logs(cluster)
                        rejoin_failures.append(
                            {"after_kill": len(rounds), "error": str(exc), "logs": str(logs)}
                        )
                        log(f"  the ISR did not fill again ({exc}); logs in {logs}")
                        break
                stop.set()
                done = expect(q, "done", 120)
            acked.extend(done["acked"])
            errors += done["errors"]
        finally:
            kept_logs.append(str(_keep_logs(cluster)))  # each round's steps can be read again
            cluster.stop()
    acked.sort()
    done = {"acked": acked, "errors": errors}
    acked = done["acked"]
    for r in rounds:
        elected = [t for t in (r["elected_s"], r.get("log_elected_s")) if t is not None]
        r["first_ack_s"] = first_ack_after(acked, r["killed_at"], min(elected, default=None))
        del r["killed_at"]
    firsts = [r["first_ack_s"] for r in rounds if r["first_ack_s"] is not None]

    def dist(key: str) -> dict[str, float] | None:
        return percentiles([r[key] for r in rounds if r.get(key) is not None])

    return {
        "kills": len(rounds),
        "session_timeout_ms": SESSION_TIMEOUT_MS,
        "zookeeper_tick_ms": ZOOKEEPER_TICK_MS,
        "rounds": rounds,
        "to_first_ack_s": percentiles(firsts),
        "to_session_expiry_s": dist("expired_s"),
        "to_election_s": dist("elected_s"),
        "to_judged_dead_s": dist("judged_dead_s"),
        "to_log_elected_s": dist("log_elected_s"),
        "to_leading_s": dist("leading_s"),
        "producer_errors": done["errors"],
        "acked": len(acked),
        "rejoin_failures": rejoin_failures,
        "logs": kept_logs,
    }


def _keep_logs(cluster: Cluster) -> Path:
    """Copy the cluster's broker logs out of the run's temp dir (removed at the end)."""
    keep = Path(tempfile.mkdtemp(prefix="stonemq-bench-failover-logs-"))
    for broker in cluster.brokers.values():
        with contextlib.suppress(OSError):
            shutil.copy(broker.log_path, keep / broker.log_path.name)
    return keep


def first_ack_after(acked: list[float], killed_at: float, elected_s: float | None) -> float | None:
    """Seconds from the kill to the first acknowledgement the new leader sent: the first one
    received after the new leader was elected (none exists before that; an answer the old
    leader sent just before the kill can arrive just after it). ``acked`` is sorted; without
    an election time, the first after the kill."""
    since = killed_at + (elected_s or 0.0)
    at = bisect.bisect_right(acked, since)
    return round(acked[at] - killed_at, 3) if at < len(acked) else None


def _since(t: float | None, start: float) -> float | None:
    return round(t - start, 3) if t is not None else None


def _controller(cluster: Cluster) -> int:
    from kazoo.client import KazooClient

    from stonemq.cluster.controller import read_controller

    zk = KazooClient(cluster.chroot)
    zk.start(10)
    try:
        return read_controller(zk)[0]
    finally:
        zk.stop()
        zk.close()


# -- the workload -------------------------------------------------------------------------


def run_replication(run: Run) -> None:
    from bench.run import log

    scale = scale_for(run)
    if not zookeeper_available():
        raise RuntimeError(f"needs ZooKeeper ({ZOOKEEPER_JAR}) and java")
    log(f"replication: 3 brokers + ZooKeeper, RF {REPLICAS} acks=all, steps {scale.steps}")
    result: dict[str, Any] = {"steps": [], "single": [], "uptime_start": _uptime()}
    run.results["replication"] = result
    zk = ZooKeeper(run.tmp / "zookeeper")
    zk.start()
    try:
        for n in scale.steps:
            cluster = Cluster(run.tmp, zk, f"rf3-{n}")
            cluster.start()
            try:
                created = create_topic(cluster.bootstrap, "scale", n, REPLICAS)
                cluster.wait_isr_full()
                for pid in cluster.pids():
                    procs.wait_quiet(pid, timeout=60)
                rows = _loads(
                    run, cluster.bootstrap, cluster.pids(), cluster.served, n, "all", scale
                )
                for r in rows:
                    r["create_s"] = round(created, 2)
                result["steps"].extend(rows)
                _log(rows, "RF3 acks=all")
            finally:
                cluster.stop()
            broker = run.broker()
            try:
                created = create_topic(broker.bootstrap, "scale", n, 1)
                procs.wait_quiet(broker.pid, timeout=60)
                rows = _loads(run, broker.bootstrap, [broker.pid], None, n, "1", scale)
                result["single"].extend(rows)
                _log(rows, "single acks=1")
            finally:
                run.done_with(broker)
        _failover(run, zk, scale)
    finally:
        zk.stop()
        shutil.rmtree(zk.root, ignore_errors=True)
        result["uptime_end"] = _uptime()
    result["targets"] = targets(result, run.results.get("replication_failover"))


def _failover(run: Run, zk: ZooKeeper, scale: Scale) -> None:
    from bench.run import log

    if not scale.kills:
        return
    log(f"replication: failover, {scale.kills} leader kills")
    started = _uptime()
    fo = run.results["replication_failover"] = failover(run, zk, scale.kills)
    fo["uptime_start"], fo["uptime_end"] = started, _uptime()
    log(f"  failover: {fo['to_first_ack_s']}")


def run_failover(run: Run) -> None:
    """Only the failover rounds (``--only replication-failover --merge``: into a report that
    has the replication steps)."""
    scale = scale_for(run)
    if not zookeeper_available():
        raise RuntimeError(f"needs ZooKeeper ({ZOOKEEPER_JAR}) and java")
    zk = ZooKeeper(run.tmp / "zookeeper")
    zk.start()
    try:
        _failover(run, zk, scale)
    finally:
        zk.stop()
        shutil.rmtree(zk.root, ignore_errors=True)


def _uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


# -- the report's section -------------------------------------------------------------------


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.3f}".rstrip("0").rstrip(".") if abs(value) < 10 else f"{value:,.1f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def table(res: dict[str, Any]) -> list[str]:
    """Markdown for ``res["replication"]``: targets, then per step and producer, then
    failover (empty when the workload did not run)."""
    rep = res.get("replication")
    if not rep:
        return []
    lines = [
        "",
        "### Replication (issue 20): 3 brokers + ZooKeeper, RF 3, acks=all, 1 KiB records",
        "",
        "| target | goal | measured | reached |",
        "|---|---:|---:|---|",
    ]
    fo = res.get("replication_failover")
    for t in targets(rep, fo):
        reached = {True: "reached", False: "not reached", None: "not measured"}[t["reached"]]
        lines.append(f"| {t['target']} | {t['goal']} | {_fmt(t['measured'])} | {reached} |")
    lines += [
        "",
        "| setup | partitions | producer | msg/s | MB/s | broker CPU s/GB (all brokers) |"
        " PSS peak per broker MB | replica fetch req/s | partitions per request | errors |",
        "|---|---:|---|---:|---:|---:|---|---:|---:|---:|",
    ]
    setups = (("RF3 acks=all", rep.get("steps", [])), ("single acks=1", rep.get("single", [])))
    for setup, rows in setups:
        for r in rows:
            pss = " / ".join(f"{p:.1f}" for p in r["pss_peak_brokers_mb"])
            lines.append(
                f"| {setup} | {r['partitions']:,} | {r['producer']} | {r['msg_s']:,.0f} | "
                f"{r['mb_s']:,.2f} | {_fmt(r['cpu_s_per_gb'])} | {pss} | "
                f"{_fmt(r.get('fetch_req_s'))} | {_fmt(r.get('partitions_per_request'))} | "
                f"{r['errors']} |"
            )
    if fo:
        lines += [
            "",
            f"Failover over {fo['kills']} leader SIGKILLs (`zookeeper.session.timeout.ms` "
            f"{fo['session_timeout_ms']}, ZooKeeper tickTime {fo['zookeeper_tick_ms']} ms), "
            f"each kill at least {CLIENT_RECONNECT_BACKOFF_MAX_S:.0f} s (librdkafka's "
            "`reconnect.backoff.max.ms`) after the previous victim is back, seconds from the "
            "kill:",
            "",
            "| interval from SIGKILL | min | median | p90 | max |",
            "|---|---:|---:|---:|---:|",
        ]
        for key, text in (
            ("to_judged_dead_s", "judged dead (connection closed, listener refused; log)"),
            ("to_log_elected_s", "new leader written by the controller (log)"),
            ("to_election_s", "no journal partition led by it in ZooKeeper (20 ms polls)"),
            ("to_leading_s", "the new leader takes appends (its log)"),
            ("to_first_ack_s", "first acknowledged produce (acks=all) on the new leader"),
            ("to_session_expiry_s", "the killed broker's registration gone (session expired)"),
        ):
            p = fo.get(key)
            if p:
                lines.append(f"| {text} | {p['min']} | {p['median']} | {p['p90']} | {p['max']} |")
        ctl = sum(1 for r in fo["rounds"] if r["was_controller"])
        lines += [
            "",
            f"{ctl} of the {fo['kills']} killed leaders {'was' if ctl == 1 else 'were'} also "
            "the controller; the producer "
            f"(librdkafka, acks=all, one record every 2 ms to partition 0) had "
            f"{fo['acked']:,} acknowledgements and {fo['producer_errors']} delivery errors.",
        ]
        failures = fo.get("rejoin_failures") or []
        if failures:
            after = ", ".join(str(f["after_kill"]) for f in failures)
            lines += [
                "",
                f"**A restarted broker did not rejoin the ISR** within {ISR_WAIT_S:.0f} s after "
                f"kills {after} (each time the next rounds ran in a fresh cluster); the first: "
                f"`{failures[0]['error'][:400]}`.",
            ]
        if fo.get("uptime_start"):
            lines += [
                "",
                f"Machine load (`uptime`) before the kills: `{fo['uptime_start']}`; after: "
                f"`{fo.get('uptime_end', '')}`.",
            ]
    if rep.get("uptime_start"):
        lines += [
            "",
            f"Machine load (`uptime`) before: `{rep['uptime_start']}`; after: "
            f"`{rep.get('uptime_end', '')}`.",
        ]
    lines.append("")
    return lines
