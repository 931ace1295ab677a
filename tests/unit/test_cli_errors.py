"""The CLI's answers to a wrong address, path or count, run as users run it (a process):
a clear message and a non-zero exit, never an empty "success" or a Python traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(60)


def _stonemq(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return subprocess.run(
        [sys.executable, "-m", "stonemq", *args],
        capture_output=True,
        text=True,
        timeout=50,
        env=env,
    )


def test_storage_check_of_a_missing_data_directory_fails(tmp_path: Path) -> None:
    """A mistyped --data-dir printed "storage check passed: no defect" (exit 0)."""
    missing = tmp_path / "nowhere"
    done = _stonemq("storage", "check", "--data-dir", str(missing))
    assert done.returncode == 2, done
    assert "no StoneMQ data" in done.stderr and "passed" not in done.stdout
    assert not missing.exists()  # nothing made


def test_tier_status_of_a_missing_data_directory_fails(tmp_path: Path) -> None:
    """A mistyped --data-dir showed an empty status table (exit 0)."""
    done = _stonemq("tier", "status", "--data-dir", str(tmp_path / "nowhere"))
    assert done.returncode == 2, done
    assert "no StoneMQ data directory" in done.stderr


@pytest.mark.parametrize(
    "args",
    [
        ("topics", "create", "x", "--partitions", "-3"),
        ("topics", "create", "x", "--replication-factor", "-7"),
        ("topics", "alter", "x", "--partitions", "0"),
    ],
    ids=["partitions", "replication-factor", "alter-partitions"],
)
def test_a_count_out_of_range_is_an_error_not_a_traceback(args: tuple[str, ...]) -> None:
    """confluent-kafka's own range check raised ValueError through the CLI (a traceback)."""
    done = _stonemq(*args, "--bootstrap-server", "127.0.0.1:1")
    assert done.returncode == 2, done
    assert "Traceback" not in done.stderr and "out of expected range" in done.stderr


@pytest.mark.slow
def test_groups_list_without_a_broker_fails() -> None:
    """With no broker at the address, an empty table and exit 0 said "no groups"."""
    done = _stonemq("groups", "list", "--bootstrap-server", "127.0.0.1:1")
    assert done.returncode == 1, done
    assert "list groups" in done.stderr and "group" not in done.stdout


def test_describing_a_missing_topic_fails_and_creates_nothing(module_broker) -> None:  # type: ignore[no-untyped-def]
    """librdkafka's AdminClient allows auto-creation in its Metadata requests by default:
    ``topics describe nosuch`` created ``nosuch`` and described it (exit 0), and a
    ``topics delete`` of a mistyped name then "succeeded". Kafka's tools never create."""
    address = ("--bootstrap-server", module_broker.bootstrap)
    done = _stonemq("topics", "describe", "never-created", *address)
    assert done.returncode == 1, done
    assert "Unknown topic" in done.stderr
    listed = _stonemq("topics", "list", *address)
    assert listed.returncode == 0 and "never-created" not in listed.stdout
    deleted = _stonemq("topics", "delete", "never-created", *address)
    assert deleted.returncode == 1 and "UNKNOWN_TOPIC_OR_PART" in deleted.stderr, deleted


def test_describing_a_missing_group_says_so(module_broker) -> None:  # type: ignore[no-untyped-def]
    """Empty tables under "Group nosuch: DEAD" were all it printed; Kafka's tool says the
    group does not exist (exit 0, as there)."""
    done = _stonemq(
        "groups", "describe", "no-such-group", "--bootstrap-server", module_broker.bootstrap
    )
    assert done.returncode == 0, done
    assert "Consumer group 'no-such-group' does not exist." in done.stderr
    assert "members" not in done.stdout


def test_groups_list_takes_kafkas_state_names_and_refuses_others(module_broker) -> None:  # type: ignore[no-untyped-def]
    """``--state nosuchstate`` listed nothing (exit 0), and Kafka's spelling
    (``PreparingRebalance``) matched nothing either; kafka-consumer-groups.sh refuses a
    state it does not know."""
    address = ("--bootstrap-server", module_broker.bootstrap)
    done = _stonemq("groups", "list", "--state", "nosuchstate", *address)
    assert done.returncode == 2 and "invalid state nosuchstate" in done.stderr, done
    for spelling in ("PreparingRebalance", "Empty", "STABLE", "completing_rebalancing"):
        done = _stonemq("groups", "list", "--state", spelling, "--json", *address)
        assert done.returncode == 0, (spelling, done)


@pytest.mark.parametrize("spec", ["t:x", "t:0,,1"])
def test_a_bad_partition_list_in_reset_offsets_is_a_usage_error(spec: str) -> None:
    """``--topic t:x`` ended in a ValueError traceback (helper-72's audit, p5)."""
    done = _stonemq(
        "groups",
        "reset-offsets",
        "g",
        "--to-earliest",
        "--topic",
        spec,
        "--bootstrap-server",
        "127.0.0.1:1",
    )
    assert done.returncode == 2, done
    assert "Traceback" not in done.stderr and "TOPIC:PARTITION" in done.stderr


def test_tier_status_on_a_damaged_topic_store_fails_in_one_line(tmp_path: Path) -> None:
    """A metadata.db that is not a database: a sqlite3 traceback before."""
    (tmp_path / "queues").mkdir()
    (tmp_path / "metadata.db").write_bytes(b"\xff" * 8192)
    done = _stonemq("tier", "status", "--data-dir", str(tmp_path))
    assert done.returncode == 1, done
    assert "Traceback" not in done.stderr and "metadata.db cannot be read" in done.stderr


@pytest.mark.parametrize("suffix", [".log", ".index", ".timeindex", ".journal"])
def test_dumping_a_missing_file_fails_whatever_its_kind(tmp_path: Path, suffix: str) -> None:
    """A missing .index or .timeindex printed nothing with exit 0, a missing .log exit 2."""
    done = _stonemq("storage", "dump", str(tmp_path / f"00000000000000000000{suffix}"))
    assert done.returncode == 2, done
    assert "No such file or directory" in done.stderr


@pytest.mark.parametrize("address", ["127.0.0.1:99999", "127.0.0.1", "host:port", ":9092"])
def test_a_bootstrap_server_without_a_valid_port_is_a_usage_error(address: str) -> None:
    """librdkafka took port 99999 modulo 65536 (34463) and the error named that port."""
    done = _stonemq("topics", "list", "--bootstrap-server", address)
    assert done.returncode == 2, done
    assert "Invalid url in bootstrap.servers" in done.stderr
