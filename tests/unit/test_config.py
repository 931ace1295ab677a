"""Settings precedence: flag beats env beats file beats default; Kafka names in the file."""

import socket
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stonemq.config import Endpoint, load_settings, parse_listeners, split_host_port


def test_precedence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "broker.toml"
    config.write_text('num.partitions = 3\nlog.retention.ms = 5000\nlisten = "0.0.0.0:1"\n')
    assert load_settings(config).num_partitions == 3
    monkeypatch.setenv("STONEMQ_NUM_PARTITIONS", "5")
    settings = load_settings(config)
    assert settings.num_partitions == 5 and settings.log_retention_ms == 5000
    assert load_settings(config, num_partitions=7).num_partitions == 7
    assert load_settings(None).log_retention_ms == 7 * 24 * 3600 * 1000


def test_nested_tables_and_unknown_keys(tmp_path: Path) -> None:
    config = tmp_path / "broker.toml"
    config.write_text("[log.retention]\nms = 10\n")
    assert load_settings(config).log_retention_ms == 10
    config.write_text("no.such.setting = 1\n")
    with pytest.raises(ValueError, match="unknown setting"):
        load_settings(config)


def test_directories_default_under_data_dir(tmp_path: Path) -> None:
    settings = load_settings(None, data_dir=tmp_path)
    assert settings.journal_path == tmp_path / "journal"
    assert settings.queue_path == tmp_path / "queues"


@pytest.mark.parametrize("bad", ["nohost", "host:", ":9092", "h:99999", "h:port"])
def test_bad_addresses(bad: str) -> None:
    with pytest.raises(ValueError):
        split_host_port(bad)


# -- listeners (Kafka's form) and the listen / advertise aliases ------------------------------
names = st.from_regex(r"[A-Z][A-Z0-9_]{0,10}", fullmatch=True)
hosts = st.one_of(
    st.just(""),
    st.from_regex(r"[a-z][a-z0-9\-]{0,10}(\.[a-z0-9]{1,5}){0,2}", fullmatch=True),
    st.ip_addresses().map(str),
)


@given(st.lists(st.tuples(names, hosts, st.integers(1, 65535)), min_size=1, max_size=4))
def test_listeners_round_trip(entries: list[tuple[str, str, int]]) -> None:
    names_seen = [n for n, _, _ in entries]
    ports = [p for _, _, p in entries]
    endpoints = [Endpoint(n, h, p) for n, h, p in entries]
    text = ",".join(str(e) for e in endpoints)
    if len(set(names_seen)) != len(names_seen) or len(set(ports)) != len(ports):
        with pytest.raises(ValueError, match="different"):
            parse_listeners(text)
    else:
        assert parse_listeners(text) == tuple(endpoints)


def test_listener_names_are_normalised_and_the_host_may_be_empty() -> None:
    assert parse_listeners("plaintext://:9092, internal://[::1]:9093") == (
        Endpoint("PLAINTEXT", "", 9092),
        Endpoint("INTERNAL", "::1", 9093),
    )


@pytest.mark.parametrize(
    ("settings", "why"),
    [
        ({"listeners": "127.0.0.1:9092"}, "Unable to parse"),
        ({"listeners": "PLAINTEXT://h:1,PLAINTEXT://h:2"}, "different name"),
        ({"listeners": "PLAINTEXT://h:1,SSL://h:1"}, "different port"),
        ({"listeners": "INTERNAL://h:1"}, "No security protocol defined for listener INTERNAL"),
        ({"listeners": "SSL://h:1"}, "PLAINTEXT listeners only"),
        ({"advertised_listeners": "OTHER://h:1"}, "subset"),
        ({"advertised_listeners": "PLAINTEXT://0.0.0.0:1"}, "nonroutable"),
        ({"listen": "h:1", "listeners": "PLAINTEXT://h:2"}, "alias of listeners"),
    ],
)
def test_bad_listeners(settings: dict[str, str], why: str) -> None:
    with pytest.raises(ValueError, match=why):
        load_settings(None, **settings)


def test_aliases_follow_source_precedence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--listen / STONEMQ_LISTEN / listen in the file are listeners at their own level, so a
    flag of either spelling beats the environment of either, which beats the file."""
    config = tmp_path / "broker.toml"
    config.write_text('listen = "127.0.0.1:1"\nadvertised.listeners = "PLAINTEXT://file:1"\n')
    settings = load_settings(config)
    assert settings.listeners == "PLAINTEXT://127.0.0.1:1"
    assert settings.listen is None and settings.advertise is None
    assert settings.advertised_address == ("file", 1)
    monkeypatch.setenv("STONEMQ_LISTENERS", "PLAINTEXT://127.0.0.1:2")
    monkeypatch.setenv("STONEMQ_ADVERTISE", "env:2")
    settings = load_settings(config)
    assert settings.listen_address == ("127.0.0.1", 2)
    assert settings.advertised_address == ("env", 2)
    settings = load_settings(config, listen="127.0.0.1:3", advertised_listeners="PLAINTEXT://f:3")
    assert settings.listen_address == ("127.0.0.1", 3)
    assert settings.advertised_address == ("f", 3)
    assert settings.model_fields_set >= {"listeners", "advertised_listeners"}


def test_each_listener_has_its_advertised_address() -> None:
    settings = load_settings(
        None,
        listeners="PLAINTEXT://127.0.0.1:1,INTERNAL://:2",
        advertised_listeners="PLAINTEXT://public:11",
        listener_security_protocol_map="PLAINTEXT:PLAINTEXT,INTERNAL:PLAINTEXT",
    )
    assert settings.advertised_for("PLAINTEXT") == ("public", 11)
    # not advertised: its own address, an empty host being this machine's name
    assert settings.advertised_for("INTERNAL") == (socket.getfqdn(), 2)


@pytest.mark.parametrize(
    ("env", "value", "accepted"),
    [
        ("STONEMQ_LOG_SEGMENT_BYTES", "3000000000", False),  # past 2^31 - 1: Kafka's INT
        ("STONEMQ_LOG_SEGMENT_BYTES", str(2**31 - 1), True),
        ("STONEMQ_MESSAGE_MAX_BYTES", "99999999999", False),
        ("STONEMQ_MESSAGE_MAX_BYTES", "0", True),  # Kafka's atLeast(0), as the topic's
        ("STONEMQ_LOG_INDEX_SIZE_MAX_BYTES", "99999999999", False),
        ("STONEMQ_LOG_INDEX_INTERVAL_BYTES", "99999999999", False),
        ("STONEMQ_NUM_PARTITIONS", "3000000000", False),
        ("STONEMQ_SOCKET_REQUEST_MAX_BYTES", "3000000000", False),
        ("STONEMQ_QUEUED_MAX_REQUESTS", "3000000000", False),
        ("STONEMQ_MAX_REQUEST_PARTITION_SIZE_LIMIT", "3000000000", False),
        ("STONEMQ_LOG_RETENTION_MS", str(2**63), False),  # past a LONG
        ("STONEMQ_LOG_RETENTION_MS", str(2**63 - 1), True),
        ("STONEMQ_LOG_RETENTION_BYTES", "100000000000000000000000", False),
    ],
)
def test_whole_number_settings_fit_kafkas_type(
    monkeypatch: pytest.MonkeyPatch, env: str, value: str, accepted: bool
) -> None:
    """A static setting outside Kafka's type for it (INT: 32 bits, LONG: 64) is refused at
    start, as Kafka's ConfigDef refuses it; log.segment.bytes=3000000000 was taken, a
    segment outgrew its offset index's 4-byte positions, the splitter stopped for good and
    recovery failed at every later start (an independent config check)."""
    monkeypatch.setenv(env, value)
    if accepted:
        load_settings(None)
    else:
        with pytest.raises(ValueError, match="is not a number of type"):
            load_settings(None)
