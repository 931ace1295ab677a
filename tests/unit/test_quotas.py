"""Client-quota logic without a broker: the sampled rate and throttle time against an
independent model of Kafka's ``Rate``/``QuotaUtils`` arithmetic, Kafka's precedence of quota
entities, AlterClientQuotas validation and DescribeClientQuotas filters."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stonemq.quotas.entity import (
    CLIENT_ID,
    IP,
    USER,
    QuotaFilter,
    QuotaRequestError,
    entity_of,
    parse_filter,
    resolve,
    validate_entity,
    validate_value,
)
from stonemq.quotas.manager import QuotaManager
from stonemq.quotas.rate import SampledRate, throttle_time_ms

# -- the rate --------------------------------------------------------------------------------------


def test_a_fresh_rate_divides_by_num_minus_one_windows() -> None:
    rate = SampledRate(11, 1000)
    rate.record(5_000_000, 0)
    # 0 ms elapsed: the window counts as 10 whole windows
    assert rate.measure(0) == pytest.approx(500_000)
    assert rate.window_size_ms(2500) == pytest.approx(2500 + 8 * 1000)


def test_throttle_time_brings_the_rate_back_to_the_bound() -> None:
    rate = SampledRate(11, 1000)
    rate.record(20_000_000, 0)  # 2 MB/s over the 10 s minimum window, bound 1 MB/s
    assert throttle_time_ms(rate, 1_000_000, 0) == 10_000  # (2 - 1) / 1 * 10 s
    assert throttle_time_ms(rate, 2_000_000, 0) == 0


def test_samples_idle_for_the_whole_span_are_forgotten() -> None:
    rate = SampledRate(3, 1000)
    rate.record(1000, 0)
    assert rate.total(2999) == 1000
    assert rate.total(3000) == 0


@st.composite
def _events(draw: st.DrawFn) -> list[tuple[int, float]]:
    gaps = draw(st.lists(st.integers(0, 2500), min_size=1, max_size=60))
    values = draw(st.lists(st.floats(0, 1e7), min_size=len(gaps), max_size=len(gaps)))
    out, now = [], 0
    for gap, value in zip(gaps, values, strict=True):
        now += gap
        out.append((now, value))
    return out


class _Model:
    """Kafka's SampledStat/Rate written out plainly: a list of [start, last, value] samples,
    a circular cursor over num + 1 of them."""

    def __init__(self, num: int, window: int) -> None:
        self.num, self.window = num, window
        self.samples: list[list[float]] = []
        self.cur = 0

    def record(self, value: float, now: int) -> None:
        if not self.samples:
            self.samples.append([now, now, 0.0])
        if now - self.samples[self.cur][0] >= self.window:
            self.cur = (self.cur + 1) % (self.num + 1)
            if self.cur >= len(self.samples):
                self.samples.append([now, now, 0.0])
            else:
                self.samples[self.cur] = [now, now, 0.0]
        self.samples[self.cur][2] += value
        self.samples[self.cur][1] = now

    def rate(self, now: int) -> tuple[float, float]:
        for s in self.samples:
            if now - s[1] >= self.num * self.window:
                s[:] = [now, now, 0.0]
        elapsed = now - min(s[0] for s in self.samples)
        full = elapsed // self.window
        if full < self.num - 1:
            elapsed += (self.num - 1 - full) * self.window
        window = max(elapsed, 1)
        return sum(s[2] for s in self.samples) / (window / 1000), window


@settings(max_examples=300, deadline=None)
@given(
    events=_events(),
    num=st.integers(2, 12),
    window=st.sampled_from([100, 1000, 2000]),
    bound=st.floats(1, 1e7),
)
def test_rate_and_throttle_match_kafkas_arithmetic(
    events: list[tuple[int, float]], num: int, window: int, bound: float
) -> None:
    rate, model = SampledRate(num, window), _Model(num, window)
    for now, value in events:
        rate.record(value, now)
        model.record(value, now)
        observed, span = model.rate(now)
        assert rate.measure(now) == pytest.approx(observed, rel=1e-9, abs=1e-9)
        expected = 0 if observed <= bound else round((observed - bound) / bound * span)
        assert throttle_time_ms(rate, bound, now) == expected


@settings(max_examples=40, deadline=None)
@given(
    bound=st.integers(10_000, 10_000_000),
    share=st.floats(0.01, 1.0),
    num=st.integers(2, 11),
)
def test_a_client_that_waits_out_its_throttle_converges_to_the_quota(
    bound: int, share: float, num: int
) -> None:
    """A greedy client (a link 100 times the quota) that sends requests of up to one window's
    quota whenever it is not throttled averages the bound over a minute (Kafka's model: the
    early burst of num - 1 windows and the one request that overshoots wash out). Requests
    larger than a window's quota are coarser than the samples and may average above it."""
    size = max(1, int(bound * share))
    rate, now, sent = SampledRate(num, 1000), 0.0, 0
    while now < 60_000:
        rate.record(size, now)
        sent += size
        throttle = throttle_time_ms(rate, bound, now)
        now += throttle if throttle > 0 else size / (100 * bound) * 1000
    average = sent / (now / 1000)
    allowance = ((num - 1) * bound + size) / (now / 1000)
    assert bound * 0.8 <= average <= bound * 1.05 + allowance


# -- precedence ------------------------------------------------------------------------------
def _q(*pairs: tuple[str, str | None], value: float) -> tuple:
    return entity_of(pairs), {"producer_byte_rate": value}


LEVELS = [
    ((USER, "u"), (CLIENT_ID, "c")),
    ((USER, "u"), (CLIENT_ID, None)),
    ((USER, "u"),),
    ((USER, None), (CLIENT_ID, "c")),
    ((USER, None), (CLIENT_ID, None)),
    ((USER, None),),
    ((CLIENT_ID, "c"),),
    ((CLIENT_ID, None),),
]
TAGS = [("u", "c"), ("u", "c"), ("u", ""), ("u", "c"), ("u", "c"), ("u", ""), ("", "c"), ("", "c")]


@given(st.sets(st.integers(0, 7), min_size=1))
def test_the_most_specific_configured_quota_wins(levels: set[int]) -> None:
    quotas = dict(_q(*LEVELS[i], value=float(i + 1)) for i in levels)
    best = min(levels)
    assert resolve(quotas, "producer_byte_rate", "u", "c") == (TAGS[best], float(best + 1))
    assert resolve(quotas, "consumer_byte_rate", "u", "c") is None


def test_other_clients_and_keys_do_not_match() -> None:
    quotas = dict([_q((CLIENT_ID, "A"), value=5.0)])
    assert resolve(quotas, "producer_byte_rate", "ANONYMOUS", "B") is None
    assert resolve(quotas, "producer_byte_rate", "ANONYMOUS", "A") == (("", "A"), 5.0)


def test_manager_is_inactive_until_a_quota_of_the_type_exists() -> None:
    manager = QuotaManager()
    assert not (manager.produce_active or manager.fetch_active or manager.request_active)
    manager.update(dict([_q((CLIENT_ID, "A"), value=1000.0)]))
    assert manager.produce_active and not manager.fetch_active and not manager.request_active
    assert manager.record("producer_byte_rate", "ANONYMOUS", "B", 1e9, 0) == 0
    assert manager.live_rates == 0  # an unquoted client costs no rate
    assert manager.record("producer_byte_rate", "ANONYMOUS", "A", 20_000, 0) == 10_000
    assert manager.max_value_in_window("producer_byte_rate", "ANONYMOUS", "A") == 10_000
    manager.update({})
    assert not manager.produce_active
    assert manager.record("producer_byte_rate", "ANONYMOUS", "A", 1e9, 1) == 0


def test_a_throttle_fits_the_int32_of_the_response() -> None:
    manager = QuotaManager(11, 1)
    manager.update({entity_of([(CLIENT_ID, "tiny")]): {"producer_byte_rate": 1.0}})
    assert manager.record("producer_byte_rate", "ANONYMOUS", "tiny", 1e12, 0) == 2**31 - 1


def test_request_quota_throttle_is_bounded_by_one_window() -> None:
    manager = QuotaManager(11, 1)
    manager.update({entity_of([(USER, None)]): {"request_percentage": 1.0}})
    assert manager.record("request_percentage", "ANONYMOUS", "x", 1e6, 0) == 1000


def test_idle_rates_are_dropped() -> None:
    manager = QuotaManager(2, 1)
    manager.update({entity_of([(CLIENT_ID, None)]): {"consumer_byte_rate": 100.0}})
    for i in range(50):
        manager.record("consumer_byte_rate", "ANONYMOUS", f"c{i}", 1, 0)
    assert manager.live_rates == 50
    manager.record("consumer_byte_rate", "ANONYMOUS", "late", 1, 5000)
    assert manager.live_rates == 1


# -- AlterClientQuotas validation ----------------------------------------------------------------
@pytest.mark.parametrize(
    ("pairs", "message"),
    [
        ([], "Invalid empty client quota entity"),
        ([(USER, "a"), (USER, "b")], "Invalid client quota entity, duplicate entity entry user"),
        ([("group", "g")], "Unhandled client quota entity type: group"),
        ([(CLIENT_ID, "")], "Empty client-id not supported"),
        ([(IP, "1.2.3.4"), (USER, "u")], "Invalid quota entity combination"),
        ([(IP, "not an address")], "not an address is not a valid IP or resolvable host."),
    ],
)
def test_bad_entities(pairs: list, message: str) -> None:
    with pytest.raises(QuotaRequestError) as info:
        validate_entity(pairs)
    assert info.value.error == "invalid_request"
    assert info.value.message.startswith(message)


def test_good_entities_are_canonical() -> None:
    assert validate_entity([(CLIENT_ID, "c"), (USER, None)]) == ((CLIENT_ID, "c"), (USER, None))
    assert validate_entity([(IP, None)]) == ((IP, None),)
    assert validate_entity([(IP, "::1")]) == ((IP, "::1"),)


@pytest.mark.parametrize(
    ("entity", "key", "value", "message"),
    [
        (((CLIENT_ID, "c"),), "nope", 1.0, "Invalid configuration key nope"),
        (((CLIENT_ID, "c"),), "producer_byte_rate", 0.0, "Quota producer_byte_rate must be"),
        (((CLIENT_ID, "c"),), "consumer_byte_rate", -5.0, "Quota consumer_byte_rate must be"),
        (((CLIENT_ID, "c"),), "producer_byte_rate", 1.5, "producer_byte_rate cannot be a frac"),
        (((CLIENT_ID, "c"),), "producer_byte_rate", 1e19, "Proposed value for producer_byte"),
        (((CLIENT_ID, "c"),), "connection_creation_rate", 5.0, "Invalid configuration key"),
        (((IP, None),), "producer_byte_rate", 5.0, "Invalid configuration key"),
        (((CLIENT_ID, "c"),), "request_percentage", math.nan, "Quota request_percentage must"),
    ],
)
def test_bad_values(entity: tuple, key: str, value: float, message: str) -> None:
    with pytest.raises(QuotaRequestError) as info:
        validate_value(entity, key, value)
    assert info.value.message.startswith(message)


def test_good_values() -> None:
    validate_value(((USER, None),), "request_percentage", 12.5)
    validate_value(((USER, None),), "controller_mutation_rate", 0.5)
    validate_value(((IP, None),), "connection_creation_rate", 10.0)


# -- DescribeClientQuotas filters ----------------------------------------------------------------
ENTITIES = [
    entity_of([(USER, "u")]),
    entity_of([(USER, None)]),
    entity_of([(USER, "u"), (CLIENT_ID, "c")]),
    entity_of([(CLIENT_ID, "c")]),
    entity_of([(CLIENT_ID, None)]),
    entity_of([(IP, "1.2.3.4")]),
]


def _matching(components: list, strict: bool) -> list:
    quota_filter = parse_filter(components, strict)
    return [e for e in ENTITIES if quota_filter.matches(e)]


def test_filters_match_as_kafka() -> None:
    assert _matching([(USER, 0, "u")], False) == [ENTITIES[0], ENTITIES[2]]
    assert _matching([(USER, 0, "u")], True) == [ENTITIES[0]]
    assert _matching([(USER, 1, None)], False) == [ENTITIES[1]]
    # SPECIFIED: the type present, default included (Kafka 4's ClientQuotasImage)
    assert _matching([(USER, 2, None)], True) == [ENTITIES[0], ENTITIES[1]]
    assert _matching([(CLIENT_ID, 2, None)], False) == [ENTITIES[2], ENTITIES[3], ENTITIES[4]]
    assert _matching([], False) == ENTITIES
    assert _matching([], True) == []
    assert QuotaFilter({}, frozenset({IP}), False).matches(ENTITIES[5])


@pytest.mark.parametrize(
    ("components", "error", "message"),
    [
        ([("", 0, "x")], "invalid_request", "Invalid empty entity type."),
        ([(USER, 0, "a"), (USER, 2, None)], "invalid_request", "Entity type user cannot"),
        ([("topic", 0, "x")], "unsupported_version", "Unsupported entity type topic"),
        ([(USER, 0, None)], "invalid_request", "Request specified MATCH_TYPE_EXACT"),
        ([(USER, 1, "x")], "invalid_request", "Request specified MATCH_TYPE_DEFAULT"),
        ([(USER, 2, "x")], "invalid_request", "Request specified MATCH_TYPE_SPECIFIED"),
        ([(USER, 7, None)], "invalid_request", "Unknown match type 7"),
        ([(IP, 2, None), (USER, 2, None)], "invalid_request", "Invalid entity filter"),
    ],
)
def test_bad_filters(components: list, error: str, message: str) -> None:
    with pytest.raises(QuotaRequestError) as info:
        parse_filter(components, False)
    assert info.value.error == error
    assert info.value.message.startswith(message)
