"""The bench report's summary of targets (bench/report.py ``targets`` and ``targets_table``):
each issue's target computed from the run's own rows, "not measured" when its workload or step
did not run."""

from __future__ import annotations

from bench.report import targets, targets_table


def _scaling(n: int, mb_s: float, cpu: float, pss: float) -> dict:
    return {
        "partitions": n,
        "msg_s": mb_s * 1e6 / 1024,
        "mb_s": mb_s,
        "cpu_s_per_gb": cpu,
        "pss_peak_mb": pss,
        "pss_steady_mb": pss - 1,
    }


def _multi(n: int, mb_s: float, us: float) -> dict:
    return {"partitions": n, "mb_s": mb_s, "cpu_us_per_batch": us, "records_per_batch": 16}


def _results() -> dict:
    return {
        "scaling": [
            _scaling(1, 300.0, 2.0, 40.0),
            _scaling(1000, 250.0, 2.4, 50.0),
            _scaling(10_000, 150.0, 2.8, 48.0),
        ],
        "scaling_multi": [_multi(1, 200.0, 20.0), _multi(10_000, 170.0, 38.5)],
        "idle": {
            "partitions": 100_000,
            "written": 100_000,
            "pss_idle_mb": 160.0,
            "open_files": 1000,
        },
        "interference": {
            "alone": {"producer": {"p99_ms": 10.0}, "api_versions": {"p99_ms": 2.0}},
            "together": {"producer": {"p99_ms": 25.0}, "api_versions": {"p99_ms": 40.0}},
        },
    }


def _by_name(res: dict) -> dict[tuple[int, str], dict]:
    return {(t["issue"], t["target"]): t for t in targets(res)}


def test_the_flat_cost_targets_come_from_the_scaling_rows() -> None:
    got = _by_name(_results())
    cpu = got[(22, "librdkafka: broker CPU/GB at 10,000 partitions ÷ at 1")]
    assert cpu["measured"] == 1.4 and cpu["reached"] is False  # 2.8 / 2.0 > 1.3
    name = "multi-partition generator: broker CPU per batch at 10,000 partitions, µs"
    per_batch = got[(22, name)]
    assert per_batch["measured"] == 38.5 and per_batch["reached"] is True
    multi = got[(22, "multi-partition generator: throughput at 10,000 partitions ÷ at 1")]
    assert multi["measured"] == 0.85 and multi["reached"] is True
    # the same PSS figure against issue 5's bound (60 MB) and issue 22's (44 MB)
    assert got[(5, "broker PSS (peak) with 1,000 partitions under load, MB")]["reached"] is True
    assert got[(22, "broker PSS (peak) with 1,000 partitions under load, MB")]["reached"] is False
    idle = got[(22, "broker PSS idle with 100,000 partitions, MB")]
    assert idle["measured"] == 160.0 and idle["reached"] is False
    interference = got[(17, "interference: producer p99 together ÷ alone")]
    assert interference["measured"] == 2.5 and interference["reached"] is False
    assert got[(17, "interference: ApiVersions p99 together, ms")]["reached"] is True


def test_a_run_without_a_step_or_workload_marks_its_targets_not_measured() -> None:
    res = _results()
    res["scaling"] = res["scaling"][:2]  # a quick run: no 10,000-partition step
    del res["scaling_multi"]
    got = _by_name(res)
    cpu = got[(22, "librdkafka: broker CPU/GB at 10,000 partitions ÷ at 1")]
    assert cpu["measured"] is None and cpu["reached"] is None
    assert not any(issue in (20, 21) for issue, _ in got)  # those workloads did not run
    table = targets_table(res)
    assert "| 22 | librdkafka: broker CPU/GB at 10,000 partitions ÷ at 1 | ≤ 1.3 | None |" in table
    assert "not measured" in table


def test_a_ratio_just_below_its_goal_is_not_reached_though_it_rounds_to_it() -> None:
    res = _results()
    res["scaling_multi"] = [_multi(1, 200.0, 20.0), _multi(10_000, 159.99, 38.5)]  # 0.79995
    res["interference"]["together"]["producer"]["p99_ms"] = 20.0001  # 2.00001
    got = _by_name(res)
    multi = got[(22, "multi-partition generator: throughput at 10,000 partitions ÷ at 1")]
    assert multi["measured"] == 0.79995 and multi["reached"] is False
    interference = got[(17, "interference: producer p99 together ÷ alone")]
    assert interference["measured"] == 2.00001 and interference["reached"] is False


def _spark(produced: int, bounded: bool) -> dict:
    side = {"mb_s": 200.0}
    return {
        "spark_source": {
            "batch": {
                "spark_all": {"mb_s": 400.0},
                "consumer_all": side,
                "spark_archived": {"mb_s": 500.0},
                "consumer_archived": side,
            },
            "stream": {
                "target_mb_s": 102.4,  # 100,000 records of 1,024 bytes a second
                "seconds": 10.0,
                "produced": produced,
                "bounded": bounded,
                "lag_end": 5,
                "lag_max": 9,
            },
        }
    }


def test_a_bounded_streaming_lag_counts_only_when_the_feeder_wrote_the_asked_rate() -> None:
    name = (21, "Spark streaming topic → topic at half the ingest rate: lag bounded")
    assert _by_name(_spark(1_000_000, True))[name]["reached"] is True
    assert _by_name(_spark(950_000, True))[name]["reached"] is True
    short = _by_name(_spark(850_000, True))[name]  # the feeder fell behind: not shown
    assert short["reached"] is False and short["measured"] == "bounded, fed 85% of the rate"
    assert _by_name(_spark(1_000_000, False))[name]["reached"] is False
    batch = _by_name(_spark(1_000_000, True))[
        (21, "Spark batch read, archived half: MB/s ÷ one consumer's")
    ]
    assert batch["measured"] == 2.5 and batch["reached"] is True
