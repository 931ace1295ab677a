"""The bench run: every workload of issue 5 and both baselines in one run, then the report.

Owns the order of the run, the scale of each workload (``--quick`` or full), and turning raw
measurements into result rows; :mod:`bench.report` writes JSON, Markdown, charts and
``docs/benchmarks.md`` from those rows. Every process started here is stopped in ``finally``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench import (
    archive,
    baselines,
    clients,
    interference,
    multiproduce,
    procs,
    replication,
    report,
    spark_source,
)
from stonemq.config import Settings

ROOT = Path(__file__).resolve().parent.parent
SIZES = (12, 140, 560, 1120, 2940, 11760)
PARTITION_STEPS = (1, 10, 100, 1000, 10_000)
KIB = 1024
MIB = 1024 * KIB
GIB = 1024 * MIB


@dataclass(frozen=True)
class Scale:
    """How big each workload is."""

    name: str
    produce_s: float  # per produce configuration
    produce_max: int  # payload bytes cap per configuration
    scaling_s: float
    consume_bytes: int
    latency_s: float
    idle_partitions: int
    recovery_bytes: int
    ceiling_s: float
    profile_s: int


# never reached: a full run's produce steps run for their duration (a byte cap ended the
# fast steps after a second or two, a burst the journal absorbs while the splitter lags)
UNCAPPED_BYTES = 64 * GIB

QUICK = Scale("quick", 1.0, 24 * MIB, 1.5, 24 * MIB, 3.0, 10_000, 64 * MIB, 1.0, 2)
FULL = Scale("full", 5.0, UNCAPPED_BYTES, 12.0, 512 * MIB, 20.0, 100_000, GIB, 5.0, 8)

_CTX = mp.get_context("spawn")


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# -- running a worker process under measurement --------------------------------------------


@contextlib.contextmanager
def worker(target: Callable[..., None], *args: Any) -> Iterator[Any]:
    """Start ``target(q, *args)`` in a spawned process; yields its queue; always reaped."""
    q: Any = _CTX.Queue()
    proc = _CTX.Process(target=target, args=(q, *args), daemon=True)
    proc.start()
    try:
        yield q
    finally:
        proc.join(10)
        if proc.is_alive():
            proc.kill()
            proc.join(5)


def expect(q: Any, kind: str, timeout: float) -> Any:
    """The next message of ``kind`` from a worker (an error message raises)."""
    try:
        got, value = q.get(timeout=timeout)
    except queue.Empty:
        raise RuntimeError(f"worker sent no {kind!r} within {timeout:.0f} s") from None
    if got == "error":
        raise RuntimeError(f"worker failed:\n{value}")
    if got != kind:
        raise RuntimeError(f"worker sent {got!r}, expected {kind!r}")
    return value


def measured(
    pid: int, target: Callable[..., None], *args: Any, timeout: float = 600.0
) -> tuple[dict[str, Any], procs.Monitor]:
    """Run a worker; measure ``pid``'s tree from the worker's start to its result."""
    with worker(target, *args) as q:
        expect(q, "start", 120)
        with procs.Monitor(pid) as monitor:
            result = expect(q, "done", timeout)
    return result, monitor


def produce(
    broker: procs.Broker,
    topic: str,
    size: int,
    seconds: float,
    max_bytes: int,
    keys: int,
    acks: str = "1",
) -> tuple[dict[str, Any], procs.Monitor]:
    """One producer process into ``topic`` (see ``clients.produce``), measured on the broker."""
    conf = clients.producer_conf(broker.bootstrap, acks)
    return measured(
        broker.pid, clients.entry, "produce", conf, topic, size, seconds, max_bytes, keys
    )


def row(result: dict[str, Any], monitor: procs.Monitor | None, **extra: Any) -> dict[str, Any]:
    seconds = max(result["seconds"], 1e-9)
    out: dict[str, Any] = dict(extra)
    out.update(
        msgs=result["msgs"],
        bytes=result["bytes"],
        seconds=round(seconds, 3),
        msg_s=round(result["msgs"] / seconds, 1),
        mb_s=round(result["bytes"] / seconds / 1e6, 2),
        errors=result.get("errors", 0),
    )
    if "client_cpu_s" in result:
        out["client_cpu_s"] = result["client_cpu_s"]
    if monitor is not None:
        out.update(monitor.summary(result["bytes"]))
    return out


# -- the broker ----------------------------------------------------------------------------


def create_topics(bootstrap: str, topics: dict[str, int], timeout: float = 300.0) -> float:
    """Create ``topics`` (name: partitions); returns seconds taken."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap, "socket.timeout.ms": 300_000})
    started = time.monotonic()
    new = [NewTopic(t, num_partitions=n, replication_factor=1) for t, n in topics.items()]
    for topic, future in admin.create_topics(
        new, operation_timeout=timeout, request_timeout=timeout
    ).items():
        try:
            future.result(timeout)
        except Exception as exc:
            raise RuntimeError(f"create topic {topic}: {exc}") from exc
    return time.monotonic() - started


class Run:
    """One bench run: a temp dir for every broker and baseline, results collected here."""

    def __init__(self, scale: Scale, out: Path) -> None:
        self.scale = scale
        self.out = out
        self.tmp = Path(tempfile.mkdtemp(prefix="stonemq-bench-"))
        self.results: dict[str, Any] = {"scale": asdict(scale)}
        self._brokers = 0

    def broker(self, **settings: Any) -> procs.Broker:
        self._brokers += 1
        broker = procs.Broker(self.tmp / f"broker{self._brokers}", settings)
        broker.start()
        return broker

    def done_with(self, broker: procs.Broker) -> None:
        broker.stop()
        shutil.rmtree(broker.data_dir, ignore_errors=True)

    # -- workloads ---------------------------------------------------------------------------
    def ceiling(self) -> None:
        log("baseline (a): bare uvloop ingest of 1 MiB frames")
        self.results["ceiling"] = self._ceiling(-1)
        log(f"  ceiling {self.results['ceiling']['mb_s']} MB/s")
        # (a') the same server keeping StoneMQ's default page-cache window of what it wrote;
        # after a pause, so the pages (a) freed are back with the host as (a) found them
        time.sleep(5)
        retain = Settings.model_fields["queue_cache_retain_bytes"].default
        self.results["ceiling_retain"] = {**self._ceiling(retain), "retain_bytes": retain}
        log(
            f"  ceiling, {retain >> 20} MiB page-cache window: "
            f"{self.results['ceiling_retain']['mb_s']} MB/s"
        )

    def _ceiling(self, retain_bytes: int) -> dict[str, Any]:
        server = baselines.CeilingServer(self.tmp / f"ceiling{retain_bytes}", retain_bytes)
        server.start()
        try:
            assert server.proc is not None
            result, mon = measured(
                server.proc.pid,
                baselines.ceiling_client,
                server.port,
                self.scale.ceiling_s * 1.5,
                8 * GIB,
            )
        finally:
            server.stop()
        return row(result, mon, frame_bytes=baselines.FRAME)

    def redis(self) -> None:
        log("baseline (b): Redis Streams, pipelined XADD and XREAD")
        server = baselines.Redis(self.tmp / "redis")
        server.start()
        assert server.proc is not None
        rows = []
        try:
            for size in SIZES:
                key = f"produce-{size}"
                result, mon = measured(
                    server.proc.pid,
                    baselines.redis_produce,
                    server.port,
                    key,
                    size,
                    self.scale.produce_s,
                    self.scale.produce_max,
                )
                rows.append(row(result, mon, size=size))
                log(f"  XADD {size} B: {rows[-1]['msg_s']:.0f} msg/s {rows[-1]['mb_s']} MB/s")
                server.delete(key)
            key = "consume"
            n = self.scale.consume_bytes // KIB
            produced, _ = measured(
                server.proc.pid,
                baselines.redis_produce,
                server.port,
                key,
                KIB,
                3600.0,
                n * KIB,
            )
            result, mon = measured(
                server.proc.pid,
                baselines.redis_consume,
                server.port,
                key,
                produced["msgs"],
                600.0,
            )
            self.results["redis_consume"] = row(result, mon, size=KIB)
            self.results["redis_consume"]["produce_mb_s"] = row(produced, None)["mb_s"]
            log(f"  XREAD: {self.results['redis_consume']['mb_s']} MB/s")
        finally:
            server.stop()
            shutil.rmtree(server.workdir, ignore_errors=True)
        self.results["redis_produce"] = rows

    def produce_by_size(self, policy: str) -> None:
        log(f"produce by record size, journal.flush.policy={policy}")
        broker = self.broker(**{"journal.flush.policy": policy})
        rows = self.results.setdefault("produce", [])
        try:
            topics = {f"p-{policy}-{acks}-{size}": 4 for size in SIZES for acks in ("1", "all")}
            create_topics(broker.bootstrap, topics)
            for size in SIZES:
                for acks in ("1", "all"):
                    topic = f"p-{policy}-{acks}-{size}"
                    result, mon = produce(
                        broker, topic, size, self.scale.produce_s, self.scale.produce_max, 0, acks
                    )
                    r = row(result, mon, size=size, acks=acks, policy=policy)
                    rows.append(r)
                    log(
                        f"  {size:>5} B acks={acks:<3}: {r['msg_s']:>9.0f} msg/s "
                        f"{r['mb_s']:>7.2f} MB/s  cpu {r['cpu_s_per_gb']} s/GB "
                        f"pss {r['pss_peak_mb']} MB"
                    )
                    procs.wait_quiet(broker.pid, timeout=60)
            if policy == "interval":
                self.profile(broker)
        finally:
            self.done_with(broker)

    def profile(self, broker: procs.Broker) -> None:
        """py-spy against the broker during a repeat of the 1,120 B acks=1 produce workload
        (a separate run, so sampling does not disturb the measured one)."""
        pyspy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        if not os.path.exists(pyspy):
            self.results["profile"] = {"error": "py-spy not installed"}
            return
        log("profile: py-spy on the broker during 1,120 B acks=1 produce")
        raw = self.out / "profile-produce-1120.txt"
        duration = self.scale.profile_s
        topic = "p-interval-1-1120"
        conf = clients.producer_conf(broker.bootstrap, "1")
        with worker(clients.entry, "produce", conf, topic, 1120, duration + 2.0, 64 * GIB, 0) as q:
            expect(q, "start", 120)
            spy = subprocess.run(
                [
                    pyspy,
                    "record",
                    "--pid",
                    str(broker.pid),
                    "--duration",
                    str(duration),
                    "--rate",
                    "200",
                    "--format",
                    "raw",
                    "--output",
                    str(raw),
                    "--nonblocking",
                    "--subprocesses",
                ],
                capture_output=True,
                text=True,
                timeout=duration + 60,
                check=False,
            )
            result = expect(q, "done", 600)
        procs.wait_quiet(broker.pid, timeout=60)
        summary = report.summarize_profile(raw, rate=200, duration=duration)
        summary["returncode"] = spy.returncode
        summary["stderr_tail"] = spy.stderr[-500:]
        summary["workload"] = row(result, None, size=1120, acks="1", policy="interval")
        self.results["profile"] = summary

    def client_profile(self, broker: procs.Broker, partitions: int) -> None:
        """perf (cpu-clock samples) on the librdkafka producer during a repeat of the
        ``partitions`` scaling step: where the client's CPU goes when the client, not the
        broker, is what grows with the partitions."""
        perf = shutil.which("perf")
        if perf is None:
            self.results["client_profile"] = {"error": "perf not installed"}
            return
        log(f"profile: perf on the producer during the {partitions:,}-partition step")
        duration = self.scale.profile_s
        raw = self.tmp / "perf-client.data"
        conf = clients.producer_conf(broker.bootstrap, "1")
        keys = max(4 * partitions, 1000)
        args = ("produce", conf, "scale", KIB, duration + 2.0, 64 * GIB, keys)
        with worker(clients.entry, *args) as q:
            pid = expect(q, "start", 120)
            record = [perf, "record", "-e", "cpu-clock", "-F", "499", "-g", "-p", str(pid)]
            rec = subprocess.run(
                [*record, "-o", str(raw), "--", "sleep", str(duration)],
                capture_output=True,
                text=True,
                timeout=duration + 60,
                check=False,
            )
            result = expect(q, "done", 600)
        summary: dict[str, Any] = {"partitions": partitions, "returncode": rec.returncode}
        if rec.returncode != 0 or not raw.exists():
            summary["error"] = (rec.stderr or "perf record failed")[-500:]
        else:
            show = [perf, "report", "-i", str(raw), "--stdio", "--no-children", "-g", "none"]
            rep = subprocess.run(
                [*show, "--sort", "dso,symbol", "--percent-limit", "0.3"],
                capture_output=True,
                text=True,
                timeout=300,
                check=False,
            )
            summary.update(report.summarize_perf(rep.stdout))
        summary["workload"] = row(result, None, partitions=partitions)
        self.results["client_profile"] = summary

    def scaling(self) -> None:
        log("partition scaling: 1 KiB keyed load, StoneMQ then the storage-free broker")
        rows, free_rows, multi_rows = [], [], []
        for n in PARTITION_STEPS:
            broker = self.broker()
            try:
                r = self._scaling_step(broker, n)
                rows.append(r)
                procs.wait_quiet(broker.pid, timeout=60)
                m = self._multi_step(broker, n)
                multi_rows.append(m)
                log(
                    f"  {n:>6} partitions, multi-partition requests: {m['msg_s']:>8.0f} msg/s "
                    f"{m['mb_s']:>6.2f} MB/s, broker {m['cpu_us_per_batch']} µs/batch"
                )
                log(
                    f"  {n:>6} partitions: {r['msg_s']:>8.0f} msg/s {r['mb_s']:>6.2f} MB/s "
                    f"pss peak {r['pss_peak_mb']} MB steady {r['pss_steady_mb']} MB"
                )
                if n == PARTITION_STEPS[-1]:
                    procs.wait_quiet(broker.pid, timeout=60)
                    self.client_profile(broker, n)
            finally:
                self.done_with(broker)
            self._brokers += 1
            sink = baselines.StorageFreeBroker(self.tmp / f"broker{self._brokers}")
            sink.start()
            try:
                r = self._scaling_step(sink, n)
                free_rows.append(r)
                log(f"  {n:>6} partitions, storage-free: {r['mb_s']:>6.2f} MB/s")
            finally:
                self.done_with(sink)
        self.results["scaling"] = rows
        self.results["scaling_storage_free"] = free_rows
        self.results["scaling_multi"] = multi_rows

    def _multi_step(self, broker: procs.Broker, n: int) -> dict[str, Any]:
        """The multi-partition generator on the step's topic, for the step's time."""
        result, mon = measured(
            broker.pid,
            multiproduce.entry,
            "multi_produce",
            broker.port,
            "scale",
            n,
            KIB,
            self.scale.scaling_s,
            self.scale.produce_max,
        )
        r = row(result, mon, partitions=n)
        r.update(
            batches=result["batches"],
            partitions_per_request=result["partitions_per_request"],
            records_per_batch=result["records_per_batch"],
            cpu_us_per_batch=round(mon.cpu / max(result["batches"], 1) * 1e6, 1),
        )
        return r

    def _scaling_step(self, broker: procs.Broker, n: int) -> dict[str, Any]:
        """One topic of ``n`` partitions, then the 1 KiB keyed load for the step's time."""
        created = create_topics(broker.bootstrap, {"scale": n})
        keys = max(4 * n, 1000)
        result, mon = produce(
            broker, "scale", KIB, self.scale.scaling_s, self.scale.produce_max, keys
        )
        r = row(result, mon, partitions=n, create_s=round(created, 2))
        r["open_files"] = procs.open_files(broker.pid)
        return r

    def consume(self) -> None:
        log("consume catch-up from offset 0")
        broker = self.broker()
        try:
            create_topics(broker.bootstrap, {"catchup": 4})
            produced, _ = produce(broker, "catchup", KIB, 3600.0, self.scale.consume_bytes, 0)
            broker.stop()  # clean stop: everything split; then a cold start
            dropped = drop_caches()
            broker.start()
            result, mon = measured(
                broker.pid,
                clients.entry,
                "consume",
                broker.bootstrap,
                "catchup",
                4,
                produced["msgs"],
                600.0,
            )
            r = row(result, mon, size=KIB, cache_dropped=dropped)
            r["produce_msg_s"] = row(produced, None)["msg_s"]
            r["produce_mb_s"] = row(produced, None)["mb_s"]
            r["expected"] = produced["msgs"]
            self.results["consume"] = r
            log(
                f"  consume {r['msg_s']:.0f} msg/s {r['mb_s']} MB/s (produce {r['produce_mb_s']}"
                f" MB/s), cache dropped: {dropped}"
            )
        finally:
            self.done_with(broker)

    def latency(self) -> None:
        rate = 5000
        log(f"end-to-end latency at {rate} msg/s of 1 KiB")
        broker = self.broker()
        try:
            create_topics(broker.bootstrap, {"latency": 4})
            total = int(rate * self.scale.latency_s)
            with worker(
                clients.entry,
                "latency_consumer",
                broker.bootstrap,
                "latency",
                4,
                total,
                self.scale.latency_s + 60,
            ) as cq:
                expect(cq, "start", 120)
                produced, mon = measured(
                    broker.pid,
                    clients.entry,
                    "paced_producer",
                    broker.bootstrap,
                    "latency",
                    rate,
                    self.scale.latency_s,
                    KIB,
                )
                lat = expect(cq, "done", self.scale.latency_s + 120)["latencies_ns"]
        finally:
            self.done_with(broker)
        warmup = min(len(lat) // 10, rate // 2)  # the first 0.5 s: connections warming up
        ms = sorted(x / 1e6 for x in lat[warmup:])

        def pct(p: float) -> float:
            return round(ms[min(len(ms) - 1, int(p / 100 * len(ms)))], 3) if ms else float("nan")

        self.results["latency"] = {
            "rate": rate,
            "size": KIB,
            "sent": produced["msgs"],
            "received": len(lat),
            "warmup_dropped": warmup,
            "achieved_msg_s": round(produced["msgs"] / produced["seconds"], 1),
            "p50_ms": pct(50),
            "p99_ms": pct(99),
            "p999_ms": pct(99.9),
            "max_ms": round(ms[-1], 3) if ms else float("nan"),
            **mon.summary(produced["bytes"]),
        }
        log(f"  p50 {pct(50)} ms p99 {pct(99)} ms p99.9 {pct(99.9)} ms")

    def idle(self) -> None:
        n = self.scale.idle_partitions
        log(f"idle cost: {n} partitions created and written once")
        broker = self.broker()
        try:
            per_topic = min(n, 10_000)
            topics = {f"idle-{i}": per_topic for i in range(n // per_topic)}
            before = procs.pss_bytes(broker.pid)
            created = create_topics(broker.bootstrap, topics, timeout=600)
            result, mon = measured(
                broker.pid,
                clients.entry,
                "produce_each_partition",
                broker.bootstrap,
                list(topics.items()),
                100,
            )
            quiet = procs.wait_quiet(broker.pid, timeout=120)
            time.sleep(2)
            samples = []
            for _ in range(5):
                samples.append(procs.pss_bytes(broker.pid))
                time.sleep(0.5)
            self.results["idle"] = {
                "partitions": sum(topics.values()),
                "topics": len(topics),
                "create_s": round(created, 2),
                "write_s": round(result["seconds"], 2),
                "written": result["msgs"],
                "errors": result["errors"],
                "error_kinds": result.get("error_kinds", {}),
                "settle_s": round(quiet, 1),
                "pss_empty_mb": round(before / 1e6, 1),
                "pss_peak_write_mb": round(mon.peak / 1e6, 1),
                "pss_idle_mb": round(sorted(samples)[len(samples) // 2] / 1e6, 1),
                "open_files": procs.open_files(broker.pid),
                "queue_dirs": sum(1 for _ in (broker.data_dir / "queues").iterdir())
                if (broker.data_dir / "queues").is_dir()
                else 0,
            }
            log(f"  {self.results['idle']}")
        finally:
            self.done_with(broker)

    def recovery(self) -> None:
        target = self.scale.recovery_bytes
        log(f"recovery: SIGKILL after {target >> 20} MiB, time to ready")
        # Queue-log checkpoints only on the hour: nothing the splitter does in memory is
        # recorded, so the whole journal is unsplit as far as recovery is concerned.
        broker = self.broker(**{"queue.checkpoint.interval.ms": 3_600_000})
        try:
            create_topics(broker.bootstrap, {"recover": 8})
            produced, _ = produce(broker, "recover", 11_760, 3600.0, target, 0)
            broker.kill()
            state = journal_state(broker.data_dir)
            dropped = drop_caches()
            ready_s = broker.start(timeout=600)
            m = re.search(
                rb"storage recovered in ([\d.]+) s: (\d+) journal bytes re-split", broker.log()
            )
            self.results["recovery"] = {
                "written_bytes": produced["bytes"],
                **state,
                "cache_dropped": dropped,
                "ready_s": round(ready_s, 3),
                "broker_recover_s": float(m.group(1)) if m else None,
                "broker_resplit_bytes": int(m.group(2)) if m else None,
            }
            log(f"  {self.results['recovery']}")
        finally:
            self.done_with(broker)


def journal_state(data_dir: Path) -> dict[str, Any]:
    """Journal end versus the split positions of the checkpoint, per journal partition."""
    jdir = data_dir / "journal"
    split: dict[int, int] = {}
    ckpt = jdir / "split-position-checkpoint"
    if ckpt.exists():
        lines = ckpt.read_text().split("\n")
        for line in lines[2 : 2 + int(lines[1])]:
            j, pos = line.split()
            split[int(j)] = int(pos)
    total_end = 0
    unsplit = 0
    for d in sorted(jdir.glob("journal-*")):
        if not d.is_dir() or not d.name.split("-", 1)[1].isdigit():
            continue  # e.g. journal-recovery-point-checkpoint
        j = int(d.name.split("-", 1)[1])
        segs = sorted(d.glob("*.journal"))
        if not segs:
            continue
        start = int(segs[0].stem)
        end = int(segs[-1].stem) + segs[-1].stat().st_size
        total_end += end - start
        unsplit += end - max(split.get(j, start), start)
    return {
        "journal_bytes": total_end,
        "unsplit_bytes": unsplit,
        "split_checkpoint_found": ckpt.exists(),
    }


def drop_caches() -> bool:
    """``sync; echo 3 > /proc/sys/vm/drop_caches``; False when not permitted."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as fh:
            fh.write("3\n")
        return True
    except OSError:
        return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="every workload, small scale")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks")
    parser.add_argument(
        "--report-only", action="store_true", help="rewrite the report from OUT/results.json"
    )
    parser.add_argument(
        "--only", default="", help="comma-separated workloads (development): " + ",".join(WORKLOADS)
    )
    parser.add_argument(
        "--merge",
        action="store_true",
        help="keep OUT/results.json's other workloads and replace only those run now "
        "(with --only: add one workload's figures to a full run's report)",
    )
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.report_only:
        report.write(json.loads((args.out / "results.json").read_text()), args.out)
        return 0

    def on_term(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_term)
    scale = QUICK if args.quick else FULL
    run = Run(scale, args.out)
    started = time.time()
    machine = report.machine(run.tmp)
    chosen = [w for w in args.only.split(",") if w] or [w for w in WORKLOADS if w not in ON_REQUEST]
    try:
        for name in chosen:
            try:
                WORKLOADS[name](run)
            except Exception:
                # one broken workload must not cost the others: recorded, reported, exit 1
                log(f"workload {name} FAILED:\n{traceback.format_exc()}")
                run.results.setdefault("failed", {})[name] = traceback.format_exc()[-2000:]
            procs.stop_all()
    except KeyboardInterrupt:
        log("interrupted: stopping every process")
        return 130
    finally:
        procs.stop_all()
        shutil.rmtree(run.tmp, ignore_errors=True)
    run.results["machine"] = machine
    run.results["run"] = {
        "started": time.strftime("%Y-%m-%d %H:%M:%S %z", time.localtime(started)),
        "seconds": round(time.time() - started, 1),
        "command": report.command(args.quick),
        "workloads": chosen,
        "loadavg_end": os.getloadavg(),
    }
    results_path = args.out / "results.json"
    if args.merge and results_path.exists():
        merged = json.loads(results_path.read_text())
        merged.setdefault("merged_runs", []).append(run.results["run"])
        merged.update({k: v for k, v in run.results.items() if k not in ("run", "scale")})
        run.results = merged
    results_path.write_text(json.dumps(run.results, indent=2) + "\n")
    report.write(run.results, args.out)
    log(f"done in {run.results['run']['seconds']} s; report in {args.out}")
    return 1 if run.results.get("failed") else 0


WORKLOADS: dict[str, Callable[[Run], None]] = {
    "ceiling": Run.ceiling,
    "redis": Run.redis,
    "produce-interval": lambda r: r.produce_by_size("interval"),
    "produce-always": lambda r: r.produce_by_size("always"),
    "scaling": Run.scaling,
    "consume": Run.consume,
    "latency": Run.latency,
    "idle": Run.idle,
    "recovery": Run.recovery,
    "archive": archive.run_archive,
    "interference": interference.run_interference,
    "spark-source": spark_source.run_spark_source,
    "replication": replication.run_replication,
    "replication-failover": replication.run_failover,
}
ON_REQUEST = frozenset({"replication-failover"})
"""Workloads only ``--only`` runs (the replication workload includes the failover rounds)."""
