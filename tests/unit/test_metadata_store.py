"""The metadata-store contract, run against both backends: SQLite (the single node) and
ZooKeeper (a cluster; a real ZooKeeper from Debian's package, one chroot per test). The
ZooKeeper-only tests cover what a cluster adds: several brokers' stores seeing each other's
changes through watches, conditional writes that only one of two racing brokers wins,
producer-id blocks that never overlap, and a ZooKeeper restart."""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import zkserver
from hypothesis import given
from hypothesis import strategies as st

from stonemq.metadata.sqlite import PRODUCER_ID_BLOCK, SqliteMetadataStore
from stonemq.metadata.store import (
    ConcurrentChangeError,
    MetadataStore,
    TopicExistsError,
    TopicRecord,
    TopicTable,
    UnknownTopicError,
)
from stonemq.metadata.zookeeper import (
    TOPICS_PATH,
    ZooKeeperMetadataStore,
    decode_mapping,
    encode_mapping,
)
from stonemq.quotas.entity import CLIENT_ID as CLIENT_T
from stonemq.quotas.entity import USER as USER_T

_chroots = itertools.count()


Opener = Callable[..., MetadataStore]


@pytest.fixture(params=["sqlite", pytest.param("zookeeper", marks=pytest.mark.cluster)])
def opener(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Opener]:
    """Opens the same store again each call (a broker restart), ``cluster_id`` passed on."""
    opened: list[MetadataStore] = []
    if request.param == "sqlite":

        def open_store(**kwargs: Any) -> MetadataStore:
            opened.append(SqliteMetadataStore(tmp_path / "metadata.db", **kwargs))
            return opened[-1]
    else:
        server = request.getfixturevalue("zookeeper")
        connect = f"{server.connect}/stonemq-test-{next(_chroots)}"

        def open_store(**kwargs: Any) -> MetadataStore:
            opened.append(ZooKeeperMetadataStore(connect, **kwargs))
            return opened[-1]

    yield open_store
    for store in opened:
        store.close()


def eventually(check: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "not seen in time"
        time.sleep(0.02)


# -- the contract, both backends ----------------------------------------------------------------
def test_topics_survive_reopen(opener: Opener) -> None:
    store = opener()
    a = store.create_topic("a", [0, 1, 2], {"retention.ms": "1000"})
    b = store.create_topic("b", [3], {})
    store.add_partitions("b", [0, 1])
    store.set_topic_configs("a", {"segment.bytes": "2048"})
    store.close()

    store = opener()
    got_a, got_b = store.get_topic("a"), store.get_topic("b")
    assert got_a is not None and got_b is not None
    assert got_a.topic_id == a.topic_id and got_a.journal_partitions == (0, 1, 2)
    assert dict(got_a.configs) == {"segment.bytes": "2048"}
    assert got_b.topic_id == b.topic_id and got_b.journal_partitions == (3, 0, 1)
    assert sorted(t.name for t in store.list_topics()) == ["a", "b"]


@given(
    st.lists(
        st.tuples(st.sampled_from(["create", "grow", "delete"]), st.sampled_from("abc")),
        max_size=30,
    )
)
def test_the_partition_total_follows_every_change(ops: list[tuple[str, str]]) -> None:
    """What max.partitions is checked against: the store keeps the sum of its topics'
    partitions as topics come, grow and go (it was summed over every topic for each topic
    created: quadratic when thousands are auto-created)."""
    table = TopicTable()
    for op, name in ops:
        held = table.get(name)
        if op == "create" and held is None:
            table[name] = TopicRecord(name, uuid.uuid4(), (0, 1))
        elif op == "grow" and held is not None:
            table[name] = TopicRecord(name, held.topic_id, (*held.journal_partitions, 0))
        elif op == "delete" and held is not None:
            if len(name) % 2:
                del table[name]
            else:
                table.pop(name)
        assert table.partitions == sum(r.partitions for r in table.values())
    assert TopicTable(dict(table)).partitions == table.partitions


def test_the_stores_partition_total(opener: Opener) -> None:
    store = opener()
    store.create_topic("a", [0, 1, 2], {})
    store.create_topic("b", [0], {})
    store.add_partitions("b", [1, 2])
    assert store.partition_total() == 6
    store.delete_topic("a")
    assert store.partition_total() == 3
    store.close()
    assert opener().partition_total() == 3  # loaded


def test_create_twice_and_unknown(opener: Opener) -> None:
    store = opener()
    store.create_topic("t", [0], {})
    with pytest.raises(TopicExistsError):
        store.create_topic("t", [1], {})
    assert store.get_topic("t").journal_partitions == (0,)  # type: ignore[union-attr]
    for call in (
        lambda: store.delete_topic("nope"),
        lambda: store.add_partitions("nope", [0]),
        lambda: store.set_topic_configs("nope", {}),
    ):
        with pytest.raises(UnknownTopicError):
            call()


def test_delete_survives_reopen_and_recreate_gets_new_id(opener: Opener) -> None:
    store = opener()
    first = store.create_topic("t", [0, 1], {"retention.ms": "5"})
    assert store.delete_topic("t").topic_id == first.topic_id
    assert store.get_topic("t") is None
    store.close()
    store = opener()
    assert store.get_topic("t") is None
    second = store.create_topic("t", [1], {})
    assert second.topic_id != first.topic_id
    assert store.get_topic("t").configs == {}  # type: ignore[union-attr]


def test_cluster_id_is_stable_and_seeded_once(opener: Opener) -> None:
    store = opener(cluster_id="my-cluster")
    assert store.cluster_id() == "my-cluster"
    store.close()
    store = opener(cluster_id="ignored-once-stored")
    assert store.cluster_id() == "my-cluster"


def test_broker_configs_replace_and_survive(opener: Opener) -> None:
    store = opener()
    assert store.broker_configs() == {}
    store.set_broker_configs({"log.retention.ms": "5", "num.partitions": "3"})
    store.set_broker_configs({"num.partitions": "4"})
    store.close()
    assert opener().broker_configs() == {"num.partitions": "4"}


def test_producer_ids_never_repeat_across_reopen(opener: Opener) -> None:
    seen: set[int] = set()
    for round_ in range(3):
        store = opener()
        for _ in range(PRODUCER_ID_BLOCK + 5 if round_ == 1 else 3):
            pid = store.allocate_producer_id()
            assert pid >= 0 and pid not in seen
            seen.add(pid)
        store.close()
    assert len(seen) == PRODUCER_ID_BLOCK + 11


U_DEFAULT = ((USER_T, None),)
C_A = ((CLIENT_T, "A"),)
U_C = ((CLIENT_T, "c"), (USER_T, "u"))


def test_client_quotas_alter_remove_and_survive(opener: Opener) -> None:
    store = opener()
    assert store.client_quotas() == {}
    after = store.alter_client_quotas(
        {C_A: {"producer_byte_rate": 1048576.0}, U_DEFAULT: {"request_percentage": 50.0}}
    )
    assert after == {
        C_A: {"producer_byte_rate": 1048576.0},
        U_DEFAULT: {"request_percentage": 50.0},
    }
    store.alter_client_quotas(
        {
            C_A: {"consumer_byte_rate": 2048.0, "producer_byte_rate": None},
            U_DEFAULT: {"request_percentage": None},  # its last key: the entity goes
            U_C: {"producer_byte_rate": 10.0},
            ((CLIENT_T, "never"),): {"producer_byte_rate": None},  # removing nothing
        }
    )
    store.close()
    store = opener()
    assert store.client_quotas() == {
        C_A: {"consumer_byte_rate": 2048.0},
        U_C: {"producer_byte_rate": 10.0},
    }


# -- what a cluster adds (ZooKeeper) ------------------------------------------------------------
@pytest.fixture
def two_brokers(zookeeper: zkserver.ZooKeeperServer) -> Iterator[tuple[Any, Any]]:
    connect = f"{zookeeper.connect}/stonemq-test-{next(_chroots)}"
    a = ZooKeeperMetadataStore(connect, broker_id=1)
    b = ZooKeeperMetadataStore(connect, broker_id=2)
    yield a, b
    a.close()
    b.close()


@pytest.mark.cluster
def test_each_broker_sees_the_others_changes(two_brokers: tuple[Any, Any]) -> None:
    a, b = two_brokers
    events: list[tuple[str, Any]] = []
    b.add_listener(lambda name, record: events.append((name, record)))
    created = a.create_topic("t", [0, 1], {"retention.ms": "7"})
    eventually(lambda: b.get_topic("t") == created)
    a.add_partitions("t", [2])
    eventually(lambda: b.get_topic("t").journal_partitions == (0, 1, 2))
    b.set_topic_configs("t", {"retention.ms": "9"})
    eventually(lambda: a.get_topic("t").configs == {"retention.ms": "9"})
    b.delete_topic("t")
    eventually(lambda: a.get_topic("t") is None)
    eventually(lambda: events and events[-1] == ("t", None))
    assert events[0] == ("t", created)


@pytest.mark.cluster
def test_a_topic_list_older_than_a_create_does_not_delete_it(
    two_brokers: tuple[Any, Any],
) -> None:
    """The children watch hands over a topic list read when it fired; a topic this store
    created meanwhile (cached at once) is missing from it. It was taken as deleted: dropped
    from the cache and the listeners told None (a broker then removes the topic's queue
    logs) until a later list brought it back; the store's partition total read 0 with a
    topic alive (the unit test beside other work). A name is dropped only once its node is
    gone: a list missing a deleted topic still drops it."""
    a, b = two_brokers
    events: list[tuple[str, Any]] = []
    a.add_listener(lambda name, record: events.append((name, record)))
    a.create_topic("early", [0], {})
    eventually(lambda: "early" in a._watched)
    created = a.create_topic("new", [0, 1], {})
    a._on_topic_names(["early"])  # a list read before "new" was created, handed over late
    assert a.get_topic("new") == created and a.partition_total() == 3
    assert ("new", None) not in events
    b.delete_topic("early")
    a._on_topic_names(["new"])  # a list without a topic whose node is gone: dropped
    assert a.get_topic("early") is None
    assert ("early", None) in events
    assert a.get_topic("new") == created and a.partition_total() == 2


@pytest.mark.cluster
def test_a_topic_created_while_the_list_is_checked_is_kept(
    two_brokers: tuple[Any, Any],
) -> None:
    """A name missing from the list is looked up in ZooKeeper; a topic this store creates
    during those lookups is missing from the list too. The names to drop were computed again
    over the whole cache after the lookups, so that topic was dropped and its listeners told
    None (an independent review of fe5b9bc). Only names looked up and found gone go."""
    a, _ = two_brokers
    events: list[tuple[str, Any]] = []
    a.add_listener(lambda name, record: events.append((name, record)))
    a.create_topic("early", [0], {})
    a.create_topic("new", [0], {})
    eventually(lambda: "new" in a._watched)
    real_exists = a.client.exists
    created: list[Any] = []

    def exists_while_creating(path: str, *args: Any, **kwargs: Any) -> Any:
        if not created:
            created.append(a.create_topic("during", [0, 1], {}))
        return real_exists(path, *args, **kwargs)

    a.client.exists = exists_while_creating
    try:
        a._on_topic_names(["early"])  # "new" missing: looked up, alive
    finally:
        a.client.exists = real_exists
    assert created and a.get_topic("during") == created[0]
    assert ("during", None) not in events and ("new", None) not in events
    assert a.partition_total() == 4


@pytest.mark.cluster
def test_of_two_racing_conditional_writes_one_wins(two_brokers: tuple[Any, Any]) -> None:
    """Both brokers grow the topic from the same version: one write lands, the other gets
    ConcurrentChangeError (it would have appended to a mapping it never saw); re-read, it
    succeeds. Same for configs."""
    a, b = two_brokers
    a.create_topic("t", [0], {})
    eventually(lambda: b.get_topic("t") is not None)
    b._watched["t"] = -1  # freeze b's view (its watches stop): it has not seen a's change
    a.add_partitions("t", [1])
    with pytest.raises(ConcurrentChangeError):
        b.add_partitions("t", [2])
    b._reload("t")
    assert b.add_partitions("t", [2]).journal_partitions == (0, 1, 2)
    a._reload("t")
    a.set_topic_configs("t", {"x": "1"})
    with pytest.raises(ConcurrentChangeError):
        b.set_topic_configs("t", {"x": "2"})
    data, _ = a.client.get(f"{TOPICS_PATH}/t")
    assert decode_mapping(__import__("json").loads(data)["journal_partitions"]) == (0, 1, 2)


@pytest.mark.cluster
def test_each_broker_sees_the_others_client_quotas(two_brokers: tuple[Any, Any]) -> None:
    a, b = two_brokers
    seen: list[dict[Any, Any]] = []
    b.add_quota_listener(seen.append)
    eventually(lambda: seen == [{}])  # the watch reports the current state first
    a.alter_client_quotas({C_A: {"producer_byte_rate": 1000.0}})
    eventually(lambda: seen[-1] == {C_A: {"producer_byte_rate": 1000.0}})
    assert b.client_quotas() == {C_A: {"producer_byte_rate": 1000.0}}


@pytest.mark.cluster
def test_racing_client_quota_changes_are_all_kept(two_brokers: tuple[Any, Any]) -> None:
    """Two brokers altering different entities at once: the conditional write of the one
    that loses is redone on the winner's quotas, so neither change is lost."""
    a, b = two_brokers

    def alter(store: Any, name: str) -> None:
        for i in range(20):
            store.alter_client_quotas({((CLIENT_T, f"{name}{i}"),): {"producer_byte_rate": 1.0}})

    threads = [threading.Thread(target=alter, args=(s, n)) for s, n in ((a, "a"), (b, "b"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    quotas = a.client_quotas()
    assert len(quotas) == 40
    assert quotas == b.client_quotas()


@pytest.mark.cluster
def test_racing_broker_config_changes_are_all_kept_and_seen(
    two_brokers: tuple[Any, Any],
) -> None:
    """Two brokers changing different dynamic broker configs at once (IncrementalAlterConfigs
    through each): the loser of a conditional write computes its change again on the
    winner's configs, so neither is lost, and each broker's watch reports the result."""
    a, b = two_brokers
    seen: list[dict[str, str]] = []
    b.add_broker_config_listener("", seen.append)
    eventually(lambda: seen == [{}])  # the watch reports the current state first

    def alter(store: Any, name: str) -> None:
        for i in range(20):
            store.update_broker_configs(lambda current, i=i: {**current, f"{name}{i}": str(i)})

    threads = [threading.Thread(target=alter, args=(s, n)) for s, n in ((a, "a"), (b, "b"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    configs = a.broker_configs()
    assert configs == {
        **{f"a{i}": str(i) for i in range(20)},
        **{f"b{i}": str(i) for i in range(20)},
    }
    assert b.broker_configs() == configs
    eventually(lambda: seen[-1] == configs)
    a.set_broker_configs({"num.partitions": "3"}, "2")  # broker 2's own: another node
    assert b.broker_configs("2") == {"num.partitions": "3"}
    assert b.broker_configs() == configs


@pytest.mark.cluster
def test_two_brokers_never_hand_out_the_same_producer_id(two_brokers: tuple[Any, Any]) -> None:
    got: dict[int, list[int]] = {1: [], 2: []}

    def allocate(store: Any, key: int) -> None:
        for _ in range(3 * PRODUCER_ID_BLOCK + 7):
            got[key].append(store.allocate_producer_id())

    pairs = zip(two_brokers, got, strict=True)
    threads = [threading.Thread(target=allocate, args=pair) for pair in pairs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    everything = got[1] + got[2]
    assert len(set(everything)) == len(everything) == 2 * (3 * PRODUCER_ID_BLOCK + 7)


@pytest.mark.cluster
def test_a_chroot_is_created_and_isolated(zookeeper: zkserver.ZooKeeperServer) -> None:
    one = ZooKeeperMetadataStore(f"{zookeeper.connect}/isolated/{uuid.uuid4().hex}")
    two = ZooKeeperMetadataStore(f"{zookeeper.connect}/isolated/{uuid.uuid4().hex}")
    try:
        one.create_topic("t", [0], {})
        assert two.get_topic("t") is None
        two.create_topic("t", [1], {})  # no clash
        assert one.get_topic("t").journal_partitions == (0,)  # type: ignore[union-attr]
    finally:
        one.close()
        two.close()


@pytest.mark.cluster
def test_the_store_goes_on_across_a_zookeeper_restart(
    zookeeper: zkserver.ZooKeeperServer, two_brokers: tuple[Any, Any]
) -> None:
    a, b = two_brokers
    a.create_topic("before", [0], {})
    eventually(lambda: b.get_topic("before") is not None)
    zookeeper.restart()
    a.create_topic("after", [1], {})  # retried until the server is back
    # b reconnects on its own schedule: kazoo waits up to the negotiated session timeout (18 s,
    # one host) for a connect answer and 2/3 of it for any other answer before it drops a
    # connection that a restarting server accepted but does not serve, then backs off up to
    # 2 s. A 10 s wait failed in CI (the teardown logged kazoo's "socket time-out during read").
    reconnect_s = 18 + 12 + 2 + 5
    eventually(lambda: b.get_topic("after") is not None, timeout=reconnect_s)
    b.delete_topic("before")
    eventually(lambda: a.get_topic("before") is None, timeout=reconnect_s)


# -- the stored mapping ---------------------------------------------------------------------------
@given(st.lists(st.integers(0, 0xFFFF), max_size=300))
def test_the_journal_mapping_round_trips(mapping: list[int]) -> None:
    assert decode_mapping(encode_mapping(mapping)) == tuple(mapping)


def test_a_100000_partition_topic_node_fits_in_a_zookeeper_node() -> None:
    text = encode_mapping([p % 12 for p in range(100_000)])
    assert len(text) < 300_000  # ZooKeeper's default jute.maxbuffer is 1 MB
    with pytest.raises(ValueError):
        decode_mapping("AAEA")  # three bytes: not whole uint16s


@pytest.mark.cluster
def test_topic_ids_gone_names_deleted_topics_and_brings_the_others(
    two_brokers: tuple[Any, Any],
) -> None:
    """A follower's journal may name topics its watches have not brought yet (audit33 p1):
    ``topic_ids_gone`` reads ZooKeeper for them, caches (and tells the listeners of) those
    that exist, grown ones included, and returns only the ids of deleted topics, one deleted
    and created again under its name included."""
    a, b = two_brokers
    events: list[tuple[str, Any]] = []
    b.add_listener(lambda name, record: events.append((name, record)))
    x = a.create_topic("x", [0], {})
    old_y = a.create_topic("y", [0], {})
    a.delete_topic("y")
    new_y = a.create_topic("y", [0, 1], {})
    grown = a.add_partitions("x", [1])
    never = uuid.UUID(int=12345).bytes
    ids = {x.topic_id.bytes, old_y.topic_id.bytes, new_y.topic_id.bytes, never}
    assert b.topic_ids_gone(ids) == {old_y.topic_id.bytes, never}
    assert b.get_topic("x") == grown and b.get_topic("y") == new_y  # read, not waited for
    assert ("x", grown) in events and ("y", new_y) in events
    assert b.topic_ids_gone({grown.topic_id.bytes}) == set()


@pytest.mark.cluster
def test_a_create_or_delete_whose_commit_lost_its_connection_is_retried_whole(
    two_brokers: tuple[Any, Any],
) -> None:
    """A multi-op commit applied by ZooKeeper whose answer a lost connection cut (the fault
    injected: the first transaction commits, then raises ConnectionLoss) is retried with a
    new transaction, which finds its own first attempt: the create returns its topic and the
    delete succeeds. The same transaction was committed again, and kazoo refused it
    ("Transaction already committed": UNKNOWN_SERVER_ERROR; audit33 p2)."""
    from kazoo.exceptions import ConnectionLoss

    a, b = two_brokers
    real = a.client.transaction
    cut: list[int] = []

    def transaction() -> Any:
        tx = real()
        commit = tx.commit

        def commit_then_lose() -> Any:
            results = commit()
            if not cut:
                cut.append(1)
                raise ConnectionLoss("injected: the answer was lost")
            return results

        tx.commit = commit_then_lose
        return tx

    a.client.transaction = transaction
    try:
        created = a.create_topic("t", [0, 1], {})
        assert cut == [1]
        eventually(lambda: b.get_topic("t") == created)
        cut.clear()
        assert a.delete_topic("t") == created
        assert cut == [1]
        eventually(lambda: b.get_topic("t") is None)
        with pytest.raises(UnknownTopicError):
            a.delete_topic("t")  # a first attempt finding nothing: unknown, as before
    finally:
        a.client.transaction = real
