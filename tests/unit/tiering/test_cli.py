"""stonemq tier: a clear error without Java; status on a data dir with nothing tiered."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from stonemq.cli import app
from stonemq.cli.tier import check_spark


def test_missing_java_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    why = check_spark()
    assert why is not None and "Java" in why and "JAVA_HOME" in why
    result = CliRunner().invoke(app, ["tier", "run", "--once", "--data-dir", str(tmp_path)])
    assert result.exit_code == 3
    assert "Java was not found" in result.output


def test_status_with_nothing_tiered(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["tier", "status", "--data-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "last run: never" in result.output
