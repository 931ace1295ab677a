"""Topic and cluster ids drawn as Kafka's ``Uuid.randomUuid`` draws them."""

from __future__ import annotations

import uuid

import pytest

from stonemq.metadata import store
from stonemq.metadata.store import random_uuid, uuid_text


def test_an_id_whose_text_starts_with_a_dash_or_a_reserved_id_is_drawn_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    dash = uuid.UUID(bytes=b"\xf8" + bytes(15))  # base64 index 62: "-"
    fine = uuid.UUID(bytes=b"\x10" * 16)
    draws = iter([dash, uuid.UUID(int=0), uuid.UUID(int=1), fine])
    monkeypatch.setattr(store.uuid, "uuid4", lambda: next(draws))
    assert uuid_text(dash).startswith("-")
    assert random_uuid() == fine
    assert uuid_text(fine) == "EBAQEBAQEBAQEBAQEBAQEA"


def test_drawn_ids_never_start_with_a_dash() -> None:
    texts = [uuid_text(random_uuid()) for _ in range(5000)]
    assert all(len(t) == 22 and not t.startswith("-") for t in texts)
