"""The fuzzing campaign as a test: a short seeded run in the normal suite, a long one on demand.

    STONEMQ_FUZZ_SECONDS   how long to fuzz (default 25)
    STONEMQ_FUZZ_SEED      the seed (default 17; "random" picks one); printed in the report
    STONEMQ_FUZZ_CASE      replay only these cases of the seed (comma-separated indices)
    STONEMQ_FUZZ_FAMILIES  comma-separated mutator families, or "all" (the default)
    STONEMQ_FUZZ_RSS_MB    RSS growth that counts as a finding (default 512)

Long run: ``STONEMQ_FUZZ_SECONDS=3600 STONEMQ_FUZZ_SEED=random .venv/bin/pytest -m fuzz
tests/fuzz -s``.
"""

from __future__ import annotations

import os
import random

import pytest

from .harness import Campaign
from .mutators import FAMILIES

SECONDS = float(os.environ.get("STONEMQ_FUZZ_SECONDS", "25"))
# a crash or a huge-partition case can take a while before the run ends: room for it
pytestmark = [pytest.mark.fuzz, pytest.mark.timeout(int(SECONDS) + 300)]


def _families() -> list[str]:
    wanted = os.environ.get("STONEMQ_FUZZ_FAMILIES", "all")
    if wanted == "all":
        return list(FAMILIES)
    if wanted:
        names = [name.strip() for name in wanted.split(",") if name.strip()]
        unknown = [name for name in names if name not in FAMILIES]
        assert not unknown, f"unknown fuzz families {unknown}; known: {list(FAMILIES)}"
    return names


def _seed() -> str:
    seed = os.environ.get("STONEMQ_FUZZ_SEED", "17")
    return str(random.SystemRandom().getrandbits(32)) if seed == "random" else seed


def test_fuzz_campaign(broker_factory) -> None:
    only = os.environ.get("STONEMQ_FUZZ_CASE")
    broker = broker_factory()
    campaign = Campaign(
        broker, _seed(), _families(), float(os.environ.get("STONEMQ_FUZZ_RSS_MB", "512"))
    )
    print(f"\nfuzz seed {campaign.seed}")
    campaign.setup()
    cases = [int(i) for i in only.split(",")] if only else None
    report = campaign.run(SECONDS, cases)
    print(report.text())
    assert not report.findings, report.text()
