"""The bench report: machine facts, py-spy summary, targets, Markdown, charts, JSON.

Owns everything written to ``docs/benchmarks/`` besides ``results.json`` (written by
:mod:`bench.run`) and ``docs/benchmarks.md``. Every figure comes from the results of the run;
the issue's targets are the only constants here.
"""

from __future__ import annotations

import collections
import contextlib
import importlib.metadata
import os
import platform
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def command(quick: bool) -> str:
    return "./scripts/bench.sh" + (" --quick" if quick else "")


def _run(cmd: list[str]) -> str:
    with contextlib.suppress(Exception):
        return subprocess.run(cmd, capture_output=True, text=True, timeout=10).stdout.strip()
    return ""


def machine(workdir: Path) -> dict[str, Any]:
    """What the run ran on, gathered now."""
    import psutil

    mem = f"{psutil.virtual_memory().total / 2**30:.1f} GiB"
    cpu = ""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as fh:
        for line in fh:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    source = _run(["df", "--output=source", str(workdir)]).splitlines()[-1:]
    device = source[0] if source else ""
    disk = _run(["lsblk", "-ndPo", "SIZE,ROTA,MODEL", device]) if device else ""
    versions = {}
    for dist in ("confluent-kafka", "redis", "uvloop", "matplotlib", "psutil", "py-spy", "kio"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            versions[dist] = importlib.metadata.version(dist)
    with contextlib.suppress(Exception):
        import confluent_kafka

        versions["librdkafka"] = confluent_kafka.libversion()[0]
    versions["redis-server"] = _run(["redis-server", "--version"])
    return {
        "nproc": os.cpu_count(),
        "physical_cores": psutil.cpu_count(logical=False),
        "cpu": cpu,
        "memory": mem,
        "kernel": platform.release(),
        "os": _run(["sh", "-c", ". /etc/os-release && echo $PRETTY_NAME"]),
        "disk": f"{device} {disk}".strip(),
        "python": sys.version.split()[0],
        "versions": versions,
        "stonemq_commit": _run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"]),
        "loadavg_start": os.getloadavg(),
    }


# -- profile --------------------------------------------------------------------------------
_PERF_LINE = re.compile(r"^\s*([\d.]+)%\s+(\S+)\s+\[(.)\]\s+(.+?)\s*$")


def summarize_perf(text: str) -> dict[str, Any]:
    """Top symbols and the share per library of ``perf report --stdio --sort dso,symbol``."""
    rows = []
    for line in text.splitlines():
        m = _PERF_LINE.match(line)
        if m:
            share, dso, _kind, symbol = m.groups()
            symbol = symbol.split("  ")[0].strip()  # perf pads with empty IPC columns
            dso = re.sub(r"-[0-9a-f]{8}(?=\.so)", "", dso)  # wheels' hashed library names
            rows.append((round(float(share), 1), dso, symbol))
    by_dso: collections.Counter[str] = collections.Counter()
    for share, dso, _ in rows:
        by_dso[dso] += share
    return {
        "top_symbols": rows[:15],
        "by_library": [(d, round(p, 1)) for d, p in by_dso.most_common(8)],
    }


def client_profile_text(prof: dict[str, Any] | None) -> str:
    if not prof:
        return ""
    if prof.get("error") or not prof.get("top_symbols"):
        return f"No client profile in this run ({(prof or {}).get('error', 'no samples')})."
    w = prof["workload"]
    libs = ", ".join(f"{d} {p}%" for d, p in prof["by_library"])
    top = "\n".join(f"| {sym} | {dso} | {p}% |" for p, dso, sym in prof["top_symbols"])
    return (
        f"perf sampled the librdkafka producer process (cpu-clock, 499 Hz, all threads) during "
        f"a repeat of the {prof['partitions']:,}-partition scaling step ({w['msg_s']:,.0f} "
        f"msg/s, {w['mb_s']} MB/s while sampled). By library: {libs}.\n\n"
        "| symbol | library | share of samples |\n|---|---|---:|\n"
        f"{top}"
    )


def _stonemq_files() -> list[str]:
    return sorted(str(f.relative_to(ROOT)) for f in (ROOT / "stonemq").rglob("*.py"))


def _short(frame: str, files: list[str]) -> str:
    """``func (path:line)`` -> ``func (stonemq/x/y.py)``; py-spy shortens some paths to a
    suffix (``journal.py``), resolved here against the StoneMQ source tree when unique."""
    name, _, where = frame.partition(" (")
    path = where.rstrip(")").rsplit(":", 1)[0]
    for marker in ("/stonemq/", "/site-packages/", "/lib/python3"):
        if marker in path:
            path = path.split(marker, 1)[1]
            path = "stonemq/" + path if marker == "/stonemq/" else path
            break
    if not path.startswith("stonemq/"):
        matches = [f for f in files if f.endswith("/" + path)]
        if len(matches) == 1:
            path = matches[0]
    return f"{name} ({path})" if path else name


def _area(short: str) -> str:
    if "(stonemq/" in short:
        rest = short.split("(stonemq/", 1)[1].rstrip(")")
        return "stonemq/" + (rest.split("/")[0] if "/" in rest else rest)
    return "outside StoneMQ"


def summarize_profile(raw: Path, rate: int, duration: float) -> dict[str, Any]:
    """Top self and inclusive frames, and the share by StoneMQ package, of py-spy raw output
    (``frame;frame;... count`` per line, root first)."""
    self_counts: collections.Counter[str] = collections.Counter()
    incl: collections.Counter[str] = collections.Counter()
    areas: collections.Counter[str] = collections.Counter()
    loop_thread = 0
    total = 0
    files = _stonemq_files()
    with contextlib.suppress(OSError), raw.open() as fh:
        for line in fh:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            if not stack or not count.isdigit():
                continue
            n = int(count)
            frames = [f for f in stack.split(";") if f and not f.startswith("process ")]
            frames = [f for f in frames if not f.startswith("thread ")]
            if not frames:
                continue
            total += n
            short = [_short(f, files) for f in frames]
            if any("(asyncio/runners.py)" in f or "(uvloop/" in f for f in short):
                loop_thread += n
            self_counts[short[-1]] += n
            for f in set(short):
                incl[f] += n
            # the innermost StoneMQ frame below the CLI decides the area
            inner = next(
                (
                    f
                    for f in reversed(short)
                    if "(stonemq/" in f and "(stonemq/cli" not in f and "(stonemq/__main__" not in f
                ),
                short[-1],
            )
            areas[_area(inner)] += n
    possible = rate * duration
    return {
        "file": raw.name,
        "samples": total,
        "loop_thread_samples": loop_thread,
        "busy_fraction": round(total / possible, 3) if possible else None,
        "top_self": [(f, round(100 * c / total, 1)) for f, c in self_counts.most_common(12)]
        if total
        else [],
        "top_inclusive": [
            (f, round(100 * c / total, 1))
            for f, c in incl.most_common()
            if "(stonemq/" in f and "(stonemq/cli" not in f and "(stonemq/__main__" not in f
        ][:15],
        "areas": [(a, round(100 * c / total, 1)) for a, c in areas.most_common()] if total else [],
    }


# -- targets ----------------------------------------------------------------------------------


def _find(rows: list[dict[str, Any]], **match: Any) -> dict[str, Any] | None:
    return next((r for r in rows if all(r.get(k) == v for k, v in match.items())), None)


def _shown(measured: float, goal: float) -> float:
    """``measured`` as the report shows it: three decimals, unless those round it onto the
    goal (0.3996 against ≥ 0.4), when six show which side of it it is."""
    shown = round(measured, 3)
    return round(measured, 6) if shown == goal and measured != goal else shown


def targets(res: dict[str, Any]) -> list[dict[str, Any]]:
    """Every issue's targets next to this run's figures: the first benchmark issue's (5), then
    those of the later issues whose workloads ran (17, 20, 21, 22); a target whose workload did
    not run, or ran without the step it needs (a quick run), is "not measured"."""
    out: list[dict[str, Any]] = []
    issue = 5

    def add(
        name: str,
        measured: float | None,
        goal: float,
        higher: bool,
        detail: str,
        reached: bool | None = None,
    ) -> None:
        """One target, judged on ``measured`` exactly (or ``reached`` when the workload judged
        it); the report shows ``measured`` rounded to three decimals."""
        if reached is None and measured is not None:
            reached = measured >= goal if higher else measured <= goal
        out.append(
            {
                "issue": issue,
                "target": name,
                # three decimals, or more where three would show the goal itself
                "measured": None if measured is None else _shown(measured, goal),
                "goal": goal,
                "higher": higher,
                "reached": reached,
                "detail": detail,
            }
        )

    def ratio(
        name: str,
        top: dict[str, Any] | None,
        bottom: dict[str, Any] | None,
        key: str,
        goal: float,
        higher: bool,
        unit: str,
        more: str = "",
    ) -> None:
        """A target that is ``top[key] / bottom[key]``; "not measured" when either is missing."""
        if top is None or bottom is None:
            add(name, None, goal, higher, "missing")
            return
        a, b = top[key], bottom[key]
        shown = f"{a:.0f} / {b:.0f}" if unit == "msg/s" else f"{a} / {b}"
        add(name, a / b, goal, higher, f"{shown} {unit}{more}")

    produce = res.get("produce", [])
    p = _find(produce, size=1120, acks="1", policy="interval")
    windowed = res.get("ceiling_retain")
    ratio(
        "1,120 B acks=1 interval: MB/s ÷ bare ingest ceiling",
        p,
        res.get("ceiling"),
        "mb_s",
        0.5,
        True,
        "MB/s",
        f"; against the same server keeping a {windowed['retain_bytes'] >> 20} MiB "
        f"page-cache window (a'): {p['mb_s'] / windowed['mb_s']:.2f} "
        f"({p['mb_s']} / {windowed['mb_s']} MB/s)"
        if p and windowed
        else "",
    )
    ratio(
        "1,120 B acks=1 interval: msg/s ÷ Redis Streams XADD msg/s",
        p,
        _find(res.get("redis_produce", []), size=1120),
        "msg_s",
        2.0,
        True,
        "msg/s",
    )
    scaling = res.get("scaling", [])
    s1, s10k = _find(scaling, partitions=1), _find(scaling, partitions=10_000)
    free = res.get("scaling_storage_free", [])
    f1, f10k = _find(free, partitions=1), _find(free, partitions=10_000)
    ratio(
        "throughput at 10,000 partitions ÷ at 1 partition",
        s10k,
        s1,
        "msg_s",
        0.9,
        True,
        "msg/s",
        f"; the same producer against the storage-free broker (c): "
        f"{f10k['msg_s'] / f1['msg_s']:.2f} ({f10k['mb_s']} / {f1['mb_s']} MB/s)"
        if f1 and f10k
        else "",
    )
    s1k = _find(scaling, partitions=1000)
    add(
        "broker PSS (peak) with 1,000 partitions under load, MB",
        s1k["pss_peak_mb"] if s1k else None,
        60,
        False,
        f"steady {s1k['pss_steady_mb']} MB" if s1k else "missing",
    )
    idle = res.get("idle")
    if idle:
        complete = idle["written"] >= idle["partitions"]
        detail = (
            f"{idle['open_files']} open files; {idle['written']:,} of "
            f"{idle['partitions']:,} partitions written"
        )
        if not complete:
            detail += (
                f" (the rest failed: {idle.get('error_kinds')}), so not the workload asked for"
            )
        add(
            f"broker PSS idle with {idle['partitions']:,} partitions, MB",
            idle["pss_idle_mb"] if complete else None,
            200,
            False,
            detail,
        )
        if not complete:
            out[-1]["measured"] = idle["pss_idle_mb"]
    else:
        add("broker PSS idle with 100,000 partitions, MB", None, 200, False, "missing")
    c = res.get("consume")
    add(
        "consume MB/s ÷ produce MB/s (1 KiB, catch-up from 0)",
        c["mb_s"] / c["produce_mb_s"] if c else None,
        1.0,
        True,
        f"{c['mb_s']} / {c['produce_mb_s']} MB/s" if c else "missing",
    )
    lat = res.get("latency")
    add(
        "end-to-end p99 at 5,000 msg/s of 1 KiB, ms",
        lat["p99_ms"] if lat else None,
        20,
        False,
        f"p50 {lat['p50_ms']} ms, p99.9 {lat['p999_ms']} ms" if lat else "missing",
    )
    rec = res.get("recovery")
    add(
        f"time to ready after SIGKILL with {rec['unsplit_bytes'] / 2**30:.2f} GiB unsplit, s"
        if rec
        else "time to ready after SIGKILL with 1 GiB unsplit, s",
        rec["ready_s"] if rec else None,
        10,
        False,
        f"{rec['broker_resplit_bytes']} bytes re-split" if rec else "missing",
    )

    issue = 17
    it = res.get("interference")
    if it:
        alone, together = it["alone"], it["together"]
        add(
            "interference: producer p99 together ÷ alone",
            together["producer"]["p99_ms"] / max(alone["producer"]["p99_ms"], 1e-9),
            2.0,
            False,
            f"{together['producer']['p99_ms']} / {alone['producer']['p99_ms']} ms",
        )
        add(
            "interference: ApiVersions p99 together, ms",
            together["api_versions"]["p99_ms"],
            50,
            False,
            f"alone {alone['api_versions']['p99_ms']} ms",
        )

    issue = 20
    rep = res.get("replication")
    if rep:
        from bench import replication

        for t in replication.targets(rep, res.get("replication_failover")):
            goal = float(t["goal"].split()[-1])
            add(
                t["target"],
                t["measured"],
                goal,
                t["goal"].startswith("≥"),
                t["detail"],
                reached=t["reached"],  # judged there on the exact ratio
            )

    issue = 21
    spark = res.get("spark_source")
    if spark:
        from bench import archive, spark_source

        b, st = spark["batch"], spark["stream"]
        fed = st["produced"] * archive.RECORD_BYTES / st["seconds"] / 1e6
        add(
            "Spark batch read, half archived: MB/s ÷ one consumer's",
            b["spark_all"]["mb_s"] / b["consumer_all"]["mb_s"],  # exact; b["ratio_all"] is rounded
            1.0,
            True,
            f"{b['spark_all']['mb_s']} / {b['consumer_all']['mb_s']} MB/s",
        )
        add(
            "Spark batch read, archived half: MB/s ÷ one consumer's",
            b["spark_archived"]["mb_s"] / b["consumer_archived"]["mb_s"],
            2.0,
            True,
            f"{b['spark_archived']['mb_s']} / {b['consumer_archived']['mb_s']} MB/s",
        )
        out.append(
            {
                "issue": issue,
                "target": "Spark streaming topic → topic at half the ingest rate: lag bounded",
                "measured": ("bounded" if st["bounded"] else "growing")
                + f", fed {fed / st['target_mb_s']:.0%} of the rate",
                "goal": f"bounded, fed ≥ {spark_source.FED_SHARE_MIN:.0%}",
                "higher": None,
                "reached": spark_source.kept_up(st),
                "detail": f"lag at the end {st['lag_end']} records, max {st['lag_max']}; "
                f"fed {fed:.1f} of {st['target_mb_s']} MB/s",
            }
        )

    issue = 22
    s1k = _find(scaling, partitions=1000)
    ratio(
        "librdkafka: broker CPU/GB at 10,000 partitions ÷ at 1",
        s10k,
        s1,
        "cpu_s_per_gb",
        1.3,
        False,
        "s/GB",
    )
    multi = res.get("scaling_multi", [])
    m1, m10k = _find(multi, partitions=1), _find(multi, partitions=10_000)
    add(
        "multi-partition generator: broker CPU per batch at 10,000 partitions, µs",
        m10k["cpu_us_per_batch"] if m10k else None,
        40,
        False,
        f"{m10k['records_per_batch']} records per batch" if m10k else "missing",
    )
    ratio(
        "multi-partition generator: throughput at 10,000 partitions ÷ at 1",
        m10k,
        m1,
        "mb_s",
        0.8,
        True,
        "MB/s",
    )
    add(
        "broker PSS (peak) with 1,000 partitions under load, MB",
        s1k["pss_peak_mb"] if s1k else None,
        44,
        False,
        f"steady {s1k['pss_steady_mb']} MB" if s1k else "missing",
    )
    add(
        f"broker PSS idle with {idle['partitions']:,} partitions, MB"
        if idle
        else "broker PSS idle with 100,000 partitions, MB",
        idle["pss_idle_mb"] if idle and idle["written"] >= idle["partitions"] else None,
        150,
        False,
        f"{idle['written']:,} of {idle['partitions']:,} partitions written" if idle else "missing",
    )
    return out


# -- Markdown and charts ----------------------------------------------------------------------


def _client_pct(r: dict[str, Any]) -> str:
    """The client process's CPU over the workload's wall time (100% = one core)."""
    if "client_cpu_s" not in r or not r["seconds"]:
        return "n/a"
    return f"{100 * r['client_cpu_s'] / r['seconds']:.0f}"


def _client_s_per_gb(r: dict[str, Any]) -> str:
    """The client process's CPU seconds per GB of payload: what the producer itself costs
    (librdkafka's cost per message grows with the partitions it writes to)."""
    if "client_cpu_s" not in r or not r.get("bytes"):
        return "n/a"
    return f"{r['client_cpu_s'] / (r['bytes'] / 1e9):.1f}"


def tables(res: dict[str, Any]) -> str:
    lines: list[str] = []
    ceiling = res.get("ceiling")
    redis = {r["size"]: r for r in res.get("redis_produce", [])}
    if res.get("produce"):
        lines += [
            "### Produce by record size",
            "",
            "| size B | acks | flush | msg/s | MB/s | ÷ ceiling MB/s | ÷ Redis msg/s"
            " | broker CPU s/GB | PSS peak MB | PSS steady MB |",
            "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in res["produce"]:
            rr = redis.get(r["size"])
            vs_ceiling = f"{r['mb_s'] / ceiling['mb_s']:.3f}" if ceiling else "n/a"
            vs_redis = f"{r['msg_s'] / rr['msg_s']:.2f}" if rr else "n/a"
            lines.append(
                f"| {r['size']:,} | {r['acks']} | {r['policy']} | {r['msg_s']:,.0f} | "
                f"{r['mb_s']:,.2f} | {vs_ceiling} | {vs_redis} | {r['cpu_s_per_gb']:,.1f} | "
                f"{r['pss_peak_mb']} | {r['pss_steady_mb']} |"
            )
        lines.append("")
    if redis:
        lines += [
            "### Baselines",
            "",
            "| baseline | size B | msg/s | MB/s | server CPU s/GB | server PSS peak MB |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        if ceiling:
            lines.append(
                f"| (a) bare uvloop ingest, 1 MiB frames | 1,048,576 | "
                f"{ceiling['msg_s']:,.1f} | {ceiling['mb_s']:,.1f} | "
                f"{ceiling['cpu_s_per_gb']} | {ceiling['pss_peak_mb']} |"
            )
        windowed = res.get("ceiling_retain")
        if windowed:
            lines.append(
                f"| (a') the same, keeping a {windowed['retain_bytes'] >> 20} MiB page-cache "
                f"window | 1,048,576 | {windowed['msg_s']:,.1f} | {windowed['mb_s']:,.1f} | "
                f"{windowed['cpu_s_per_gb']} | {windowed['pss_peak_mb']} |"
            )
        for r in redis.values():
            lines.append(
                f"| (b) Redis Streams XADD (pipelined) | {r['size']:,} | "
                f"{r['msg_s']:,.0f} | {r['mb_s']:,.2f} | {r['cpu_s_per_gb']} | "
                f"{r['pss_peak_mb']} |"
            )
        rc = res.get("redis_consume")
        if rc:
            lines.append(
                f"| (b) Redis Streams XREAD COUNT 10000 | {rc['size']:,} | "
                f"{rc['msg_s']:,.0f} | {rc['mb_s']:,.2f} | {rc['cpu_s_per_gb']} | "
                f"{rc['pss_peak_mb']} |"
            )
        lines.append("")
    if res.get("scaling"):
        lines += [
            "### Partition scaling (1 KiB, keyed, acks=1, interval)",
            "",
            "| partitions | msg/s | MB/s | ÷ 1 partition | CPU s/GB | PSS peak MB |"
            " PSS steady MB | open files | topic create s | producer CPU % |"
            " producer CPU s/GB |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        base = res["scaling"][0]["msg_s"]
        for r in res["scaling"]:
            lines.append(
                f"| {r['partitions']:,} | {r['msg_s']:,.0f} | {r['mb_s']:,.2f} | "
                f"{r['msg_s'] / base:.2f} | {r['cpu_s_per_gb']} | {r['pss_peak_mb']} |"
                f" {r['pss_steady_mb']} | {r['open_files']} | {r['create_s']} |"
                f" {_client_pct(r)} | {_client_s_per_gb(r)} |"
            )
        lines.append("")
    multi = res.get("scaling_multi")
    if multi:
        base = multi[0]
        lines += [
            "### Partition scaling with the multi-partition load generator",
            "",
            "The same broker and topic right after each librdkafka step, loaded by"
            " `bench/multiproduce.py`: every ProduceRequest carries a batch for up to 1 MiB /"
            " record size partitions (as Kafka's Java client sends every ready partition's batch"
            " for a broker in one request), five requests in flight, 1 KiB records. It knows"
            " how many batches it sent, so the broker's CPU per batch is measured directly.",
            "",
            "| partitions | partitions per request | records per batch | msg/s | MB/s |"
            " ÷ 1 partition | broker CPU s/GB | ÷ 1 partition | broker CPU µs/batch |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in multi:
            lines.append(
                f"| {r['partitions']:,} | {r['partitions_per_request']:,} |"
                f" {r['records_per_batch']} | {r['msg_s']:,.0f} | {r['mb_s']:,.2f} |"
                f" {r['mb_s'] / base['mb_s']:.2f} | {r['cpu_s_per_gb']} |"
                f" {r['cpu_s_per_gb'] / base['cpu_s_per_gb']:.2f} | {r['cpu_us_per_batch']} |"
            )
        lines.append("")
    free = res.get("scaling_storage_free")
    if free and res.get("scaling"):
        lines += [
            "### Partition scaling next to the storage-free broker (baseline c)",
            "",
            "The same load, step by step, against StoneMQ with a Produce handler that stores"
            " nothing (`bench/sink.py`): what the producer and StoneMQ's network and protocol"
            " layers reach with no journal, no splitter and no disk.",
            "",
            "| partitions | StoneMQ MB/s | ÷ 1 partition | storage-free MB/s | ÷ 1 partition |"
            " StoneMQ ÷ storage-free | storage-free CPU s/GB | producer CPU s/GB"
            " (storage-free) |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        base, free_base = res["scaling"][0]["msg_s"], free[0]["msg_s"]
        for f in free:
            r = _find(res["scaling"], partitions=f["partitions"])
            if r is None:
                continue
            lines.append(
                f"| {f['partitions']:,} | {r['mb_s']:,.2f} | {r['msg_s'] / base:.2f} |"
                f" {f['mb_s']:,.2f} | {f['msg_s'] / free_base:.2f} |"
                f" {r['msg_s'] / f['msg_s']:.2f} | {f['cpu_s_per_gb']} |"
                f" {_client_s_per_gb(f)} |"
            )
        lines.append("")
    c = res.get("consume")
    if c:
        rc = res.get("redis_consume")
        lines += [
            "### Consume catch-up from offset 0 (1 KiB records, 4 partitions)",
            "",
            "| records | msg/s | MB/s | produce MB/s (same data) | CPU s/GB | PSS peak MB"
            " | page cache dropped | ÷ Redis XREAD MB/s |",
            "|---:|---:|---:|---:|---:|---:|---|---:|",
            f"| {c['msgs']:,} | {c['msg_s']:,.0f} | {c['mb_s']:,.2f} | "
            f"{c['produce_mb_s']} | {c['cpu_s_per_gb']} | {c['pss_peak_mb']} | "
            f"{'yes' if c['cache_dropped'] else 'no (not permitted)'} | "
            + (f"{c['mb_s'] / rc['mb_s']:.2f} |" if rc else "n/a |"),
            "",
        ]
    lat = res.get("latency")
    if lat:
        lines += [
            "### End-to-end latency (1 KiB at a fixed rate, produce to consume)",
            "",
            "| rate msg/s | achieved | received | p50 ms | p99 ms | p99.9 ms | max ms |",
            "|---:|---:|---:|---:|---:|---:|---:|",
            f"| {lat['rate']:,} | {lat['achieved_msg_s']:,.0f} | {lat['received']:,} | "
            f"{lat['p50_ms']} | {lat['p99_ms']} | {lat['p999_ms']} | {lat['max_ms']} |",
            "",
        ]
    idle = res.get("idle")
    if idle:
        lines += [
            "### Idle cost",
            "",
            "| partitions | topics | written once | create s | write-once s | PSS empty MB |"
            " PSS peak while writing MB | PSS idle MB | open files |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
            f"| {idle['partitions']:,} | {idle['topics']} | {idle['written']:,} | "
            f"{idle['create_s']} | "
            f"{idle['write_s']} | {idle['pss_empty_mb']} | {idle['pss_peak_write_mb']} | "
            f"{idle['pss_idle_mb']} | {idle['open_files']} |",
            "",
        ]
    rec = res.get("recovery")
    if rec:
        lines += [
            "### Recovery after SIGKILL",
            "",
            "| journal bytes | unsplit at kill (vs split checkpoint) | page cache dropped |"
            " time to ready s | broker's own recovery s | bytes re-split (broker log) |",
            "|---:|---:|---|---:|---:|---:|",
            f"| {rec['journal_bytes']:,} | {rec['unsplit_bytes']:,} | "
            f"{'yes' if rec['cache_dropped'] else 'no'} | {rec['ready_s']} | "
            f"{rec['broker_recover_s']} | {rec['broker_resplit_bytes']} |",
            "",
        ]
    lines += archive_table(res)
    from bench import spark_source

    lines += spark_source.table(res)
    lines += interference_table(res)
    from bench import replication

    lines += replication.table(res)
    return "\n".join(lines)


def interference_table(res: dict[str, Any]) -> list[str]:
    """The hostile-input issue's interference workload (bench/interference.py): a paced
    producer's ack latency and another client's ApiVersions time, alone and while a consumer
    catches up from disk and a client pipelines Metadata requests."""
    it = res.get("interference")
    if not it:
        return []
    a, t = it["alone"], it["together"]
    ratio = t["producer"]["p99_ms"] / max(a["producer"]["p99_ms"], 1e-9)
    api_p99 = t["api_versions"]["p99_ms"]
    rows = []
    for name, phase in (("alone", a), ("together", t)):
        p, v = phase["producer"], phase["api_versions"]
        c = phase.get("catch_up")
        m = phase.get("metadata")
        rows.append(
            f"| {name} | {p['rate_msg_s']:,.0f} of {p['rate_asked']:,} | {p['p50_ms']} | "
            f"{p['p99_ms']} | {p['max_ms']} | {p['errors']} | {v['p50_ms']} | {v['p99_ms']} | "
            f"{v['max_ms']} | {'-' if c is None else c['mb_s']} | "
            f"{'-' if m is None else m['req_s']} |"
        )
    fill = it["fill"]
    return [
        "### Interference: catch-up from disk and pipelined Metadata next to producers",
        "",
        "| phase | producer msg/s (asked) | produce p50 ms | p99 ms | max ms | errors |"
        " ApiVersions p50 ms | p99 ms | max ms | catch-up MB/s | Metadata req/s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        *rows,
        "",
        f"Targets (hostile-input issue): producer p99 together ÷ alone ≤ 2: {ratio:.2f} "
        f"({'reached' if ratio <= 2 else 'not reached'}); ApiVersions p99 together ≤ 50 ms: "
        f"{api_p99} ms ({'reached' if api_p99 <= 50 else 'not reached'}). The fill wrote "
        f"{fill['bytes'] / 2**30:.2f} GiB at {fill['msg_s']:,.0f} msg/s (the measured maximum; "
        f"paced producer at 70% of it, acks=1); page cache "
        f"{'dropped' if it['cache_dropped'] else 'NOT dropped (not root)'} before the "
        "catch-up; the Metadata client sends 200 requests for every topic before reading any.",
        "",
        *_interference_cores(a, t),
        *_interference_accounting(a, t),
    ]


def _interference_cores(alone: dict[str, Any], together: dict[str, Any]) -> list[str]:
    """Each phase's CPU in cores: the broker's and the client processes' (absent from older
    results). The clients run on the broker's machine, so they take CPUs it would use."""
    if "cpu" not in alone or "cpu" not in together:
        return []
    names = {
        "producer": "paced producer",
        "catch_up": "catch-up consumer",
        "metadata": "Metadata pipeliner",
        "api_versions": "prober",
    }
    parts = []
    for phase, data in (("alone", alone), ("together", together)):
        c = data["cpu"]
        each = ", ".join(f"{label} {c[key]}" for key, label in names.items() if key in c)
        parts.append(
            f"{phase} ({c['seconds']} s): broker {c['broker']}, clients {c['clients']} ({each})"
        )
    cpus = together["cpu"]["cpus"]
    return [f"CPU in cores (of the machine's {cpus}): " + "; ".join(parts) + ".", ""]


def _interference_accounting(alone: dict[str, Any], together: dict[str, Any]) -> list[str]:
    """The broker's own accounting of each phase (its counters; absent from older results):
    produce time per request queued and handled, time held for split lag, and the splitter's
    time per step in its thread and waiting for the event loop."""
    if "broker" not in alone or "broker" not in together:
        return []
    parts = []
    for name, phase in (("alone", alone), ("together", together)):
        b = phase["broker"]
        requests = max(b["produce_requests_started"], 1)
        steps = max(b["splitter_steps"], 1)
        parts.append(
            f"{name}: produces held for split lag {b['split_lag_held_seconds']:.2f} s "
            f"({b['split_lag_holds']:.0f} holds), a produce "
            f"{b['produce_queued_seconds'] / requests * 1000:.1f} ms queued and "
            f"{b['produce_handled_seconds'] / requests * 1000:.1f} ms handled on average, the "
            f"splitter {b['splitter_thread_seconds'] / steps * 1000:.1f} ms per step in its "
            f"thread and {b['splitter_loop_wait_seconds'] / steps * 1000:.1f} ms waiting for "
            "the event loop"
        )
    return ["Broker accounting (its counters per phase): " + "; ".join(parts) + ".", ""]


def archive_table(res: dict[str, Any]) -> list[str]:
    """Issue 6's archive workload (bench/archive.py): produce into a tiered topic, the
    PySpark archive run, cold ÷ local bytes, cold fetch; with the issue's two targets."""
    arch = res.get("archive")
    if not arch:
        return []
    p, a, c = arch["produce"], arch["archive"], arch["cold_fetch"]
    steady = a.get("mb_s_after_first_job")
    small_enough = a["cold_ratio"] <= 0.5

    def verdict(rate: float | None) -> str:
        if rate is None:
            return "not measured"
        return "reached" if rate >= p["mb_s"] else "not reached"

    return [
        "### Tiered storage: archive (1 KiB JSON records, uncompressed producer)",
        "",
        "| produce MB/s (tiered topic) | archive MB/s incl. JVM/Spark start | archive MB/s"
        " Spark jobs | archive MB/s jobs after the first | run wall s | Spark start s |"
        " jobs s | first job s | local bytes | cold bytes | cold ÷ local | cold fetch MB/s |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        f"| {p['mb_s']:,.2f} | {a['mb_s_with_start']:,.2f} | {a['mb_s_without_start']:,.2f} | "
        f"{'-' if steady is None else f'{steady:,.2f}'} | "
        f"{a['wall_s']} | {a['spark_start_s']} | {a['jobs_s']} | {a.get('first_job_s', '-')} | "
        f"{a['local_bytes']:,} | {a['cold_bytes']:,} | {a['cold_ratio']} | {c['mb_s']:,.2f} |",
        "",
        "Targets (issue 6): archive throughput ≥ produce throughput: "
        f"{verdict(a['mb_s_with_start'])} with the JVM/Spark start, "
        f"{verdict(a['mb_s_without_start'])} for the Spark jobs, "
        f"{verdict(steady)} for the jobs after the first; cold bytes ≤ 0.5 of local: "
        f"{'reached' if small_enough else 'not reached'}. MB/s of the archive are local bytes "
        f"archived per second ({a['records']:,} records; {a['spark_master']}, {a['cores']} "
        f"cores, zstd level {a['zstd_level']}): with start = the whole `stonemq tier run "
        "--once` process (JVM and SparkSession start, planning, upload check, commit); "
        "Spark jobs = from the first job's start to the last commit, which includes the start "
        "of Spark's Python workers on the first job, a fixed cost per run; jobs after the "
        "first = the segment bytes of the later jobs over their time (the rate a longer "
        "archive, or `stonemq tier run` looping on one Spark session, runs at). The cold fetch "
        "reads every archived offset from 0 with confluent-kafka after local segments were "
        "deleted.",
        "",
    ]


def targets_table(res: dict[str, Any]) -> str:
    lines = [
        "| issue | target | goal | measured | reached | detail |",
        "|---:|---|---:|---:|---|---|",
    ]
    for t in targets(res):
        op = {True: "≥ ", False: "≤ ", None: ""}[t["higher"]]
        mark = {True: "reached", False: "not reached", None: "not measured"}[t["reached"]]
        lines.append(
            f"| {t['issue']} | {t['target']} | {op}{t['goal']} | {t['measured']} | {mark} |"
            f" {t['detail']} |"
        )
    return "\n".join(lines)


def charts(res: dict[str, Any], out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made: list[str] = []
    if res.get("produce"):
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
        for policy in ("interval", "always"):
            for acks in ("1", "all"):
                rows = [r for r in res["produce"] if r["policy"] == policy and r["acks"] == acks]
                if rows:
                    label = f"StoneMQ acks={acks} {policy}"
                    ax1.plot(
                        [r["size"] for r in rows], [r["mb_s"] for r in rows], "o-", label=label
                    )
                    ax2.plot(
                        [r["size"] for r in rows], [r["msg_s"] for r in rows], "o-", label=label
                    )
        redis = res.get("redis_produce", [])
        if redis:
            ax1.plot(
                [r["size"] for r in redis],
                [r["mb_s"] for r in redis],
                "s--",
                label="Redis Streams XADD",
            )
            ax2.plot(
                [r["size"] for r in redis],
                [r["msg_s"] for r in redis],
                "s--",
                label="Redis Streams XADD",
            )
        if res.get("ceiling"):
            ax1.axhline(res["ceiling"]["mb_s"], color="k", ls=":", label="bare ingest ceiling (a)")
        if res.get("ceiling_retain"):
            ax1.axhline(
                res["ceiling_retain"]["mb_s"],
                color="k",
                ls="--",
                label="(a') with a page-cache window",
            )
        for ax, unit in ((ax1, "MB/s"), (ax2, "msg/s")):
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlabel("record size (bytes)")
            ax.set_ylabel(unit)
            ax.grid(True, which="both", alpha=0.3)
        ax1.legend(fontsize=7)
        fig.suptitle("Produce throughput by record size")
        fig.tight_layout()
        fig.savefig(out / "produce_by_size.png", dpi=100)
        plt.close(fig)
        made.append("produce_by_size.png")
    if res.get("scaling"):
        rows = res["scaling"]
        fig, ax1 = plt.subplots(figsize=(7, 4.5))
        xs = [r["partitions"] for r in rows]
        ax1.plot(xs, [r["msg_s"] for r in rows], "o-", color="tab:blue", label="StoneMQ msg/s")
        free = res.get("scaling_storage_free")
        if free:
            ax1.plot(
                [r["partitions"] for r in free],
                [r["msg_s"] for r in free],
                "o--",
                color="tab:gray",
                label="storage-free broker (c) msg/s",
            )
        ax1.set_xscale("log")
        ax1.set_xlabel("partitions")
        ax1.set_ylabel("msg/s (1 KiB)", color="tab:blue")
        ax1.set_ylim(bottom=0)
        ax2 = ax1.twinx()
        ax2.plot(xs, [r["pss_peak_mb"] for r in rows], "s--", color="tab:red", label="PSS peak")
        ax2.plot(
            xs, [r["pss_steady_mb"] for r in rows], "^:", color="tab:orange", label="PSS steady"
        )
        ax2.set_ylabel("broker PSS (MB)", color="tab:red")
        ax2.set_ylim(bottom=0)
        ax2.legend(loc="lower left", fontsize=8)
        ax1.legend(loc="upper right", fontsize=8)
        ax1.grid(True, alpha=0.3)
        fig.suptitle("Partition scaling: throughput and memory")
        fig.tight_layout()
        fig.savefig(out / "partition_scaling.png", dpi=100)
        plt.close(fig)
        made.append("partition_scaling.png")
    return made


def write(res: dict[str, Any], out: Path) -> None:
    """Write results.md, the charts and docs/benchmarks.md from ``res``."""
    made = charts(res, out)
    body = tables(res)
    (out / "results.md").write_text(
        "# StoneMQ benchmark results\n\n" + targets_table(res) + "\n\n" + body + "\n"
    )
    prof = res.get("profile")
    if prof and prof.get("file") and (out / prof["file"]).exists():
        # summarised again so the report follows the current summariser
        prof.update(summarize_profile(out / prof["file"], 200, res["scale"]["profile_s"]))
    doc = out.parent / "benchmarks.md"
    doc.write_text(document(res, body, made))


def document(res: dict[str, Any], body: str, made: list[str]) -> str:
    m = res.get("machine", {})
    run = res.get("run", {})
    v = m.get("versions", {})
    scale = res.get("scale", {})
    parts = [
        "# Benchmarks",
        "",
        "Generated by the bench suite (`bench/`) from the run recorded in "
        "[benchmarks/results.json](benchmarks/results.json); do not edit by hand, re-run "
        "instead. Every figure below was measured in that one run, baselines side by side.",
        "",
        "## Command",
        "",
        "```sh",
        run.get("command", "./scripts/bench.sh"),
        "```",
        "",
        f"Scale: **{scale.get('name')}** (`./scripts/bench.sh --quick` runs every workload at a "
        "small scale for development). The run took "
        f"{run.get('seconds')} s, started {run.get('started')}.",
        "",
        "## Machine",
        "",
        f"- CPUs: {m.get('nproc')} ({m.get('cpu')}); memory {m.get('memory')}",
        f"- kernel {m.get('kernel')}; {m.get('os')}; disk: {m.get('disk')}",
        f"- Python {m.get('python')}; StoneMQ commit {m.get('stonemq_commit')}",
        "- " + ", ".join(f"{k} {val}" for k, val in v.items()),
        f"- load average at start {tuple(round(x, 2) for x in m.get('loadavg_start', ()))}, at"
        f" end {tuple(round(x, 2) for x in run.get('loadavg_end', ()))} (other work on the "
        "machine makes figures noisy: compare ratios, and re-run on a quiet machine)",
        "",
        "## Targets",
        "",
        targets_table(res),
        "",
        "## Results",
        "",
        "Throughput counts payload bytes (record values). Broker CPU s/GB is utime+stime of "
        "the broker and its children over the workload per GB of payload; PSS is summed over "
        "the broker and its children from `/proc/<pid>/smaps_rollup`, sampled every 0.25 s "
        "(peak: largest sample; steady: median of the second half of the workload).",
        "",
        body,
    ]
    for name in made:
        parts += [f"![{name}](benchmarks/{name})", ""]
    for name, text in res.get("failed", {}).items():
        parts += [f"**Workload `{name}` failed in this run:**", "", "```", text.strip(), "```", ""]
    parts += ["## Where the time goes", ""]
    analysis = out_dir_analysis()
    if analysis:
        parts += [analysis, ""]
    parts += [profile_text(res.get("profile")), ""]
    client = client_profile_text(res.get("client_profile"))
    if client:
        parts += [client, ""]
    parts += ["## How each workload is run", "", METHOD.strip(), ""]
    return "\n".join(parts)


ANALYSIS = ROOT / "docs" / "benchmarks" / "analysis.md"


def out_dir_analysis() -> str:
    """The hand-written reading of the latest run (docs/benchmarks/analysis.md), if any."""
    with contextlib.suppress(OSError):
        return ANALYSIS.read_text().strip()
    return ""


def profile_text(prof: dict[str, Any] | None) -> str:
    if not prof or not prof.get("samples"):
        return f"No profile in this run ({(prof or {}).get('error', 'py-spy gave no samples')})."
    w = prof["workload"]
    loop_pct = 100 * prof.get("loop_thread_samples", 0) / prof["samples"]
    areas = ", ".join(f"{a} {p}%" for a, p in prof["areas"][:8])
    top_self = "\n".join(f"| {f} | {p}% |" for f, p in prof["top_self"])
    top_incl = "\n".join(f"| {f} | {p}% |" for f, p in prof["top_inclusive"][:15])
    return (
        f"py-spy sampled the broker ({prof['samples']} samples at 200 Hz, non-blocking, "
        f"subprocesses included) during a separate repeat of the 1,120-byte acks=1 interval "
        f"produce workload ({w['msg_s']:,.0f} msg/s, {w['mb_s']} MB/s while sampled). "
        f"Samples with a thread on CPU came to {100 * (prof['busy_fraction'] or 0):.0f}% of "
        f"one thread sampled all the time; {loop_pct:.0f}% of them were on the event-loop "
        f"thread (network, protocol, the splitter and journal groups of up to 1 MiB run "
        f"there; the rest are the journal partitions' writer threads, in `pwritev` for "
        f"larger groups, and executor threads doing fsync and page release). A "
        f"Python frame's own time includes the C calls it makes (os.pwrite, os.pread, "
        f"fsync), so write-path frames at the top mean time in those system calls; an idle "
        f"worker thread waiting for work shows as `_worker (concurrent/futures/thread.py)`. "
        f"By the innermost StoneMQ frame of each sample: {areas}. "
        f"The raw stacks are in [benchmarks/{prof['file']}](benchmarks/{prof['file']}) "
        "(collapsed format; load into speedscope or flamegraph.pl).\n\n"
        "Top frames by own time:\n\n| frame | share of samples |\n|---|---:|\n"
        f"{top_self}\n\nTop frames including callees:\n\n| frame | share of samples |\n"
        f"|---|---:|\n{top_incl}"
    )


METHOD = """
- **Clients**: confluent-kafka (librdkafka) producers and consumers, each in its own process
  (multiprocessing, spawn). Producers: librdkafka's defaults (`linger.ms=5`, no
  compression, no idempotence, a 1 GiB buffer) but `queue.buffering.max.messages=1000000`
  and `message.timeout.ms=120000`; one producer process per workload, payload of random
  bytes; consumers `assign()` every partition at offset 0 (no group membership).
- **Produce by size**: one broker per `journal.flush.policy`, a 4-partition topic per
  (size, acks); in a full run each configuration produces for a fixed time (5 s, then the
  producer's flush), never to a byte cap: a cap ended the fast configurations within a second
  or two, a burst the journal absorbs while the splitter lags, not the sustained rate; the broker
  is left to go quiet between configurations. Redis XADD runs for the same time.
- **Partition scaling**: a fresh broker per step, one topic of N partitions, 1 KiB records keyed
  over max(4N, 1000) keys, acks=1, 12 s per step (time-bound, as above).
  After the 10,000-partition step, `perf record -e cpu-clock -g` samples the producer
  process during a repeat of that step (the client's CPU, by symbol and library).
- **Consume**: a 4-partition topic is filled with 1 KiB records (its produce rate is the
  comparison), the broker is stopped cleanly, the page cache dropped
  (`sync; echo 3 > /proc/sys/vm/drop_caches`, where permitted), the broker started again and
  one consumer reads everything from offset 0.
- **Latency**: one consumer process reading from offset 0, then a producer paced at 5,000 msg/s
  (`linger.ms=1`) stamping `CLOCK_MONOTONIC` ns in the first 8 bytes of each 1 KiB record; the
  consumer subtracts on receipt. The first 0.5 s of records are dropped as warm-up.
- **Idle cost**: a fresh broker, topics of 10,000 partitions up to the total, one 100-byte
  record written to every partition (one producer per topic, one after the other:
  librdkafka's cost per message grows with the partitions a producer knows), then PSS
  (median of 5 samples) and `/proc/<pid>/fd` counts once the broker is quiet.
- **Recovery**: a broker with `queue.checkpoint.interval.ms=3600000`, so no queue-log flush and
  no split-position checkpoint is written during the run: all the journal written is unsplit
  as far as a restart is concerned (the splitter's in-memory progress dies with the process).
  11,760-byte records fill 8 partitions up to the size, then SIGKILL; "unsplit" compares each
  journal partition's end with `split-position-checkpoint` (absent means its start). Time to
  ready is from spawning the restarted broker to its `ready` line with the port open; the
  page cache is dropped first where permitted.
- **Interference** (bench/interference.py): a 4-partition topic is filled with 8 GiB of 1 KiB
  records at full speed (its rate is the maximum); then a producer paced at 70% of it (acks=1,
  records handed over in bursts of those due, the ack latency of one record in 8 from its
  delivery callback, its first second not counted; the records appended are counted from the
  topic's end offsets) and an
  ApiVersions prober (every 10 ms,
  own connection) run alone, and again after the page cache is dropped while a consumer
  catches the 8 GiB up from offset 0 and a client pipelines Metadata requests for every topic
  (200 sent before any is read, over and over) until the catch-up ends. Each phase also
  reads the broker's counters (`metrics.listen`) at its start and end: time produces waited
  queued, were held for split lag and were handled, and the splitter's time in its thread,
  on the loop, waiting for the loop and idle, and the fetched bytes sent with `sendfile`.
  Add it to an existing report with `python -m bench --only interference --merge`.
- **Multi-partition generator** (bench/multiproduce.py): after each partition-scaling
  step's librdkafka run, the same broker and topic take a load whose every Produce v7 carries
  a batch for many partitions (up to 1 MiB of records per request, 16 KiB per batch, five
  requests in flight, partitions round-robin), for the step's time; broker CPU per batch is
  its CPU over the batches acknowledged.
- **Replication** (bench/replication.py, issue 20; `python -m bench --only replication
  --merge`, `--quick` for steps 1 and 100 and 2 kills): a standalone ZooKeeper (Debian's
  package, tickTime 2000 ms) and, per step, a fresh cluster of three brokers in their own
  chroot (`default.replication.factor=3`, `zookeeper.session.timeout.ms=6000`, otherwise
  defaults: 4 journal partitions per broker, 12 in all); one topic of N partitions at
  replication factor 3, every journal partition's ISR whole before the load; then the
  librdkafka producer above with `acks=all` (keyed over max(4N, 1000) keys, 12 s and its
  flush), and the multi-partition generator with `acks=-1`, one connection per leader broker
  packing that broker's partitions. CPU is utime+stime of the three brokers over the
  payload acknowledged; PSS is sampled per broker (peak of the largest); replica fetch
  requests per second are the brokers' own counter (`stonemq_replica_fetch_requests_served_total`,
  `metrics.listen`) over the load. The single node (no ZooKeeper) runs the same two loads
  with acks=1 right after each step. Failover: a 1-partition topic, an acks=all librdkafka
  producer sending a record every 2 ms to it; per round the broker leading it is SIGKILLed,
  the bench polls ZooKeeper every 20 ms for the broker's registration going (session
  expiry) and for no journal partition led by it (election), reads from the surviving
  brokers' logs (millisecond timestamps) when a broker judged it dead, when the controller
  wrote a new leader for a journal partition it led and when a new leader took its first
  append, and takes the first acknowledgement received after the election (the earlier of
  the log line and the poll); then, once its session has expired (a broker id still
  registered is refused, as by Kafka), the broker is restarted and every ISR is whole again
  before the next round.
- **Baselines**: (a) `python -m bench.baselines ceiling-server`: uvloop, `BufferedProtocol`
  into a preallocated buffer, `os.write` of each length-prefixed 1 MiB frame to a file (no
  fsync), fed by one client process with blocking `sendall`; (a') the same server with
  `--retain-bytes` set to StoneMQ's `queue.cache.retain.bytes` default, noting its writes in
  StoneMQ's `WrittenPages` so pages older than that window are written back and dropped as
  StoneMQ's queue-log pages are (run 5 s after (a)); (b) Debian `redis-server`
  (`appendonly yes`, `appendfsync everysec`, temp dir, free loopback port), redis-py pipelines
  of XADD (up to 1,000 commands or 1 MiB per pipeline) at the same sizes, XREAD COUNT 10000 for
  consume; (c) `python -m bench.sink serve`: StoneMQ's listener, connections, request decoding,
  metadata and topic creation, with a Produce handler that answers success at once and stores
  nothing. It runs every partition-scaling step right after StoneMQ's, with the same load, so
  the fall from 1 to 10,000 partitions that belongs to the client is measured in the same run.
"""
