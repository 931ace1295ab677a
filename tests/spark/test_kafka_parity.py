"""``format("stonemq")`` where an audit found it differing from Spark's Kafka source and
sink: real PySpark (local mode) against a real broker, each case as Spark's connector
behaves (its sources: KafkaRelation, KafkaSourceRDD, KafkaMicroBatchStream, KafkaWriter).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from integration.helpers import (
    create_topic,
    produce,
    sample_messages,
    unique_topic,
    wait_high_watermark,
)

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


def test_available_now_from_latest_on_a_topic_being_written(spark, broker, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Trigger.AvailableNow with startingOffsets=latest (the streaming default) while a
    producer writes: Spark's Kafka source takes the query's end at its first latestOffset
    call, after the start offsets, so the query reads what came in between and ends. The
    end taken at prepareForTriggerAvailableNow (before the start) failed every query with
    "Some data may have been lost"."""
    import threading

    from confluent_kafka import Producer

    bootstrap = broker.bootstrap
    topic = _topic(bootstrap, 1, 10, "avnow")
    stop = threading.Event()

    def write() -> None:  # about a record a millisecond
        p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
        i = 0
        while not stop.is_set():
            p.produce(topic, f"live-{i}".encode())
            p.poll(0)
            i += 1
            time.sleep(0.001)
        p.flush(10)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    try:
        time.sleep(1)
        for attempt in range(3):
            query = (
                spark.readStream.format("stonemq")
                .option("kafka.bootstrap.servers", bootstrap)
                .option("subscribe", topic)
                .load()
                .writeStream.format("noop")
                .option("checkpointLocation", str(tmp_path / f"ckpt{attempt}"))
                .trigger(availableNow=True)
                .start()
            )
            assert query.awaitTermination(120), f"attempt {attempt} did not end"
            assert query.exception() is None, f"attempt {attempt}: {query.exception()}"
    finally:
        stop.set()
        writer.join(20)


def test_a_batch_dataframe_reads_to_the_log_end_at_each_query(spark, broker) -> None:  # type: ignore[no-untyped-def]
    """endingOffsets=latest (and -1 in JSON) is resolved by each task when it runs, as
    Spark's KafkaSourceRDD does: a DataFrame kept and queried again sees what was produced
    since, though PySpark plans its read once. A partition empty at planning is read too."""
    bootstrap = broker.bootstrap
    topic = _topic(bootstrap, 2, 5, "late")
    empty = create_topic(bootstrap, unique_topic("late-empty"))
    df = _reader(spark, bootstrap, subscribe=topic).load()
    by_json = _reader(
        spark, bootstrap, subscribe=topic, endingOffsets=f'{{"{topic}": {{"0": -1, "1": 3}}}}'
    ).load()
    nothing_yet = _reader(spark, bootstrap, subscribe=empty).load()
    assert df.count() == 10
    assert by_json.count() == 8
    assert nothing_yet.count() == 0
    produce(bootstrap, topic, sample_messages(4, tag="more0"), partition=0)
    produce(bootstrap, topic, sample_messages(6, tag="more1"), partition=1)
    produce(bootstrap, empty, sample_messages(3, tag="first"))
    for name, partition, end in ((topic, 0, 9), (topic, 1, 11), (empty, 0, 3)):
        assert wait_high_watermark(bootstrap, name, end, partition=partition)[1] == end
    assert df.count() == 20
    assert sorted(r.offset for r in df.where("partition = 0").collect()) == list(range(9))
    assert by_json.count() == 12  # partition 1 ends at 3 as the JSON says
    assert nothing_yet.count() == 3
    # split by maxRecordsPerPartition: offsets resolved at planning, as Spark splits them
    split = _reader(spark, bootstrap, subscribe=topic, maxRecordsPerPartition="4").load()
    assert split.count() == 20
    assert split.rdd.getNumPartitions() == 6  # 9 and 11 offsets, at most 4 a task


@pytest.mark.parametrize("isolation", ["read_uncommitted", "read_committed"])
def test_offsets_gone_after_planning_are_skipped_the_rest_read(spark, broker, isolation) -> None:  # type: ignore[no-untyped-def]
    """A DataFrame read again after DeleteRecords moved the log start into its planned range
    (PySpark reuses the plan): failOnDataLoss=false reads what is left of the range, as
    Spark's Kafka source goes on from the earliest offset still there; the default fails.
    The whole range was read as nothing (audit36 p2). read_uncommitted is read by Fetch,
    read_committed by librdkafka: both paths."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    bootstrap = broker.bootstrap
    topic = _topic(bootstrap, 1, 40, "gone")
    assert wait_high_watermark(bootstrap, topic, 40)[1] == 40
    options = {
        "assign": f'{{"{topic}": [0]}}',
        "startingOffsets": f'{{"{topic}": {{"0": 0}}}}',
        "endingOffsets": f'{{"{topic}": {{"0": 40}}}}',
        "kafka.isolation.level": isolation,
    }
    lenient = _reader(spark, bootstrap, failOnDataLoss="false", **options).load()
    strict = _reader(spark, bootstrap, **options).load()
    assert lenient.count() == 40 and strict.count() == 40  # planned: [0, 40)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for fut in admin.delete_records([TopicPartition(topic, 0, 15)]).values():
        fut.result(30)
    assert sorted(r.offset for r in lenient.select("offset").collect()) == list(range(15, 40))
    with pytest.raises(Exception, match=r"offsets 0\.\.39: offset out of range"):
        strict.count()


def _pruning(spark: Any, bootstrap: str, **options: str) -> Any:
    """A read that asks for pruning, with Spark's pushdown for Python sources on."""
    spark.conf.set(PUSHDOWN, "true")
    return _reader(spark, bootstrap, **{"stonemq.filterPushdown": "true"}, **options).load()


def test_a_timestamp_floor_before_1970_keeps_every_record(spark, broker, pushdown_conf) -> None:  # type: ignore[no-untyped-def]
    """``timestamp >= T`` for T < 0 holds for every record; ListOffsets reads -1..-6 as
    special targets (latest, earliest, the max timestamp, ...), so such a floor is not
    pushed (it dropped all or most rows)."""
    bootstrap = broker.bootstrap
    topic = _topic(bootstrap, 1, 20, "negts")
    for ms in (-1, -2, -3, -5, -6, -7, -1000):
        for op in (">=", ">"):
            df = _pruning(spark, bootstrap, subscribe=topic)
            got = df.where(f"timestamp {op} timestamp_millis({ms})").count()
            assert got == 20, f"timestamp {op} {ms} ms: {got} rows"


def test_a_partition_filter_keeps_the_other_partitions_checks(spark, broker, pushdown_conf) -> None:  # type: ignore[no-untyped-def]
    """Spark's source plans and checks every partition (it has no pushdown): offsets of
    another partition that retention removed fail the query (failOnDataLoss), and so does
    a start after the end, whatever the filter says."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    bootstrap = broker.bootstrap
    topic = _topic(bootstrap, 2, 10, "lossp")
    assert wait_high_watermark(bootstrap, topic, 10, partition=1)[1] == 10
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for fut in admin.delete_records([TopicPartition(topic, 1, 5)]).values():
        fut.result(30)
    starting = f'{{"{topic}": {{"0": 0, "1": 0}}}}'
    df = _pruning(spark, bootstrap, subscribe=topic, startingOffsets=starting)
    with pytest.raises(Exception, match=r"offsets 0\.\.4 are gone"):
        df.where("partition = 0").count()
    lenient = _pruning(
        spark, bootstrap, subscribe=topic, startingOffsets=starting, failOnDataLoss="false"
    )
    assert lenient.where("partition = 0").count() == 10
    ending = f'{{"{topic}": {{"0": 10, "1": 6}}}}'
    after_end = _pruning(
        spark,
        bootstrap,
        subscribe=topic,
        startingOffsets=f'{{"{topic}": {{"0": 0, "1": 9}}}}',
        endingOffsets=ending,
    )
    with pytest.raises(Exception, match="after the ending offset"):
        after_end.where("partition = 0").count()


def test_a_write_without_any_topic_is_refused_before_writing(spark, broker, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Neither a ``topic`` option nor a ``topic`` column: Spark's Kafka sink refuses the
    write from its schema before writing (KafkaWriter.validateQuery), batch and streaming,
    even with no rows to write."""
    bootstrap = broker.bootstrap
    empty = spark.createDataFrame([], "value STRING")
    with pytest.raises(Exception, match="topic option required"):
        empty.write.format("stonemq").option("kafka.bootstrap.servers", bootstrap).mode(
            "append"
        ).save()
    source = _topic(bootstrap, 1, 0, "notopic")
    started = time.monotonic()
    with pytest.raises(Exception, match="topic option required"):
        query = (
            spark.readStream.format("stonemq")
            .option("kafka.bootstrap.servers", bootstrap)
            .option("subscribe", source)
            .load()
            .select("value")
            .writeStream.format("stonemq")
            .option("kafka.bootstrap.servers", bootstrap)
            .option("checkpointLocation", str(tmp_path / "ckpt"))
            .start()
        )
        try:
            query.awaitTermination(30)
        finally:
            query.stop()
    assert time.monotonic() - started < 30  # refused at the start, not at a first batch


def test_progress_reports_the_latest_offset_the_query_is_behind(spark, broker, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Spark's Kafka source reports the log ends it read (reportLatestOffset), so a query
    held back by maxOffsetsPerTrigger shows how far behind it is in its progress
    (``latestOffset``, the usual lag watch); it was null."""
    bootstrap = broker.bootstrap
    topic = _topic(bootstrap, 1, 50, "lag")
    query = (
        spark.readStream.format("stonemq")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "10")
        .load()
        .writeStream.format("noop")
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(processingTime="0 seconds")
        .start()
    )
    try:
        deadline = time.monotonic() + 120
        progress = None
        while progress is None and time.monotonic() < deadline:
            for p in query.recentProgress:
                if p.numInputRows:
                    progress = p
                    break
            time.sleep(0.2)
        assert progress is not None, "no micro-batch read anything"
        (source,) = progress.sources
        assert json.loads(source.latestOffset) == {topic: {"0": 50}}
        assert json.loads(source.endOffset) == {topic: {"0": 10}}
    finally:
        query.stop()


def test_a_batch_dataframe_reads_from_the_log_start_at_each_query(spark, broker) -> None:  # type: ignore[no-untyped-def]
    """startingOffsets=earliest (the batch default, and -2 in JSON) is resolved by each task
    when it runs, as Spark's KafkaSourceRDD does: a DataFrame kept while DeleteRecords (or
    retention) moves the log start reads from the new start. Its plan kept the old start,
    and the next query failed as data loss ("offsets ... are gone")."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    bootstrap = broker.bootstrap
    topic = _topic(bootstrap, 2, 10, "early")
    df = _reader(spark, bootstrap, subscribe=topic).load()
    by_json = _reader(
        spark, bootstrap, subscribe=topic, startingOffsets=f'{{"{topic}": {{"0": -2, "1": 2}}}}'
    ).load()
    assert df.count() == 20
    assert by_json.count() == 18
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for result in admin.delete_records([TopicPartition(topic, 0, 4)]).values():
        assert result.result(30).low_watermark == 4
    assert df.count() == 16
    assert sorted(r.offset for r in df.where("partition = 0").collect()) == list(range(4, 10))
    assert by_json.count() == 14


def test_a_batch_dataframe_reads_partitions_added_since_its_plan(spark, broker) -> None:  # type: ignore[no-untyped-def]
    """Spark's Kafka source plans each query, so a kept DataFrame over a subscription reads
    partitions (and, with a pattern, topics) created since; PySpark reused the first plan and
    never read them. A read from earliest to latest gets one more task that reads what its
    subscription selects beyond the plan, each partition from its log start to its end."""
    from confluent_kafka.admin import AdminClient, NewPartitions

    bootstrap = broker.bootstrap
    topic = _topic(bootstrap, 1, 5, "grow")
    prefix = unique_topic("pat")
    first = _topic(bootstrap, 1, 3, f"{prefix}-a")
    df = _reader(spark, bootstrap, subscribe=topic).load()
    by_pattern = _reader(spark, bootstrap, subscribePattern=f"{prefix}-.*").load()
    assigned = _reader(spark, bootstrap, assign=f'{{"{topic}": [0]}}').load()
    assert (df.count(), by_pattern.count(), assigned.count()) == (5, 3, 5)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_partitions([NewPartitions(topic, 3)])[topic].result(30)
    for p in (1, 2):
        produce(bootstrap, topic, sample_messages(4, tag=f"grow{p}"), partition=p)
        assert wait_high_watermark(bootstrap, topic, 4, partition=p)[1] == 4
    second = _topic(bootstrap, 2, 2, f"{prefix}-b")
    assert df.count() == 13
    assert sorted(r.partition for r in df.collect()) == [0] * 5 + [1] * 4 + [2] * 4
    assert by_pattern.count() == 7
    assert {r.topic for r in by_pattern.collect()} == {first, second}
    assert assigned.count() == 5  # assign names its partitions: no others
