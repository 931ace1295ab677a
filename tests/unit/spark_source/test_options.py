"""The stonemq data source's pure logic: option parsing (Spark's Kafka source's rules), the
offset JSON of the checkpoint, the cold/Kafka seam, minPartitions splits and the
maxOffsetsPerTrigger rate limit; property tests that ranges cover every offset once."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stonemq.spark import options as so
from stonemq.spark.kafka_io import _client_config
from stonemq.spark.options import ColdPart, OffsetRange, OptionError

BASE = {"kafka.bootstrap.servers": "h:9092"}


def test_defaults_follow_sparks_kafka_source() -> None:
    batch = so.parse({**BASE, "subscribe": "a, b"}, streaming=False)
    assert batch.subscribe == ("a", "b")
    assert (batch.starting.kind, batch.ending.kind) == ("earliest", "latest")
    assert batch.fail_on_data_loss and not batch.include_headers
    stream = so.parse({**BASE, "subscribePattern": "t.*"}, streaming=True)
    assert stream.starting.kind == "latest" and stream.pattern == "t.*"
    assert stream.topic_matches("t1") and not stream.topic_matches("xt1")
    assign = so.parse({**BASE, "assign": '{"b":[1,0],"a":[2]}'}, streaming=False)
    assert assign.assign == (("a", 2), ("b", 0), ("b", 1))


def test_options_are_case_insensitive_and_kafka_options_pass_through() -> None:
    opts = so.parse(
        {
            **BASE,
            "SUBSCRIBE": "t",
            "IncludeHeaders": "TRUE",
            "minpartitions": "8",
            "kafka.isolation.level": "read_committed",
            "stonemq.tier.store.url": "s3://Bucket/Prefix",
            "failOnDataLoss": "false",
            "maxOffsetsPerTrigger": "100",
        },
        streaming=True,
    )
    assert opts.include_headers and opts.min_partitions == 8 and not opts.fail_on_data_loss
    assert opts.consumer_config == {"isolation.level": "read_committed"}
    assert opts.read_committed
    assert opts.store == {"url": "s3://Bucket/Prefix"}
    assert opts.max_offsets_per_trigger == 100


@pytest.mark.parametrize(
    ("options", "streaming", "message"),
    [
        ({"subscribe": "t"}, False, "kafka.bootstrap.servers"),
        (BASE, False, "exactly one of"),
        ({**BASE, "subscribe": "t", "assign": '{"t":[0]}'}, False, "exactly one of"),
        ({**BASE, "subscribe": " , "}, False, "no topics"),
        ({**BASE, "subscribePattern": "("}, False, "subscribePattern"),
        ({**BASE, "assign": "[1]"}, False, "assign must look like"),
        ({**BASE, "subscribe": "t", "startingOffsets": "latest"}, False, "can't be latest"),
        ({**BASE, "subscribe": "t", "startingOffsets": '{"t":{"0":-1}}'}, False, "latest"),
        ({**BASE, "subscribe": "t", "endingOffsets": "earliest"}, False, "can't be earliest"),
        ({**BASE, "subscribe": "t", "endingOffsets": '{"t":{"0":-2}}'}, False, "earliest"),
        ({**BASE, "subscribe": "t", "endingOffsets": "latest"}, True, "not valid in streaming"),
        ({**BASE, "subscribe": "t", "startingOffsets": "{"}, False, "not JSON"),
        ({**BASE, "subscribe": "t", "startingOffsets": '{"t":{"x":1}}'}, False, "not a number"),
        ({**BASE, "subscribe": "t", "startingOffsets": '{"t":{"0":"1"}}'}, False, "integer"),
        ({**BASE, "subscribe": "t", "startingTimestamp": "soon"}, False, "milliseconds"),
        ({**BASE, "subscribe": "t", "minPartitions": "0"}, False, "positive"),
        ({**BASE, "subscribe": "t", "includeHeaders": "yes"}, False, "true or false"),
        ({**BASE, "subscribe": "t", "kafka.auto.offset.reset": "x"}, False, "not supported"),
        ({**BASE, "subscribe": "t", "kafka.enable.auto.commit": "x"}, False, "not supported"),
        ({**BASE, "subscribe": "t", "kafka.key.deserializer": "x"}, False, "not supported"),
        ({**BASE, "subscribe": "t", "kafka.value.deserializer": "x"}, False, "not supported"),
        ({**BASE, "subscribe": "t", "kafka.interceptor.classes": "x"}, True, "not supported"),
        ({**BASE, "subscribe": "t", "minOffsetsPerTrigger": "5"}, True, "not supported"),
        ({**BASE, "subscribe": "t", "maxTriggerDelay": "15m"}, True, "not supported"),
        (
            {**BASE, "subscribe": "t", "startingOffsetsByTimestampStrategy": "x"},
            False,
            "error or latest",
        ),
    ],
)
def test_bad_options_are_refused_with_the_reason(
    options: dict[str, str], streaming: bool, message: str
) -> None:
    with pytest.raises(OptionError, match=message):
        so.parse(options, streaming=streaming)


def test_timestamp_options_win_over_offsets() -> None:
    opts = so.parse(
        {
            **BASE,
            "subscribe": "t",
            "startingOffsets": "earliest",
            "startingOffsetsByTimestamp": '{"t":{"0":5}}',
            "startingTimestamp": "1000",
            "endingOffsetsByTimestamp": '{"t":{"0":9}}',
        },
        streaming=False,
    )
    assert opts.starting == so.Bound("timestamp", timestamp_ms=1000)
    assert opts.ending == so.Bound("by_timestamp", {("t", 0): 9})


def test_sink_options() -> None:
    sink = so.parse_sink({**BASE, "topic": "out", "kafka.linger.ms": "20"})
    assert (sink.topic, sink.producer_config) == ("out", {"linger.ms": "20"})
    with pytest.raises(OptionError, match="idempotent"):
        so.parse_sink({**BASE, "kafka.enable.idempotence": "false"})
    with pytest.raises(OptionError, match="bootstrap"):
        so.parse_sink({"topic": "t"})


def test_offsets_json_round_trip_is_sparks_form() -> None:
    offsets = {("b", 1): 7, ("a", 10): 3, ("a", 2): 0}
    body = so.offsets_json(offsets)
    assert json.dumps(body, sort_keys=True) == '{"a": {"10": 3, "2": 0}, "b": {"1": 7}}'
    assert so.from_offsets_json(json.loads(json.dumps(body))) == offsets


def test_seam_between_archive_and_kafka() -> None:
    cold = ColdPart(10, 50, ((10, 29, "a"), (30, 49, "b")))
    assert so.split_at_seam("t", 0, 0, 100, cold) == [
        OffsetRange("t", 0, 0, 10),  # below the cold log start: Kafka says it is gone
        OffsetRange("t", 0, 10, 50, cold=True, files=cold.files),
        OffsetRange("t", 0, 50, 100),
    ]
    assert so.split_at_seam("t", 0, 35, 40, cold) == [
        OffsetRange("t", 0, 35, 40, cold=True, files=((30, 49, "b"),))
    ]
    assert so.split_at_seam("t", 0, 60, 70, cold) == [OffsetRange("t", 0, 60, 70)]
    assert so.split_at_seam("t", 0, 60, 60, cold) == []
    assert so.split_at_seam("t", 0, 0, 5, None) == [OffsetRange("t", 0, 0, 5)]


ranges_st = st.tuples(
    st.integers(0, 1000), st.integers(0, 1000), st.integers(0, 1000), st.integers(0, 1000)
)


@given(
    ranges_st,
    st.integers(0, 2000),
    st.one_of(st.none(), st.integers(1, 40)),
    st.one_of(st.none(), st.integers(1, 300)),
)
def test_planned_ranges_cover_every_offset_once(
    cold_bounds: tuple[int, int, int, int],
    span: int,
    min_partitions: int | None,
    max_records: int | None,
) -> None:
    start, _, cold_start, cold_len = cold_bounds
    end = start + span
    cold = ColdPart(cold_start, cold_start + cold_len, ((cold_start, cold_start + cold_len, "k"),))
    pieces = so.split_ranges(
        so.split_at_seam("t", 3, start, end, cold if cold_len else None),
        min_partitions,
        max_records,
    )
    covered = [o for r in pieces for o in range(r.start, r.end)]
    assert covered == list(range(start, end))  # in order, no gap, no repeat
    for r in pieces:
        assert r.size > 0 and r.partition == 3
        if r.cold:  # only what the manifest covers is read from Parquet
            assert cold.start_offset <= r.start and r.end <= cold.next_offset
        else:
            assert r.end <= cold.start_offset or r.start >= cold.next_offset or not cold_len
        if max_records:
            assert r.size <= max_records
    if min_partitions and span >= min_partitions:
        assert len(pieces) >= min_partitions


@given(st.lists(st.integers(1, 10_000), min_size=1, max_size=6), st.integers(1, 64))
def test_min_partitions_shares_are_exact_and_proportional(sizes: list[int], wanted: int) -> None:
    """minPartitions parts in all when every range holds its share (no third wave of tasks
    for two halves), each range's parts within one offset of each other."""
    ranges, at = [], 0
    for i, size in enumerate(sizes):
        ranges.append(OffsetRange("t", i, at, at + size))
        at += size
    pieces = so.split_ranges(ranges, wanted)
    total = sum(sizes)
    if len(sizes) < wanted <= total and all(s * wanted >= total for s in sizes):
        assert len(pieces) == wanted
    for i in range(len(sizes)):
        mine = [r.size for r in pieces if r.partition == i]
        assert sum(mine) == sizes[i] and max(mine) - min(mine) <= 1


def test_two_halves_of_a_read_get_equal_tasks() -> None:
    """The bench's archived half: two partitions one offset apart, minPartitions=4."""
    ranges = [OffsetRange("t", 0, 0, 258_395), OffsetRange("t", 1, 0, 258_394)]
    pieces = so.split_ranges(ranges, 4)
    assert [r.partition for r in pieces] == [0, 0, 1, 1]


@given(
    st.dictionaries(
        st.tuples(st.sampled_from("ab"), st.integers(0, 5)),
        st.tuples(st.integers(0, 1000), st.integers(0, 1000)),
        min_size=1,
    ),
    st.integers(1, 3000),
)
def test_rate_limit_shares_the_limit_as_spark_does(
    marks: dict[tuple[str, int], tuple[int, int]], limit: int
) -> None:
    """Spark's KafkaMicroBatchStream.rateLimit: each partition takes the limit times its
    share of what waits, rounded down, a share under one rounded up (no partition with
    something waiting is starved), never past the latest offset; nothing is handed out
    again, so the total is off the limit by at most one offset per partition."""
    start = {tp: min(a, b) for tp, (a, b) in marks.items()}
    latest = {tp: max(a, b) for tp, (a, b) in marks.items()}
    ends = so.rate_limit(start, latest, limit)
    waiting = {tp: latest[tp] - start[tp] for tp in latest}
    total = sum(waiting.values())
    assert set(ends) == set(latest)
    if total <= limit:
        assert ends == latest
        return
    for tp in latest:
        assert start[tp] <= ends[tp] <= latest[tp]
        if waiting[tp]:
            share = limit * waiting[tp] / total
            want = math.ceil(share) if share < 1 else math.floor(share)
            assert ends[tp] - start[tp] == min(waiting[tp], want)
    taken = sum(ends[tp] - start[tp] for tp in latest)
    assert limit - len(latest) <= taken <= limit + len(latest)


def test_a_small_partition_beside_a_backlog_is_not_starved() -> None:
    """2,000 offsets wait on one partition and 1 on another, 100 per micro-batch: the small
    one's offset is in the first micro-batch, as with Spark's source (it was read in the
    twentieth, once the backlog was gone)."""
    ends = so.rate_limit({("t", 0): 0, ("t", 1): 0}, {("t", 0): 2000, ("t", 1): 1}, 100)
    assert ends == {("t", 0): 99, ("t", 1): 1}


@pytest.mark.parametrize(
    ("ending", "message"),
    [
        ("earliest", "can't be earliest for batch queries"),
        ('{"t": {"0": -2}}', "can't be earliest \\(-2\\) in batch"),
    ],
)
def test_load_names_the_batch_reason_for_an_option_wrong_for_both(
    ending: str, message: str
) -> None:
    """``load()`` (the source's schema) checks the options as a batch read and, failing,
    as a stream; wrong for both, it raised the stream's reason ("ending offset options are
    not valid in streaming queries") to a batch user (an independent Spark check)."""
    from stonemq.spark.source import StoneMQDataSource

    source = StoneMQDataSource({**BASE, "subscribe": "t", "endingOffsets": ending})
    with pytest.raises(OptionError, match=message):
        source.schema()


def test_a_group_id_is_taken_as_spark_takes_it() -> None:
    """Spark's Kafka source accepts kafka.group.id (with a warning: it never joins the
    group); the option reaches the source's consumers as their group.id."""
    opts = so.parse({**BASE, "subscribe": "t", "kafka.group.id": "acl-group"}, streaming=True)
    assert opts.consumer_config["group.id"] == "acl-group"
    assert _client_config(opts)["group.id"] == "acl-group"
    prefixed = so.parse({**BASE, "subscribe": "t", "groupIdPrefix": "etl"}, streaming=True)
    assert _client_config(prefixed)["group.id"].startswith("etl-")
