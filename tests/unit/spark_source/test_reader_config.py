"""The range reader's librdkafka configuration: the source's fetch sizes unless the user's
``kafka.*`` options say otherwise."""

from __future__ import annotations

from stonemq.spark import kafka_io
from stonemq.spark import options as so


def _opts(**extra: str) -> so.SourceOptions:
    return so.parse(
        {"kafka.bootstrap.servers": "127.0.0.1:9092", "subscribe": "t", **extra},
        streaming=False,
    )


def test_range_reads_fetch_8_mib_per_partition_and_wait_100_ms_by_default() -> None:
    conf = kafka_io.range_reader_config(_opts())
    assert conf["max.partition.fetch.bytes"] == 8 * 1024 * 1024
    assert conf["fetch.wait.max.ms"] == 100
    assert conf["bootstrap.servers"] == "127.0.0.1:9092"
    assert conf["enable.auto.commit"] is False


def test_the_users_kafka_options_win_over_the_fetch_defaults() -> None:
    conf = kafka_io.range_reader_config(
        _opts(
            **{
                "kafka.max.partition.fetch.bytes": "1048576",
                "kafka.fetch.wait.max.ms": "500",
                "kafka.fetch.min.bytes": "65536",
            }
        )
    )
    assert conf["max.partition.fetch.bytes"] == "1048576"
    assert conf["fetch.wait.max.ms"] == "500"
    assert conf["fetch.min.bytes"] == "65536"
