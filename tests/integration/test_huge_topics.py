"""Topics of many partitions: created and deleted in bounded steps while other clients are
served (reproduced defect 6 of the hostile-input issue), and the partition limits
``max.partitions`` and ``max.partitions.per.request`` (POLICY_VIOLATION)."""

from __future__ import annotations

import threading
import time

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic
from kio.static.primitive import i16, i32

from .helpers import admin, create_topic
from .rawclient import RawConnection, build, ms, schema

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

POLICY_VIOLATION = 44
REQUEST_TIMED_OUT = 7


class Prober:
    """ApiVersions from its own connection every 10 ms: the slowest answer."""

    def __init__(self, broker) -> None:  # type: ignore[no-untyped-def]
        self.broker = broker
        self.times: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run)

    def _run(self) -> None:
        with RawConnection(self.broker.host, self.broker.port, timeout=60) as conn:
            while not self._stop.is_set():
                start = time.monotonic()
                conn.api_versions()
                self.times.append(time.monotonic() - start)
                time.sleep(0.01)

    def __enter__(self) -> Prober:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def error_code(future) -> int:  # type: ignore[no-untyped-def]
    with pytest.raises(Exception) as err:
        future.result(timeout=60)
    return err.value.args[0].code()


def test_a_request_for_300000_partitions_is_refused_at_once(module_broker) -> None:
    """Reproduced: a 38-byte CreateTopics for 300,000 partitions held the event loop 15.7 s
    and took 45.7 s to answer. Now max.partitions.per.request refuses it, at once."""
    req = schema("create_topics", 5, "request")
    request = build(
        req.CreateTopicsRequest,
        topics=(
            build(
                req.CreatableTopic,
                name="three-hundred-k",
                num_partitions=i32(300_000),
                replication_factor=i16(-1),
                assignments=(),
                configs=(),
            ),
        ),
        timeout=ms(30_000),
        validate_only=False,
    )
    start = time.monotonic()
    with RawConnection(module_broker.host, module_broker.port) as conn:
        answer = conn.request(request, schema("create_topics", 5, "response").CreateTopicsResponse)
    assert answer.topics[0].error_code == POLICY_VIOLATION
    assert time.monotonic() - start < 5
    topic = create_topic(module_broker.bootstrap)
    req = schema("create_partitions", 1, "request")
    grow = build(
        req.CreatePartitionsRequest,
        topics=(
            build(req.CreatePartitionsTopic, name=topic, count=i32(300_001), assignments=None),
        ),
        timeout=ms(30_000),
        validate_only=False,
    )
    with RawConnection(module_broker.host, module_broker.port) as conn:
        answer = conn.request(
            grow, schema("create_partitions", 1, "response").CreatePartitionsResponse
        )
    assert answer.results[0].error_code == POLICY_VIOLATION


@pytest.mark.broker_settings(**{"max.partitions": 100})
def test_max_partitions_bounds_the_broker(broker) -> None:
    client = admin(broker.bootstrap)
    client.create_topics([NewTopic("first", num_partitions=80)])["first"].result(timeout=30)
    futures = client.create_topics([NewTopic("second", num_partitions=30)])
    assert error_code(futures["second"]) == POLICY_VIOLATION
    assert error_code(client.create_partitions([NewPartitions("first", 130)])["first"]) == (
        POLICY_VIOLATION
    )
    client.create_topics([NewTopic("third", num_partitions=20)])["third"].result(timeout=30)


@pytest.mark.slow
def test_creating_and_deleting_a_huge_topic_never_stalls_other_clients(broker) -> None:
    """Reproduced: deleting a 386,184-partition topic froze the broker for 6.5 minutes.
    Creation and deletion of a 20,000-partition topic now run in steps (the metadata
    store's commit in its thread, directories in the directory thread): another client's
    ApiVersions stays well under a second throughout, and the name is free again once the
    DeleteTopics answer arrives."""
    client = AdminClient({"bootstrap.servers": broker.bootstrap, "socket.timeout.ms": 180_000})
    with Prober(broker) as prober:
        client.create_topics(
            [NewTopic("huge", num_partitions=20_000)], operation_timeout=120, request_timeout=180
        )["huge"].result(timeout=200)
        client.delete_topics(["huge"], operation_timeout=120, request_timeout=180)["huge"].result(
            timeout=200
        )
        client.create_topics([NewTopic("huge", num_partitions=3)])["huge"].result(timeout=60)
    assert prober.times
    slowest = max(prober.times)
    print(f"slowest ApiVersions {slowest:.3f} s over {len(prober.times)} probes")
    assert slowest < 1.0, f"another client waited {slowest:.2f} s"


def test_auto_creating_thousands_of_topics_never_stalls_other_clients(broker) -> None:
    """Reproduced (an independent hostile-client campaign): one request naming 5,000 new
    topics was answered at once, and then the broker answered no one for 4-6 s: each topic's
    auto-creation task planned its topic on the loop before it first waited, all of them in
    the same turn; and max.partitions was checked against a sum over every topic, so 10,000
    more beside 5,000 froze it for 38 s. Now a few plan at a time, against a running total:
    another client's ApiVersions stays well under a second until every topic exists. (The
    campaign's request was a Produce; as in Kafka, only Metadata auto-creates now.)"""
    metadata = schema("metadata", 12, "request")
    request = metadata.MetadataRequest(
        topics=tuple(
            metadata.MetadataRequestTopic(name=f"auto-{i}", topic_id=None) for i in range(3000)
        ),
        allow_auto_topic_creation=True,
        include_topic_authorized_operations=False,
    )
    with Prober(broker) as prober:
        with RawConnection(broker.host, broker.port, timeout=180) as conn:  # once all exist
            conn.request(request, schema("metadata", 12, "response").MetadataResponse)
        deadline = time.monotonic() + 120
        while (
            len(AdminClient({"bootstrap.servers": broker.bootstrap}).list_topics(timeout=30).topics)
            < 3000
        ):
            assert time.monotonic() < deadline, "the topics were not all created"
            time.sleep(0.5)
    slowest = max(prober.times)
    print(f"slowest ApiVersions {slowest:.3f} s over {len(prober.times)} probes")
    assert slowest < 1.0, f"another client waited {slowest:.2f} s"


@pytest.mark.slow
def test_metadata_of_a_huge_topic_never_stalls_other_clients(broker) -> None:
    """A Metadata answer for a 20,000-partition topic is a quarter second of Python; a client
    pipelining twenty of them (none read) held the loop for five. Large answers are built and
    encoded in a thread: another client's ApiVersions stays under a second."""
    client = AdminClient({"bootstrap.servers": broker.bootstrap, "socket.timeout.ms": 180_000})
    client.create_topics(
        [NewTopic("wide", num_partitions=20_000)], operation_timeout=120, request_timeout=180
    )["wide"].result(timeout=200)
    mod = schema("metadata", 9, "request")
    request = build(
        mod.MetadataRequest,
        topics=(build(mod.MetadataRequestTopic, name="wide"),),
        allow_auto_topic_creation=False,
        include_cluster_authorized_operations=False,
        include_topic_authorized_operations=False,
    )
    with Prober(broker) as prober, RawConnection(broker.host, broker.port) as hog:
        for _ in range(20):
            hog.send_request(request)
        time.sleep(6)
    slowest = max(prober.times)
    assert slowest < 1.0, f"another client waited {slowest:.2f} s"


def _request_and_hang_up(broker, request) -> None:  # type: ignore[no-untyped-def]
    """Send ``request`` and close the connection without reading the answer."""
    with RawConnection(broker.host, broker.port) as conn:
        conn.send_request(request)


def test_a_topic_change_runs_to_its_end_when_its_client_hangs_up(broker) -> None:
    """Found by the long fuzz run: a client that disconnects cancels its requests, and a
    DeleteTopics (or CreateTopics, CreatePartitions) cut between the store's commit and
    storage's last step left partitions of the deleted topic registered in storage; growing
    a new topic of that name then failed with a traceback. A change now runs to its end."""
    client = AdminClient({"bootstrap.servers": broker.bootstrap})
    create_topic(broker.bootstrap, "hangup", partitions=4000)
    req = schema("delete_topics", 4, "request")
    delete = build(req.DeleteTopicsRequest, topic_names=("hangup",), timeout=ms(30_000))
    _request_and_hang_up(broker, delete)
    deadline = time.monotonic() + 60
    while True:  # the name is taken ("marked for deletion") until the deletion ends
        try:
            client.create_topics([NewTopic("hangup", num_partitions=1)])["hangup"].result(30)
            break
        except Exception:
            assert time.monotonic() < deadline, "the deleted topic's name never came free"
            time.sleep(0.2)
    req = schema("create_partitions", 1, "request")
    grow = build(
        req.CreatePartitionsRequest,
        topics=(
            build(req.CreatePartitionsTopic, name="hangup", count=i32(4000), assignments=None),
        ),
        timeout=ms(30_000),
        validate_only=False,
    )
    _request_and_hang_up(broker, grow)
    deadline = time.monotonic() + 60
    while len(client.list_topics("hangup", timeout=10).topics["hangup"].partitions) < 4000:
        assert time.monotonic() < deadline, "the growth never finished"
        time.sleep(0.2)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 50})
    for p in (0, 1999, 3999):
        producer.produce("hangup", value=b"after", partition=p)
    assert producer.flush(30) == 0
    end = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "hangup"})
    for p in (0, 1999, 3999):
        low, high = end.get_watermark_offsets(TopicPartition("hangup", p), timeout=10)
        assert (low, high) == (0, 1), p
    end.close()
    assert "Traceback" not in broker.log()


def test_delete_topics_answers_by_its_timeout_and_the_deletion_goes_on(broker) -> None:
    """Found by an independent hostile-client campaign: DeleteTopics ignored its timeout_ms
    (a 50,000-partition topic answered after 24-44 s). As Kafka, a topic not deleted by the
    deadline is REQUEST_TIMED_OUT at the deadline, and its deletion goes on to the end (a
    deletion done in time is answered NONE: every other DeleteTopics test)."""
    create_topic(broker.bootstrap, "slow-to-go", partitions=20_000)
    req = schema("delete_topics", 4, "request")
    resp = schema("delete_topics", 4, "response").DeleteTopicsResponse
    delete = build(req.DeleteTopicsRequest, topic_names=("slow-to-go",), timeout=ms(100))
    start = time.monotonic()
    with RawConnection(broker.host, broker.port, timeout=60) as conn:
        answer = conn.request(delete, resp)
    took = time.monotonic() - start
    errors = {r.name: r.error_code for r in answer.responses}
    assert errors == {"slow-to-go": REQUEST_TIMED_OUT}, (errors, took)
    assert took < 3.0, took
    client = AdminClient({"bootstrap.servers": broker.bootstrap})
    deadline = time.monotonic() + 120
    while "slow-to-go" in client.list_topics(timeout=30).topics:
        assert time.monotonic() < deadline, "the deletion did not go on"
        time.sleep(0.2)
    while True:  # and the name comes free once its directories are gone
        try:
            client.create_topics([NewTopic("slow-to-go", num_partitions=1)])["slow-to-go"].result(
                30
            )
            break
        except Exception:
            assert time.monotonic() < deadline, "the deleted topic's name never came free"
            time.sleep(0.2)
    assert "Traceback" not in broker.log()


@pytest.mark.slow
def test_a_stop_during_a_huge_deletion_does_not_wait_for_it(broker) -> None:
    """Found by the long fuzz run: a stop while a 100,000-partition topic was being deleted
    waited for every directory (the deletion held the checkpoint lock the stop takes), 7 s and
    more, past the stop timeout. The stop now waits for one chunk of directories; the next
    start sets the rest aside, and the name is free."""
    # created, then waited for by its directories: a Metadata answer listing 100,000
    # partitions took more than the helper's 10 s per call on a machine at load 9 (CI).
    # 40,000: 2 s into their deletion about 27,000 are left (87,000 of 100,000 in a run)
    doomed = 40_000
    client = admin(broker.bootstrap)
    client.create_topics([NewTopic("doomed", num_partitions=doomed)])["doomed"].result(60)
    queues = broker.data_dir / "queues"
    deadline = time.monotonic() + 120
    while sum(1 for _ in queues.iterdir()) < doomed:  # every directory made ahead
        assert time.monotonic() < deadline, "the topic's directories were not all made"
        time.sleep(0.5)
    req = schema("delete_topics", 4, "request")
    delete = build(req.DeleteTopicsRequest, topic_names=("doomed",), timeout=ms(60_000))
    _request_and_hang_up(broker, delete)
    time.sleep(2.0)  # its directories are being deleted
    broker.stop()
    log = broker.log(since_start=True)
    closed = [line for line in log.splitlines() if "storage closed in" in line]
    assert closed, log[-2000:]
    took = float(closed[-1].split("storage closed in ")[1].split(" s")[0])
    assert took < 1.5, f"the stop waited for the deletion: {closed[-1]}"
    broker.start()
    client = AdminClient({"bootstrap.servers": broker.bootstrap})
    assert "doomed" not in client.list_topics(timeout=10).topics
    client.create_topics([NewTopic("doomed", num_partitions=2)])["doomed"].result(30)
    left = [p.name for p in (broker.data_dir / "queues").iterdir() if p.name.startswith("doomed")]
    assert sorted(n for n in left if not n.endswith(".stray")) == ["doomed-0", "doomed-1"]
    assert any(n.endswith(".stray") for n in left), "the stop came after the deletion ended"
