"""The interference benchmark's CPU accounting (bench/interference.py ``cores`` and its line in
bench/report.py): each phase's broker and client CPU as cores of the phase's wall time."""

from __future__ import annotations

from bench.interference import cores
from bench.report import _interference_cores


def _phase(together: bool) -> dict:
    phase = {
        "producer": {"p99_ms": 10.0, "client_cpu_s": 10.0},
        "api_versions": {"p99_ms": 2.0, "client_cpu_s": 0.5},
    }
    if together:
        phase["catch_up"] = {"mb_s": 150.0, "client_cpu_s": 4.0}
        phase["metadata"] = {"req_s": 3000.0, "client_cpu_s": 2.5}
    return phase


def test_cores_divide_each_process_cpu_by_the_phase_wall_time() -> None:
    got = cores(10.0, 12.0, _phase(together=True))
    assert got["broker"] == 1.2
    assert got["producer"] == 1.0
    assert got["catch_up"] == 0.4
    assert got["metadata"] == 0.25
    assert got["api_versions"] == 0.05
    assert got["clients"] == 1.7  # 1.0 + 0.05 + 0.25 + 0.4
    assert got["seconds"] == 10.0 and got["cpus"] >= 1


def test_a_phase_without_a_client_counts_only_the_clients_it_ran() -> None:
    got = cores(5.0, 5.0, _phase(together=False))
    assert "catch_up" not in got and "metadata" not in got
    assert got["clients"] == 2.1  # (10 + 0.5) / 5


def test_the_report_line_names_every_client_and_skips_older_results() -> None:
    alone, together = _phase(False), _phase(True)
    assert _interference_cores(alone, together) == []  # results without "cpu"
    alone["cpu"] = cores(5.0, 5.0, alone)
    together["cpu"] = cores(10.0, 12.0, together)
    (line, blank) = _interference_cores(alone, together)
    assert blank == ""
    assert "alone (5.0 s): broker 1.0, clients 2.1 (paced producer 2.0, prober 0.1)" in line
    assert "together (10.0 s): broker 1.2, clients 1.7" in line
    assert "catch-up consumer 0.4" in line and "Metadata pipeliner 0.25" in line
