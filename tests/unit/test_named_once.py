"""named_once: a request's partitions taken once each, as Kafka's ordered map of them."""

from __future__ import annotations

from types import SimpleNamespace as NS

from stonemq.handlers.context import named_once


def _groups(*spec: tuple[str, tuple[int, ...]]) -> list[NS]:
    return [NS(name=name, parts=[NS(index=i) for i in indexes]) for name, indexes in spec]


def _take(groups: list[NS]) -> dict[int, object] | None:
    return named_once(groups, lambda g: g.name, lambda g: g.parts, lambda p: p.index)


def test_no_partition_named_twice_changes_nothing() -> None:
    assert _take(_groups(("a", (0,)))) is None
    assert _take(_groups(("a", (0, 1)), ("b", (0,)))) is None


def test_a_partition_named_twice_is_taken_where_first_named_with_its_last_entry() -> None:
    groups = _groups(("a", (0, 1)), ("a", (0,)), ("b", (0,)), ("a", (0,)))
    replace = _take(groups)
    assert replace is not None
    first, one = groups[0].parts
    second, third = groups[1].parts[0], groups[3].parts[0]
    assert replace[id(first)] is third  # the first place, the last entry
    assert replace[id(second)] is None and replace[id(third)] is None
    assert replace[id(one)] is one and replace[id(groups[2].parts[0])] is groups[2].parts[0]
