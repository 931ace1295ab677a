"""The fuzzing campaign against a real broker: seeded cases, a liveness probe after each, an
exact round trip of acknowledged data now and then, and a report of findings.

Case ``i`` of seed ``s`` is drawn from ``random.Random(f"{s}:{i}")`` alone, so any case
replays on its own (``STONEMQ_FUZZ_SEED=s STONEMQ_FUZZ_CASE=i``). A finding is a broker
process that exited, a traceback or internal error in its log, an ApiVersions probe (from
another connection) slower than a second, RSS grown past a bound, or acknowledged data that
does not come back byte for byte.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import random
import socket
import struct
import time
from typing import Any

from integration.helpers import create_topic
from integration.rawclient import RawConnection, fetch_batches, produce_raw, topic_id_of

from . import batches
from .mutators import FAMILIES, Case
from .values import Hints

LOG_ALARMS = ("Traceback", "internal error", "memory allocation", "Fatal Python", "panicked")
PROBE_SLOW_S = 1.0
RSS_EVERY = 25  # cases between RSS checks
ROUND_TRIP_EVERY = 100  # cases between round trips
CANARY = "fuzz-canary"


@dataclasses.dataclass
class Finding:
    case: int
    family: str
    kind: str  # "exit", "log", "slow probe", "rss", "round trip"
    what: str
    detail: str

    def line(self, seed: str) -> str:
        # a log line may land just after the next case was sent: replay the one before too
        cases = f"{self.case - 1},{self.case}" if self.case > 0 else str(self.case)
        return (
            f"case {self.case} [{self.family}] {self.kind}: {self.what} -- {self.detail[:300]}"
            f" (replay: STONEMQ_FUZZ_SEED={seed} STONEMQ_FUZZ_CASE={cases})"
        )


@dataclasses.dataclass
class Report:
    seed: str
    families: list[str]
    cases: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    requests: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    findings: list[Finding] = dataclasses.field(default_factory=list)
    round_trips: int = 0
    slowest_probe_s: float = 0.0
    rss_growth_mb: float = 0.0
    seconds: float = 0.0

    def text(self) -> str:
        lines = [
            f"fuzz seed {self.seed}, families {','.join(self.families)}: "
            f"{sum(self.cases.values())} cases, {sum(self.requests.values())} requests in "
            f"{self.seconds:.0f} s; {self.round_trips} round trips; slowest probe "
            f"{self.slowest_probe_s * 1000:.0f} ms; RSS growth {self.rss_growth_mb:.0f} MB",
            "cases (requests) by family: "
            + ", ".join(f"{f} {self.cases[f]} ({self.requests[f]})" for f in self.families),
            f"findings: {len(self.findings)}",
        ]
        by_kind = collections.Counter((f.family, f.kind) for f in self.findings)
        lines += [f"  {family} / {kind}: {n}" for (family, kind), n in sorted(by_kind.items())]
        lines += ["  " + f.line(self.seed) for f in self.findings[:40]]
        return "\n".join(lines)


def hints_for(seed: str) -> Hints:
    """The names every case draws from (made by setup(), the same for every seed)."""
    return Hints(
        topics=[f"fuzz-t{i}" for i in range(3)],
        groups=[f"fuzz-g{i}" for i in range(3)],
        records=lambda rng: batches.simple_batch(rng),
    )


def case_for(seed: str, index: int, families: list[str], hints: Hints) -> Case:
    rng = random.Random(f"{seed}:{index}")
    return FAMILIES[rng.choice(families)](rng, hints)


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


class Campaign:
    def __init__(
        self, broker: Any, seed: str, families: list[str], rss_bound_mb: float = 512.0
    ) -> None:
        self.broker = broker
        self.seed = seed
        self.hints = hints_for(seed)
        self.report = Report(seed, families)
        self.rss_bound_mb = rss_bound_mb
        self._log_pos = 0
        self._probe: RawConnection | None = None
        self._rss_base = 0.0
        self._acked: list[tuple[int, bytes]] = []  # (offset, batch) on the canary topic

    # -- set-up ------------------------------------------------------------------------------
    def setup(self) -> None:
        for topic in self.hints.topics:
            create_topic(self.broker.bootstrap, topic, partitions=2)
        create_topic(self.broker.bootstrap, CANARY)
        with RawConnection(self.broker.host, self.broker.port, timeout=10) as conn:
            self.hints.topic_ids[:] = [topic_id_of(conn, topic) for topic in self.hints.topics]
        self.round_trip()
        self._log_pos = len(self.broker.log_path.read_bytes())
        self._rss_base = rss_mb(self.broker.proc.pid)

    # -- the run -----------------------------------------------------------------------------
    def run(self, seconds: float, only: list[int] | None = None) -> Report:
        started = time.monotonic()
        indices = iter(only) if only is not None else _count()
        for index in indices:
            if only is None and time.monotonic() - started > seconds:
                break
            case = case_for(self.seed, index, self.report.families, self.hints)
            if only is not None:
                print(f"case {index} [{case.family}] {case.what}: {case.payload[:200].hex()}")
            self.run_case(index, case)
        self.report.findings += self.check_acked(-1)
        self.report.seconds = time.monotonic() - started
        return self.report

    def run_case(self, index: int, case: Case) -> None:
        self.report.cases[case.family] += 1
        self.report.requests[case.family] += case.requests
        send(self.broker, case)
        findings = self.probe(index, case)
        findings += self.scan_log(index, case)
        if not self.broker.alive:
            code = self.broker.proc.returncode
            findings.append(Finding(index, case.family, "exit", case.what, f"exit code {code}"))
            self.report.findings += findings
            self.restart()
            return
        if index % RSS_EVERY == 0:
            findings += self.check_rss(index, case)
        if index % ROUND_TRIP_EVERY == 0:
            findings += self.check_round_trip(index, case)
        self.report.findings += findings

    def restart(self) -> None:
        """After a crash: start the broker again on its data and go on fuzzing."""
        self._probe = None
        self.broker.start()
        self._log_pos = len(self.broker.log_path.read_bytes())
        self._rss_base = rss_mb(self.broker.proc.pid)

    # -- checks ------------------------------------------------------------------------------
    def probe(self, index: int, case: Case) -> list[Finding]:
        began = time.monotonic()
        try:
            if self._probe is None:
                self._probe = RawConnection(self.broker.host, self.broker.port, timeout=10)
            self._probe.api_versions()
        except (OSError, AssertionError) as exc:
            self._probe = None
            if not self.broker.alive:
                return []  # reported as an exit
            return [Finding(index, case.family, "slow probe", case.what, f"probe failed: {exc}")]
        took = time.monotonic() - began
        self.report.slowest_probe_s = max(self.report.slowest_probe_s, took)
        if took > PROBE_SLOW_S:
            return [Finding(index, case.family, "slow probe", case.what, f"{took:.2f} s")]
        return []

    def scan_log(self, index: int, case: Case) -> list[Finding]:
        data = self.broker.log_path.read_bytes()
        new, self._log_pos = data[self._log_pos :].decode("utf-8", "replace"), len(data)
        hits = [alarm for alarm in LOG_ALARMS if alarm in new]
        if not hits:
            return []
        at = min(new.index(alarm) for alarm in hits)
        excerpt = " | ".join(new[max(0, at - 300) : at + 900].splitlines()[-12:])
        return [Finding(index, case.family, "log", case.what, excerpt)]

    def check_rss(self, index: int, case: Case) -> list[Finding]:
        growth = rss_mb(self.broker.proc.pid) - self._rss_base
        self.report.rss_growth_mb = max(self.report.rss_growth_mb, growth)
        if growth <= self.rss_bound_mb:
            return []
        self._rss_base += growth  # report a step once
        return [Finding(index, case.family, "rss", case.what, f"RSS grew {growth:.0f} MB")]

    def round_trip(self) -> None:
        """Produce a known batch to the canary topic with acks=all and note it."""
        rng = random.Random(f"{self.seed}:round-trip:{len(self._acked)}")
        batch = batches.simple_batch(rng)
        with RawConnection(self.broker.host, self.broker.port, timeout=10) as conn:
            part = produce_raw(conn, CANARY, 0, batch)
        if part.error_code != 0:
            raise AssertionError(f"canary produce failed: error {part.error_code}")
        self._acked.append((part.base_offset, batch))
        self.report.round_trips += 1

    def check_round_trip(self, index: int, case: Case) -> list[Finding]:
        try:
            self.round_trip()
        except (OSError, AssertionError) as exc:
            return [Finding(index, case.family, "round trip", case.what, f"produce: {exc}")]
        return self.check_acked(index, case)

    def check_acked(self, index: int, case: Case | None = None) -> list[Finding]:
        """Every acknowledged canary batch comes back byte for byte, but for the two fields
        the broker sets: its base offset and its partition leader epoch (neither under the
        CRC)."""
        family, what = (case.family, case.what) if case else ("-", "final check")
        end = self._acked[-1][0] + 1 if self._acked else 0
        try:
            got = fetch_batches(self.broker, CANARY, 0, 0, end=end)
        except (OSError, AssertionError) as exc:
            finding = Finding(index, family, "round trip", what, f"fetch: {exc}")
        else:
            offsets = [struct.unpack_from(">q", b)[0] for b in got]
            want = [(o, b[8:12] + b[16:]) for o, b in self._acked]
            if [(o, b[8:12] + b[16:]) for o, b in zip(offsets, got, strict=False)] == want:
                return []
            finding = Finding(index, family, "round trip", what, f"{len(got)} batches differ")
        return [finding]


def _count() -> Any:
    index = 0
    while True:
        yield index
        index += 1


def send(broker: Any, case: Case) -> None:
    """Send a case on a fresh connection, read what comes back for ``listen_s``, close."""
    with (
        contextlib.suppress(OSError),
        socket.create_connection((broker.host, broker.port), timeout=2) as sock,
    ):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.sendall(case.payload)
        deadline = time.monotonic() + case.listen_s
        while (remaining := deadline - time.monotonic()) > 0:
            sock.settimeout(remaining)
            if not sock.recv(1 << 16):
                break
