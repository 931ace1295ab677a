"""The ``stonemq`` PySpark data source end to end: real PySpark (local mode), a real broker
with a tiered topic whose first part lives only in the cold store, real clients to compare.

Each test runs twice: cold store on file:// and on s3:// (moto's S3 server). Batch reads of
archived, local and mixed ranges equal a confluent-kafka consumer's read exactly; the
archived part is planned as Parquet reads (no broker fetch); startingTimestamp equals
ListOffsets by time; a batch write is read back by kafka-python and kafkajs; a streaming
query topic -> topic SIGKILLed and restarted from its checkpoint reads every input offset
once; missing topic, unreachable broker and retention-lost offsets give clear errors.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient
from integration.helpers import (
    Msg,
    consume,
    consumer,
    create_topic,
    produce,
    sample_messages,
    unique_topic,
    wait_high_watermark,
)
from kafka import KafkaConsumer
from kafka import TopicPartition as KpTopicPartition
from pyspark.sql.datasource import EqualTo, GreaterThanOrEqual, LessThan, Not

from stonemq.cli.tier import _cycle
from stonemq.config import load_settings
from stonemq.spark import register
from stonemq.spark.options import OffsetRange, parse
from stonemq.spark.source import BatchReader, FilteringBatchReader
from stonemq.tiering import manifest as mf
from stonemq.tiering.cold_store import StoreSpec

from .conftest import kill_group, s3_in_the_long_run

pytestmark = [pytest.mark.spark, pytest.mark.timeout(900)]

BROKER = {"log.retention.check.interval.ms": 300, "queue.checkpoint.interval.ms": 200}
TIERED = {
    "remote.storage.enable": "true",
    "internal.segment.bytes": "16384",
    "local.retention.ms": "0",
}
RECORDS = 900
# the streaming kill test's maxOffsetsPerTrigger: three micro-batches of the 900 records, the
# kill after the first is committed (the second may be planned: its end is in the offset log,
# below 900). Each micro-batch is a Spark job of its own: ten of 97 took 178-281 s in a CI run
# on two workers, five of 181 186-192 s in a serial one
PER_TRIGGER = 301
KILL_AFTER_COMMITS = 1
JS_DIR = Path(__file__).resolve().parents[1] / "js"


def _store_options(settings: dict[str, Any], data_dir: Path) -> dict[str, str]:
    """The reader's cold-store options: the broker's tier.* settings with a stonemq. prefix."""
    flags = {k.replace(".", "_"): v for k, v in settings.items() if k.startswith("tier.")}
    spec = StoreSpec.from_settings(load_settings(None, data_dir=data_dir, **flags))
    out = {"stonemq.tier.store.url": spec.url}
    for name, value in (
        ("stonemq.tier.s3.endpoint.url", spec.s3_endpoint_url),
        ("stonemq.tier.s3.region", spec.s3_region),
        ("stonemq.tier.s3.access.key.id", spec.s3_access_key_id),
        ("stonemq.tier.s3.secret.access.key", spec.s3_secret_access_key),
    ):
        if value:
            out[name] = value
    return out


class Tiered:
    """A broker with a tiered topic whose offsets ``0..archived-1`` are in the cold store
    only, and ``archived..RECORDS-1`` on the broker."""

    def __init__(self, broker: Any, topic: str, msgs: list[Msg], archived: int, store: str) -> None:
        self.store = store  # "file" or "s3"
        self.broker = broker
        self.topic = topic
        self.msgs = msgs
        self.archived = archived
        self.options = {
            "kafka.bootstrap.servers": broker.bootstrap,
            "kafka.default.api.timeout.ms": "20000",
            **_store_options(broker.settings, broker.data_dir),
        }

    def reader(self, spark: Any, **options: str) -> Any:
        r = spark.read.format("stonemq")
        for k, v in {**self.options, **options}.items():
            r = r.option(k, v)
        return r


@pytest.fixture(scope="module", params=["file", "s3"])
def tiered(request, tmp_path_factory, spark) -> Any:  # type: ignore[no-untyped-def]
    # the suite's root conftest (``import conftest`` finds whichever conftest loaded last)
    root = request.config.pluginmanager.get_plugin(str(Path(__file__).parents[1] / "conftest.py"))
    BrokerFactory = root.BrokerFactory

    settings: dict[str, Any] = dict(BROKER)
    if request.param == "s3":
        settings.update(request.getfixturevalue("s3_server"))
    factory = BrokerFactory(tmp_path_factory.mktemp(f"source_{request.param}"))
    broker = factory(**settings)
    try:
        topic = create_topic(broker.bootstrap, unique_topic("src"), config=TIERED)
        msgs = sample_messages(RECORDS, tag="src", null_headers=False)
        half = RECORDS // 2
        small = {"batch.size": 8192, "linger.ms": 0}  # under segment.bytes (RECORD_LIST_TOO_LARGE)
        produce(broker.bootstrap, topic, msgs[:half], **small)
        assert wait_high_watermark(broker.bootstrap, topic, half)[1] == half
        flags = {k.replace(".", "_"): v for k, v in settings.items() if k.startswith("tier.")}
        tier_settings = load_settings(None, data_dir=broker.data_dir, **flags)
        spec = StoreSpec.from_settings(tier_settings)
        _cycle(tier_settings, spec, [topic], spark)
        archived = mf.load(spec.open(), topic, 0).next_offset
        assert RECORDS // 3 < archived < half, f"archived up to {archived}"
        produce(broker.bootstrap, topic, msgs[half:], **small)
        assert wait_high_watermark(broker.bootstrap, topic, RECORDS)[1] == RECORDS
        deadline = time.monotonic() + 30
        folder = Path(broker.data_dir) / "queues" / f"{topic}-0"
        while min(int(p.stem) for p in folder.glob("*.log")) < archived:
            assert time.monotonic() < deadline, "local retention kept archived segments"
            time.sleep(0.2)
        yield Tiered(broker, topic, msgs, archived, request.param)
    finally:
        factory.close()


def _rows(df: Any) -> list[Msg]:
    rows = df.orderBy("offset").collect()
    # a record without headers is null, never an empty list, as Spark's Kafka source shows it
    assert all(r.headers is None or len(r.headers) > 0 for r in rows)
    return [
        Msg(
            r.key,
            r.value,
            () if r.headers is None else tuple((h.key, h.value) for h in r.headers),
            int(r.timestamp.timestamp() * 1000),
            offset=r.offset,
            partition=r.partition,
        )
        for r in rows
    ]


def _consumed(t: Tiered, start: int, end: int) -> list[Msg]:
    got = consume(t.broker.bootstrap, t.topic, RECORDS - start, offset=start, timeout=60)
    return [m for m in got if m.offset < end]


def _assert_rows(got: list[Msg], want: list[Msg]) -> None:
    assert [m.offset for m in got] == [m.offset for m in want]
    assert got == want  # key, value, headers, timestamp


def _plan(t: Tiered, **options: str) -> list[Any]:
    """The planned offset ranges (not the task for partitions added later, whose presence
    test_kafka_parity checks)."""
    reader = BatchReader(parse({**t.options, "subscribe": t.topic, **options}, streaming=False))
    return [p.value for p in reader.partitions() if isinstance(p.value, OffsetRange)]


def test_batch_read_archived_local_and_mixed_ranges(spark, tiered) -> None:  # type: ignore[no-untyped-def]
    t = tiered
    df = t.reader(spark, subscribe=t.topic, includeHeaders="true").load()
    assert df.columns == [
        "key",
        "value",
        "topic",
        "partition",
        "offset",
        "timestamp",
        "timestampType",
        "headers",
    ]
    # mixed: the whole topic, archived part from Parquet, the rest over Kafka
    plan = _plan(t)
    assert [(r.start, r.end, r.cold) for r in plan] == [
        (0, t.archived, True),
        (t.archived, RECORDS, False),
    ]
    everything = _consumed(t, 0, RECORDS)
    assert len(everything) == RECORDS
    _assert_rows(_rows(df), everything)
    types = {(r.topic, r.timestampType) for r in df.select("topic", "timestampType").collect()}
    assert types == {(t.topic, 0)}
    assert df.count() == RECORDS

    # archived only, split over tasks at offsets inside files
    ending = json.dumps({t.topic: {"0": t.archived}})
    plan = _plan(t, endingOffsets=ending, minPartitions="4")
    assert len(plan) == 4 and all(r.cold for r in plan)
    df = t.reader(
        spark, subscribe=t.topic, includeHeaders="true", endingOffsets=ending, minPartitions="4"
    ).load()
    _assert_rows(_rows(df), everything[: t.archived])

    # local only
    start = t.archived + 7
    df = t.reader(
        spark,
        assign=json.dumps({t.topic: [0]}),
        includeHeaders="true",
        startingOffsets=json.dumps({t.topic: {"0": start}}),
    ).load()
    assert not any(r.cold for r in _plan(t, startingOffsets=json.dumps({t.topic: {"0": start}})))
    _assert_rows(_rows(df), _consumed(t, start, RECORDS))

    # mixed with a seam inside a task's range, many tasks
    lo, hi = t.archived // 2, (t.archived + RECORDS) // 2
    df = t.reader(
        spark,
        subscribePattern=t.topic[:-2] + ".*",
        includeHeaders="true",
        startingOffsets=json.dumps({t.topic: {"0": lo}}),
        endingOffsets=json.dumps({t.topic: {"0": hi}}),
        minPartitions="5",
    ).load()
    _assert_rows(_rows(df), everything[lo:hi])

    # with pushdown on (asked for by the read, and Spark's pushdown for Python sources),
    # filters on partition and offset prune the plan; Spark evaluates them all again
    register(spark, filter_pushdown=True)
    reader = FilteringBatchReader(parse({**t.options, "subscribe": t.topic}, streaming=False))
    pushed = [
        EqualTo(("partition",), 0),
        GreaterThanOrEqual(("offset",), lo),
        LessThan(("offset",), hi),
    ]
    assert list(reader.pushFilters(pushed)) == pushed
    assert [(p.value.start, p.value.end) for p in reader.partitions()] == [
        (lo, t.archived),
        (t.archived, hi),
    ]
    df = t.reader(
        spark, subscribe=t.topic, includeHeaders="true", **{"stonemq.filterPushdown": "true"}
    ).load()
    sub = df.where(f"partition = 0 AND offset >= {lo} AND offset < {hi}")
    _assert_rows(_rows(sub), everything[lo:hi])
    assert df.where("partition = 1").count() == 0
    assert df.where(f"offset > {RECORDS - 4}").count() == 3
    # Not, And and Or have no attribute of their own: left to Spark (pushing a Not raised
    # AttributeError, so "partition != 0" failed with pushdown on)
    not_zero = Not(EqualTo(("partition",), 0))
    assert list(reader.pushFilters([not_zero])) == [not_zero]
    assert df.where("partition != 0").count() == 0
    assert df.where("NOT (offset IN (1, 2))").count() == RECORDS - 2

    # a timestamp floor starts the Kafka range at ListOffsets by time (records before that
    # offset are all older); Spark still applies the filter, the result stays exact
    stamp = t.msgs[t.archived + 11].timestamp
    assert stamp is not None
    c = consumer(t.broker.bootstrap)
    try:
        want = c.offsets_for_times([TopicPartition(t.topic, 0, stamp)], timeout=10)[0].offset
    finally:
        c.close()
    assert t.archived < want <= t.archived + 11
    floor = dt.datetime.fromtimestamp(stamp / 1000, dt.UTC)
    reader = FilteringBatchReader(parse({**t.options, "subscribe": t.topic}, streaming=False))
    assert len(list(reader.pushFilters([GreaterThanOrEqual(("timestamp",), floor)]))) == 1
    planned = [p.value for p in reader.partitions() if isinstance(p.value, OffsetRange)]
    kafka = [(r.start, r.end) for r in planned if not r.cold]
    assert kafka == [(want, RECORDS)]
    sub = df.where(f"timestamp >= timestamp_millis({stamp})")
    _assert_rows(_rows(sub), [m for m in everything if (m.timestamp or 0) >= stamp])


def test_starting_timestamp_matches_list_offsets_by_time(spark, tiered) -> None:  # type: ignore[no-untyped-def]
    s3_in_the_long_run(tiered.store)
    t = tiered
    c = consumer(t.broker.bootstrap)
    try:
        for i in (3, t.archived // 2, t.archived + 11, RECORDS - 2):
            stamp = t.msgs[i].timestamp
            assert stamp is not None
            found = c.offsets_for_times([TopicPartition(t.topic, 0, stamp)], timeout=10)
            want = found[0].offset
            df = t.reader(spark, subscribe=t.topic, startingTimestamp=str(stamp)).load()
            offsets = sorted(r.offset for r in df.select("offset").collect())
            assert offsets == list(range(want, RECORDS)), f"startingTimestamp={stamp}"
    finally:
        c.close()
    late = max(m.timestamp or 0 for m in t.msgs) + 60_000
    with pytest.raises(Exception, match="timestamp"):
        t.reader(spark, subscribe=t.topic, startingTimestamp=str(late)).load().count()
    df = t.reader(
        spark,
        subscribe=t.topic,
        startingTimestamp=str(late),
        startingOffsetsByTimestampStrategy="latest",
    ).load()
    assert df.count() == 0


def test_clear_errors(spark, tiered) -> None:  # type: ignore[no-untyped-def]
    s3_in_the_long_run(tiered.store)
    t = tiered
    with pytest.raises(Exception, match=r"no-such-topic.*do not exist"):
        t.reader(spark, subscribe="no-such-topic").load().count()
    started = time.monotonic()
    with pytest.raises(Exception, match=r"no broker reachable at 127\.0\.0\.1:1"):
        spark.read.format("stonemq").option("kafka.bootstrap.servers", "127.0.0.1:1").option(
            "kafka.default.api.timeout.ms", "3000"
        ).option("subscribe", t.topic).load().count()
    assert time.monotonic() - started < 60

    # offsets lost to retention: DeleteRecords moves the log start of a fresh topic
    topic = create_topic(t.broker.bootstrap, unique_topic("lost"))
    msgs = sample_messages(50, tag="lost")
    produce(t.broker.bootstrap, topic, msgs)
    from confluent_kafka import TopicPartition as Tp

    admin = AdminClient({"bootstrap.servers": t.broker.bootstrap})
    for fut in admin.delete_records([Tp(topic, 0, 20)]).values():
        fut.result(30)
    start = json.dumps({topic: {"0": 5}})
    with pytest.raises(Exception, match=r"offsets 5\.\.19 are gone"):
        t.reader(spark, subscribe=topic, startingOffsets=start).load().count()
    df = t.reader(spark, subscribe=topic, startingOffsets=start, failOnDataLoss="false").load()
    assert sorted(r.offset for r in df.select("offset").collect()) == list(range(20, 50))
    # a start past the end fails a batch read either way, as Spark's KafkaSourceRDD asserts
    # (it was read as nothing with failOnDataLoss=false)
    past = json.dumps({topic: {"0": 60}})
    for lose in ("true", "false"):
        with pytest.raises(Exception, match=r"starting offset 60 is after the ending offset 50"):
            t.reader(
                spark, subscribe=topic, startingOffsets=past, failOnDataLoss=lose
            ).load().count()
    extra = json.dumps({topic: {"0": 20, "1": 0}})  # the topic has one partition
    with pytest.raises(Exception, match="must specify all topic partitions"):
        t.reader(spark, subscribe=topic, startingOffsets=extra).load().count()
    # by timestamp too (Spark's KafkaOffsetReader asserts it; the partitions not named were
    # read from earliest)
    two = create_topic(t.broker.bootstrap, unique_topic("two"), partitions=2)
    named = json.dumps({two: {"0": 0}})
    with pytest.raises(Exception, match="must specify all topic partitions"):
        t.reader(spark, subscribe=two, startingOffsetsByTimestamp=named).load().count()
    # a pattern leaves out internal topics only, as a Kafka consumer's does (it left out every
    # topic whose name starts with __)
    under = create_topic(t.broker.bootstrap, "__" + unique_topic("under"))
    produce(t.broker.bootstrap, under, sample_messages(3, tag="under"))
    assert t.reader(spark, subscribePattern="__.*").load().count() == 3
    # an option wrong for any read fails at load(), as with Spark's Kafka source (it failed
    # only once the query ran); one wrong for batch reads only fails when the read plans
    with pytest.raises(Exception, match="exactly one of"):
        t.reader(spark).load()
    with pytest.raises(Exception, match="assign: not JSON"):
        spark.read.format("stonemq").option("kafka.bootstrap.servers", "x:1").option(
            "assign", "{nope"
        ).load()
    latest = t.reader(spark, subscribe=t.topic, startingOffsets="latest").load()
    with pytest.raises(Exception, match="latest"):
        latest.count()


def _kp_read(bootstrap: str, topic: str, partitions: int, count: int) -> list[Any]:
    c = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
    try:
        tps = [KpTopicPartition(topic, p) for p in range(partitions)]
        c.assign(tps)
        c.seek_to_beginning(*tps)
        out: list[Any] = []
        deadline = time.monotonic() + 60
        while len(out) < count and time.monotonic() < deadline:
            for records in c.poll(timeout_ms=500).values():
                out.extend(records)
        return out
    finally:
        c.close()


def test_batch_write_read_back_by_kafka_python_and_kafkajs(spark, tiered) -> None:  # type: ignore[no-untyped-def]
    s3_in_the_long_run(tiered.store)
    t = tiered
    topic = create_topic(t.broker.bootstrap, unique_topic("wr"), partitions=3)
    rows = [
        (
            f"k{i}" if i % 7 else None,
            f"value-{i}",
            i % 3,
            [("h", f"{i}".encode()), ("n", b"")] if i % 2 else [],
        )
        for i in range(300)
    ]
    df = spark.createDataFrame(
        rows,
        "key string, value string, partition int, headers array<struct<key:string,value:binary>>",
    ).repartition(3)
    (
        df.write.format("stonemq")
        .option("kafka.bootstrap.servers", t.broker.bootstrap)
        .option("topic", topic)
        .mode("append")
        .save()
    )
    got = _kp_read(t.broker.bootstrap, topic, 3, len(rows))
    assert len(got) == len(rows)
    seen = sorted(
        (
            r.value.decode(),
            r.key.decode() if r.key is not None else None,
            r.partition,
            [(k, bytes(v)) for k, v in r.headers],
        )
        for r in got
    )
    want = sorted((v, k, p, [(hk, hv) for hk, hv in h]) for k, v, p, h in rows)
    assert seen == want

    if shutil.which("node") is None or not (JS_DIR / "node_modules" / "kafkajs").is_dir():
        pytest.fail("kafkajs not installed (scripts/install-test-deps.sh)")
    spec = {
        "brokers": [t.broker.bootstrap],
        "topic": topic,
        "groupId": unique_topic("g"),
        "expect": len(rows),
    }
    proc = subprocess.run(
        ["node", str(JS_DIR / "kafkajs_groups.js"), json.dumps(spec)],
        capture_output=True,
        timeout=120,
        cwd=JS_DIR,
    )
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    js = json.loads(proc.stdout)
    assert sorted((p, v) for p, _, v in js["records"]) == sorted((p, v) for _, v, p, _ in rows)

    # the sink's column rules
    with pytest.raises(Exception, match="'value' not found"):
        spark.createDataFrame([("a",)], "key string").write.format("stonemq").option(
            "kafka.bootstrap.servers", t.broker.bootstrap
        ).option("topic", topic).mode("append").save()
    # Overwrite is refused, as by Spark's Kafka sink (it appended)
    with pytest.raises(Exception, match="Overwrite is not allowed"):
        spark.createDataFrame([("a",)], "value string").write.format("stonemq").option(
            "kafka.bootstrap.servers", t.broker.bootstrap
        ).option("topic", topic).mode("overwrite").save()
    c = consumer(t.broker.bootstrap)
    try:
        ends = [c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(3)]
    finally:
        c.close()
    assert sum(ends) == len(rows)  # nothing appended


STREAM_SCRIPT = textwrap.dedent(
    """
    import json, sys
    from stonemq.tiering.archive_job import spark_session
    args = json.loads(sys.argv[1])
    spark = spark_session("local[2]", args["log"], app_name="stonemq-stream-test")
    reader = spark.readStream.format("stonemq")
    for k, v in args["options"].items():
        reader = reader.option(k, v)
    query = (
        reader.load()
        .selectExpr("key", "value", "headers")
        .writeStream.format("stonemq")
        .option("kafka.bootstrap.servers", args["bootstrap"])
        .option("topic", args["out"])
        .option("checkpointLocation", args["checkpoint"])
    )
    if args["available_now"]:
        query = query.trigger(availableNow=True)
    else:
        query = query.trigger(processingTime="200 milliseconds")
    query.start().awaitTermination()
    """
)


def _batches(checkpoint: Path, topic: str) -> list[tuple[int, int]]:
    """Each micro-batch's offsets ``[start, end)`` of partition 0, from the checkpoint's
    offset log (batch N reads from batch N-1's end)."""
    ends = []
    folder = checkpoint / "offsets"
    for name in sorted((p.name for p in folder.iterdir() if p.name.isdigit()), key=int):
        lines = (folder / name).read_text().splitlines()
        ends.append(json.loads(lines[-1])[topic]["0"])
    return ends


def test_streaming_topic_to_topic_killed_and_restarted_reads_every_record_once(  # type: ignore[no-untyped-def]
    tiered, tmp_path
) -> None:
    s3_in_the_long_run(tiered.store)
    t = tiered
    out = create_topic(t.broker.bootstrap, unique_topic("sout"))
    checkpoint = tmp_path / "checkpoint"
    script = tmp_path / "stream.py"
    script.write_text(STREAM_SCRIPT)

    def spawn(available_now: bool, log: str) -> subprocess.Popen[bytes]:
        args = {
            "log": str(tmp_path / f"{log}.spark.log"),
            "bootstrap": t.broker.bootstrap,
            "out": out,
            "checkpoint": str(checkpoint),
            "available_now": available_now,
            "options": {
                **t.options,
                "subscribe": t.topic,
                "startingOffsets": "earliest",
                "includeHeaders": "true",
                "maxOffsetsPerTrigger": str(PER_TRIGGER),
            },
        }
        with (tmp_path / f"{log}.out").open("wb") as fh:
            return subprocess.Popen(
                [sys.executable, str(script), json.dumps(args)],
                stdout=fh,
                stderr=fh,
                start_new_session=True,
                env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
            )

    proc = spawn(False, "first")
    deadline = time.monotonic() + 240
    while (
        not (checkpoint / "commits").is_dir()
        or len([p for p in (checkpoint / "commits").iterdir() if p.name.isdigit()])
        < KILL_AFTER_COMMITS
    ):
        assert proc.poll() is None, (tmp_path / "first.out").read_text()
        assert time.monotonic() < deadline, "no micro-batches committed"
        time.sleep(0.1)
    kill_group(proc)
    assert proc.returncode == -9
    before = _batches(checkpoint, t.topic)
    assert before[-1] < RECORDS, "the query had read everything before the kill"

    proc = spawn(True, "second")
    assert proc.wait(300) == 0, (tmp_path / "second.out").read_text()
    ends = _batches(checkpoint, t.topic)
    assert ends[: len(before)] == before  # the restart went on from the checkpoint
    # each batch reads [previous end, end): contiguous from 0 to the end, at most PER_TRIGGER each
    steps = [b - a for a, b in zip([0, *ends], ends, strict=False)]
    assert ends[-1] == RECORDS and all(0 <= s <= PER_TRIGGER for s in steps)

    # every input record is in the output topic; a repeat only from a batch the kill
    # interrupted (the sink is at least once)
    got = consume(t.broker.bootstrap, out, RECORDS, timeout=120)
    want = _consumed(t, 0, RECORDS)
    assert {(m.key, m.value, m.headers) for m in got} == {(m.key, m.value, m.headers) for m in want}
    assert len(got) - len(want) <= PER_TRIGGER


def test_registered_by_name_and_by_register(spark, tiered) -> None:  # type: ignore[no-untyped-def]
    s3_in_the_long_run(tiered.store)
    register(spark)  # idempotent with the automatic lookup of pyspark_stonemq
    t = tiered
    assert t.reader(spark, subscribe=t.topic).load().count() == RECORDS
    out = subprocess.run(
        [sys.executable, "-c", "import pkgutil; print([m.name for m in pkgutil.iter_modules()])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "pyspark_stonemq" in out


def test_streaming_new_partitions_rate_limit_and_data_loss(spark, tiered, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """In this process: Trigger.AvailableNow with maxOffsetsPerTrigger, a restart from the
    checkpoint after partitions were added (the new one read from its start), and a restart
    after retention removed offsets the query still needed (failOnDataLoss)."""
    s3_in_the_long_run(tiered.store)
    t = tiered
    bootstrap = t.broker.bootstrap
    topic = create_topic(bootstrap, unique_topic("grow"))
    produce(bootstrap, topic, sample_messages(10, tag="g0"))
    checkpoint = tmp_path / "ckpt"

    def run(name: str, **extra: str) -> list[tuple[int, int]]:
        """Run the query to the end of what is there; every (partition, offset) written
        so far."""
        reader = spark.readStream.format("stonemq")
        options = {**t.options, "subscribe": topic, "startingOffsets": "earliest", **extra}
        for k, v in options.items():
            reader = reader.option(k, v)
        query = (
            reader.load()
            .writeStream.format("parquet")  # a file sink: committed batches only, resumable
            .option("path", str(tmp_path / "out"))
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(180)
        if query.exception() is not None:
            raise RuntimeError(str(query.exception()))
        rows = spark.read.parquet(str(tmp_path / "out")).select("partition", "offset").collect()
        got = sorted((r.partition, r.offset) for r in rows)
        assert len(got) == len(set(got)), f"{name}: an offset read twice"
        return got

    assert run("grow1", maxOffsetsPerTrigger="3") == [(0, o) for o in range(10)]
    assert len(_batches(checkpoint, topic)) == 4  # 10 offsets, at most 3 a batch

    admin = AdminClient({"bootstrap.servers": bootstrap})
    from confluent_kafka.admin import NewPartitions

    admin.create_partitions([NewPartitions(topic, 2)])[topic].result(30)
    produce(bootstrap, topic, sample_messages(4, tag="g1"), partition=1)
    produce(bootstrap, topic, sample_messages(2, tag="g2"), partition=0)
    first = [(0, o) for o in range(10)]
    new = [(0, 10), (0, 11), (1, 0), (1, 1), (1, 2), (1, 3)]
    assert run("grow2") == sorted(first + new)

    # retention removes offsets 12..14 of partition 0 before the query read them
    produce(bootstrap, topic, sample_messages(5, tag="g3"), partition=0)
    assert wait_high_watermark(bootstrap, topic, 17)[1] == 17
    for fut in admin.delete_records([TopicPartition(topic, 0, 15)]).values():
        fut.result(30)
    with pytest.raises(Exception, match=r"offsets 12\.\.14 are gone"):
        run("grow3")
    assert run("grow4", failOnDataLoss="false") == sorted([*first, *new, (0, 15), (0, 16)])
    # an option not valid in streaming fails the query with its own message (PySpark's runner
    # put "UnboundLocalError: ... 'reader'" in its place when streamReader raised it)
    with pytest.raises(Exception, match="not valid in streaming") as refused:
        run("refused", endingOffsets="latest")
    assert "UnboundLocalError" not in str(refused.value)
