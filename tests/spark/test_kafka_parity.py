"""``format("stonemq")`` where an audit found it differing from Spark's Kafka source and
sink: real PySpark (local mode) against a real broker, each case as Spark's connector
behaves (its sources: KafkaRelation, KafkaSourceRDD, KafkaMicroBatchStream, KafkaWriter).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from integration.helpers import create_topic, produce, sample_messages, unique_topic

from stonemq.spark import register

pytestmark = [pytest.mark.spark, pytest.mark.timeout(900)]

PUSHDOWN = "spark.sql.python.filterPushdown.enabled"


@pytest.fixture(scope="module")
def broker(request, tmp_path_factory, spark) -> Any:  # type: ignore[no-untyped-def]
    root = request.config.pluginmanager.get_plugin(str(Path(__file__).parents[1] / "conftest.py"))
    factory = root.BrokerFactory(tmp_path_factory.mktemp("parity"))
    try:
        yield factory(**{"log.retention.check.interval.ms": 300})
    finally:
        factory.close()


@pytest.fixture
def pushdown_conf(spark) -> Any:  # type: ignore[no-untyped-def]
    """Spark's pushdown for Python sources as the test leaves it: restored after."""
    before = spark.conf.get(PUSHDOWN, None)
    yield
    if before is None:
        spark.conf.unset(PUSHDOWN)
    else:
        spark.conf.set(PUSHDOWN, before)


def _topic(bootstrap: str, partitions: int, per_partition: int, tag: str) -> str:
    topic = create_topic(bootstrap, unique_topic(tag), partitions=partitions)
    for p in range(partitions):
        produce(bootstrap, topic, sample_messages(per_partition, tag=f"{tag}{p}"), partition=p)
    return topic


def _reader(spark: Any, bootstrap: str, **options: str) -> Any:
    r = spark.read.format("stonemq").option("kafka.bootstrap.servers", bootstrap)
    for k, v in options.items():
        r = r.option(k, v)
    return r


def test_a_filtered_query_never_changes_a_later_query_of_the_dataframe(
    spark, broker, pushdown_conf
) -> None:  # type: ignore[no-untyped-def]
    """PySpark keeps the plan its pushdown worker made on the DataFrame's relation and
    reuses it for a later query that pushes nothing: Spark's Kafka source (no pushdown,
    one plan per query) counts 30 whatever ran before. A read prunes only when it asks for
    it, and even then a filter changes what is read, not its query's result."""
    bootstrap = broker.bootstrap
    topic = _topic(bootstrap, 3, 10, "leak")
    spark.conf.set(PUSHDOWN, "true")  # as register() set it, or a user for another source
    register(spark)
    df = _reader(spark, bootstrap, subscribe=topic).load()
    assert df.count() == 30
    assert df.where("offset = 3").count() == 3
    assert df.count() == 30
    assert df.where("partition = 1 OR offset = 3").count() == 12  # an OR is not pushed
    assert df.select("partition").distinct().count() == 3
    assert df.where("partition = 2").count() == 10
    assert df.where("offset >= 8").count() == 6
    assert df.count() == 30

    # opted in: the filtered query still exact (Spark evaluates every filter again)
    register(spark, filter_pushdown=True)
    pruned = _reader(spark, bootstrap, subscribe=topic, **{"stonemq.filterPushdown": "true"})
    assert pruned.load().where("partition = 1 AND offset >= 7").count() == 3
    assert pruned.load().where("offset = 3").count() == 3
