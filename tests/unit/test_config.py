"""Settings precedence: flag beats env beats file beats default; Kafka names in the file."""

from pathlib import Path

import pytest

from stonemq.config import load_settings, split_host_port


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
