"""Quota entities and keys: what AlterClientQuotas may set, what DescribeClientQuotas may ask
for, and which configured quota applies to a client, as Kafka 4 answers (its controller's
``ClientQuotaControlManager`` and ``ClientQuotasImage``, its broker's ``DefaultQuotaCallback``).

An entity is a set of (type, name) pairs with distinct types; a name of None is the type's
default (``<default>`` in Kafka's CLI). ``user`` and ``client-id`` may be combined; ``ip`` stands
alone. Without authentication the user is Kafka's anonymous principal, ``ANONYMOUS``.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

USER = "user"
CLIENT_ID = "client-id"
IP = "ip"
ANONYMOUS_USER = "ANONYMOUS"

PRODUCER_BYTE_RATE = "producer_byte_rate"
CONSUMER_BYTE_RATE = "consumer_byte_rate"
REQUEST_PERCENTAGE = "request_percentage"
CONTROLLER_MUTATION_RATE = "controller_mutation_rate"
CONNECTION_CREATION_RATE = "connection_creation_rate"

# key: integral (Kafka's LONG/INT) or not (DOUBLE), and the largest value
_USER_CLIENT_KEYS: dict[str, tuple[bool, float]] = {
    PRODUCER_BYTE_RATE: (True, 2.0**63 - 1),
    CONSUMER_BYTE_RATE: (True, 2.0**63 - 1),
    REQUEST_PERCENTAGE: (False, float("inf")),
    CONTROLLER_MUTATION_RATE: (False, float("inf")),
}
_IP_KEYS: dict[str, tuple[bool, float]] = {CONNECTION_CREATION_RATE: (True, 2.0**31 - 1)}

# DescribeClientQuotas match types
MATCH_EXACT = 0
MATCH_DEFAULT = 1
MATCH_SPECIFIED = 2

Entity = tuple[tuple[str, str | None], ...]
"""A quota entity, its (type, name) pairs sorted by type: hashable and canonical."""


def entity_of(pairs: Iterable[tuple[str, str | None]]) -> Entity:
    return tuple(sorted(pairs, key=lambda pair: pair[0]))


def describe_entity(entity: Entity) -> str:
    return "(" + ", ".join(f"{t}={'<default>' if n is None else n}" for t, n in entity) + ")"


class QuotaRequestError(Exception):
    """A request Kafka refuses, with the error name (``invalid_request``,
    ``unsupported_version``) and Kafka's message."""

    def __init__(self, error: str, message: str) -> None:
        super().__init__(message)
        self.error = error
        self.message = message


def validate_entity(pairs: list[tuple[str, str | None]]) -> Entity:
    """The entity of an AlterClientQuotas entry, or QuotaRequestError as Kafka's controller
    answers it (INVALID_REQUEST)."""
    if not pairs:
        raise QuotaRequestError("invalid_request", "Invalid empty client quota entity")
    seen: dict[str, str | None] = {}
    for entity_type, name in pairs:
        if entity_type in seen:
            raise QuotaRequestError(
                "invalid_request",
                f"Invalid client quota entity, duplicate entity entry {entity_type}",
            )
        if entity_type not in (USER, CLIENT_ID, IP):
            raise QuotaRequestError(
                "invalid_request", f"Unhandled client quota entity type: {entity_type}"
            )
        seen[entity_type] = name
        if name is not None and not name:
            raise QuotaRequestError("invalid_request", f"Empty {entity_type} not supported")
    if IP in seen and (USER in seen or CLIENT_ID in seen):
        raise QuotaRequestError(
            "invalid_request",
            "Invalid quota entity combination, IP entity should not be combined with User "
            "or ClientId",
        )
    ip = seen.get(IP)
    if ip is not None:
        # Kafka also resolves host names here; a lookup has no place in a request handler,
        # so only address literals are taken
        try:
            ipaddress.ip_address(ip)
        except ValueError:
            raise QuotaRequestError(
                "invalid_request", f"{ip} is not a valid IP or resolvable host."
            ) from None
    return entity_of(seen.items())


def validate_value(entity: Entity, key: str, value: float) -> None:
    """A quota value to set, as Kafka's controller validates it (INVALID_REQUEST)."""
    keys = _IP_KEYS if entity[0][0] == IP and len(entity) == 1 else _USER_CLIENT_KEYS
    spec = keys.get(key)
    if spec is None:
        raise QuotaRequestError("invalid_request", f"Invalid configuration key {key}")
    if not value > 0.0:  # also refuses NaN
        raise QuotaRequestError("invalid_request", f"Quota {key} must be greater than 0")
    integral, largest = spec
    if value > largest:
        kind = "an INT" if largest < 2.0**32 else "a LONG"
        raise QuotaRequestError(
            "invalid_request", f"Proposed value for {key} is too large for {kind}."
        )
    if integral and abs(value % 1.0) > 1e-6:
        raise QuotaRequestError("invalid_request", f"{key} cannot be a fractional value.")


def apply_ops(current: Mapping[str, float], ops: Mapping[str, float | None]) -> dict[str, float]:
    """``current`` with ``ops`` applied (None removes the key)."""
    out = dict(current)
    for key, value in ops.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = value
    return out


@dataclass(frozen=True, slots=True)
class QuotaFilter:
    """A DescribeClientQuotas filter: exact names (None: the default) and types that must
    be present with any name."""

    exact: Mapping[str, str | None]
    specified: frozenset[str]
    strict: bool

    def matches(self, entity: Entity) -> bool:
        names = dict(entity)
        if self.strict and len(names) != len(self.exact) + len(self.specified):
            return False
        for entity_type, name in self.exact.items():
            if entity_type not in names or names[entity_type] != name:
                return False
        return all(entity_type in names for entity_type in self.specified)


def parse_filter(components: Iterable[tuple[str, int, str | None]], strict: bool) -> QuotaFilter:
    """A DescribeClientQuotas filter from its (entity type, match type, match) components,
    or QuotaRequestError as Kafka answers a bad one."""
    exact: dict[str, str | None] = {}
    specified: set[str] = set()
    for entity_type, match_type, match in components:
        if not entity_type:
            raise QuotaRequestError("invalid_request", "Invalid empty entity type.")
        if entity_type in exact or entity_type in specified:
            raise QuotaRequestError(
                "invalid_request",
                f"Entity type {entity_type} cannot appear more than once in the filter.",
            )
        if entity_type not in (USER, CLIENT_ID, IP):
            raise QuotaRequestError("unsupported_version", f"Unsupported entity type {entity_type}")
        if match_type == MATCH_EXACT:
            if match is None:
                raise QuotaRequestError(
                    "invalid_request",
                    "Request specified MATCH_TYPE_EXACT, but set match string to null.",
                )
            exact[entity_type] = match
        elif match_type == MATCH_DEFAULT:
            if match is not None:
                raise QuotaRequestError(
                    "invalid_request",
                    "Request specified MATCH_TYPE_DEFAULT, but also specified a match string.",
                )
            exact[entity_type] = None
        elif match_type == MATCH_SPECIFIED:
            if match is not None:
                raise QuotaRequestError(
                    "invalid_request",
                    "Request specified MATCH_TYPE_SPECIFIED, but also specified a match string.",
                )
            specified.add(entity_type)
        else:
            raise QuotaRequestError("invalid_request", f"Unknown match type {match_type}")
    types = set(exact) | specified
    if IP in types and (USER in types or CLIENT_ID in types):
        raise QuotaRequestError(
            "invalid_request",
            "Invalid entity filter component combination. IP filter component should not be "
            "used with user or clientId filter component.",
        )
    return QuotaFilter(exact, frozenset(specified), strict)


# Kafka's precedence (DefaultQuotaCallback): the first configured entity wins, and the
# rate it is enforced over is shared by the clients with the same (user, client-id) tags.
# Each level: (user part, client part); "name" = the client's own, "default" = <default>,
# absent = None. The tags keep the client's user/client-id where the level names them.
_LEVELS: tuple[tuple[str | None, str | None], ...] = (
    ("name", "name"),
    ("name", "default"),
    ("name", None),
    ("default", "name"),
    ("default", "default"),
    ("default", None),
    (None, "name"),
    (None, "default"),
)


def resolve(
    quotas: Mapping[Entity, Mapping[str, float]], key: str, user: str, client_id: str
) -> tuple[tuple[str, str], float] | None:
    """The quota of ``key`` that applies to a client, by Kafka's precedence: its rate's
    (user, client-id) tags and the bound, or None when no quota applies."""
    for user_part, client_part in _LEVELS:
        pairs: list[tuple[str, str | None]] = []
        if user_part is not None:
            pairs.append((USER, user if user_part == "name" else None))
        if client_part is not None:
            pairs.append((CLIENT_ID, client_id if client_part == "name" else None))
        configured = quotas.get(entity_of(pairs))
        if configured is not None and key in configured:
            tags = (user if user_part else "", client_id if client_part else "")
            return tags, configured[key]
    return None
