"""Spark suite fixtures: one SparkSession per session (local[2], quiet), a moto S3 server on
loopback, and helpers that run ``stonemq tier`` against a running broker."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ports import free_port  # tests/ (on sys.path: root conftest)

BUCKET = "stonemq-tier-test"

# The Spark suites on the s3:// store (moto) in whole: the long run (README, Testing). CI runs
# the batch reads over archived, local and mixed ranges on s3:// too (the archive cycle of the
# suite's fixture writes them there), and the rest on file:// only: the whole s3:// matrix
# took about 410 s of CI's 45 minutes.
S3_ALL = os.environ.get("STONEMQ_SPARK_S3") == "all"
S3_LONG_RUN = "on the s3:// store in the long run only (STONEMQ_SPARK_S3=all)"


def s3_in_the_long_run(store: str) -> None:
    """Skip this test on the s3:// store unless the long run asked for it (``S3_ALL``)."""
    if store == "s3" and not S3_ALL:
        pytest.skip(S3_LONG_RUN)


def settings_env(settings: dict[str, Any]) -> dict[str, str]:
    """``{"tier.store.url": u}`` -> ``{"STONEMQ_TIER_STORE_URL": u}`` (as the broker fixture)."""
    env = {}
    for name, value in settings.items():
        if isinstance(value, bool):
            value = "true" if value else "false"
        env["STONEMQ_" + name.replace(".", "_").replace("-", "_").upper()] = str(value)
    return env


def _need_java() -> None:
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.fail("the spark suite needs Java 17+ (apt-get install openjdk-17-jre-headless)")


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    _need_java()
    from stonemq.tiering.archive_job import spark_session

    log = tmp_path_factory.mktemp("spark") / "spark.log"
    session = spark_session("local[2]", str(log), app_name="stonemq-tests")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """moto's standalone S3 server on 127.0.0.1 with one bucket; the broker settings that
    point the cold store at it."""
    port = free_port()
    log = tmp_path_factory.mktemp("moto") / "moto.log"
    moto = Path(sys.executable).with_name("moto_server")
    with log.open("wb") as fh:
        proc = subprocess.Popen(
            [str(moto), "-H", "127.0.0.1", "-p", str(port)], stdout=fh, stderr=fh
        )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise AssertionError(f"moto server did not start: {log.read_text()}") from None
                time.sleep(0.2)
        endpoint = f"http://127.0.0.1:{port}"
        import boto3

        boto3.client(
            "s3",
            endpoint_url=endpoint,
            region_name="us-east-1",
            aws_access_key_id="test",
            aws_secret_access_key="test",
        ).create_bucket(Bucket=BUCKET)
        yield {
            "tier.store.url": f"s3://{BUCKET}/archive",
            "tier.s3.endpoint.url": endpoint,
            "tier.s3.region": "us-east-1",
            "tier.s3.access.key.id": "test",
            "tier.s3.secret.access.key": "test",
        }
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


def tier_command(data_dir: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "stonemq", "tier", *args, "--data-dir", str(data_dir)]


def tier_env(settings: dict[str, Any]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STONEMQ_")}
    env.update(settings_env(settings))
    return env


def run_tier(broker: Any, *args: str, timeout: float = 400) -> subprocess.CompletedProcess[str]:
    """``stonemq tier ARGS`` against ``broker``'s data dir and settings; must exit 0."""
    proc = subprocess.run(
        tier_command(broker.data_dir, *args),
        env=tier_env(broker.settings),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, (
        f"tier {args} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    )
    return proc


def spawn_tier_run(broker: Any, log_path: Path) -> subprocess.Popen[bytes]:
    """``stonemq tier run --once`` in its own process group (the JVM and Python workers
    included), so a test can SIGKILL the whole job."""
    with log_path.open("wb") as fh:
        return subprocess.Popen(
            tier_command(broker.data_dir, "run", "--once"),
            env=tier_env(broker.settings),
            stdout=fh,
            stderr=fh,
            start_new_session=True,
        )


def _session_members(sid: int) -> list[int]:
    """Every live process whose session id is ``sid`` (from /proc)."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            if fields[0] != "Z" and int(fields[3]) == sid:  # state, ..., session
                members.append(int(entry))
    return members


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the whole job at once: every process of its session, not only its process
    group (PySpark's daemon puts itself and its Python workers in a group of their own, so a
    worker could outlive the kill and write a staged file after the rerun had cleaned up),
    and wait until none is left."""
    deadline = time.monotonic() + 30
    while True:
        members = _session_members(proc.pid)
        for pid in members:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(0.2)
        if not members and proc.poll() is not None:
            return
        assert time.monotonic() < deadline, f"processes of the killed job left: {members}"
        time.sleep(0.05)
