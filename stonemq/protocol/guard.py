"""Request bounds guard, sans-IO: every length in a request body is checked against the frame
before kio's native reader decodes it.

kio's reader reserves an array's announced element count before it reads an element, so one
small request whose compact array length says 2^32 aborts the whole process (see
:data:`ABORT_REPRODUCER`), and it reads a null length as None even for arrays Kafka declares
non-nullable (handlers then failed on None). The guard is a pre-pass compiled once per
request schema from kio's dataclasses (``metadata["kafka_type"]``, ``tuple[X, ...]`` arrays,
``X | None`` nullability, compact lengths and tagged fields in flexible versions). It walks
the frame the way kio will, builds no objects, and raises :class:`MalformedRequest` when an
array, string, bytes or records length runs past the bytes left, when null is given where the
schema does not allow it, or when a known tagged field does not fill exactly the size it
announces (so the guard and kio always agree on where each field starts). Its work is linear
in the frame: an array's count is checked against the bytes left before an element is
walked, and a run of fixed-size fields (or an array of fixed-size entities) is one add.

Produce is not read by kio (stonemq.protocol.produce_request keeps its record batches as views
of the frame) and checks the same rules itself.

:func:`describe` gives a schema's layout as plain data (the fuzzing harness walks it too);
:func:`compile_walker` turns it into the guard's steps.
"""

from __future__ import annotations

import dataclasses
import functools
import struct
from collections.abc import Callable
from types import EllipsisType, NoneType, UnionType
from typing import Any, Union, get_args, get_origin

from kio.static.protocol import Entity

# A Metadata v12 request (header v2: api 3, version 12, correlation id 1, null client id, no
# tags) whose topics array announces 2^32 - 2 entries (uvarint 0xffffffff, count + 1): kio
# 0.6.5's native reader aborted the broker on this 20-byte frame ("memory allocation of
# 34359738352 bytes failed", SIGABRT, no shutdown).
ABORT_REPRODUCER = bytes.fromhex("0003000c00000001ffff00ffffffff0f00000000")

_FIXED_SIZES = {
    "bool": 1,
    "int8": 1,
    "uint8": 1,
    "int16": 2,
    "uint16": 2,
    "error_code": 2,
    "int32": 4,
    "uint32": 4,
    "timedelta_i32": 4,
    "int64": 8,
    "uint64": 8,
    "float64": 8,
    "timedelta_i64": 8,
    "datetime_i64": 8,
    "uuid": 16,
}
# the legacy (non-flexible) length prefix of the variable-size kinds; flexible ones are compact
LEGACY_PREFIX = {"string": 2, "bytes": 4, "records": 4}
COMPACT = 0


class MalformedRequest(Exception):
    """The request body cannot be valid: a length runs past the frame, or null is not allowed."""


# -- layout ----------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, slots=True)
class Fixed:
    """Fields of a fixed size, read as they come."""

    size: int


@dataclasses.dataclass(frozen=True, slots=True)
class Sized:
    """A string, bytes or records value after its length (``prefix`` bytes, or COMPACT)."""

    name: str
    kind: str
    prefix: int
    nullable: bool


@dataclasses.dataclass(frozen=True, slots=True)
class Array:
    name: str
    item: Node
    compact: bool
    nullable: bool


@dataclasses.dataclass(frozen=True, slots=True)
class Struct:
    """An entity's fields in order; ``tags`` (flexible versions only) maps known tags to their
    layout; ``nullable`` structs carry an int8 marker first (KIP-893)."""

    name: str
    fields: tuple[Node, ...]
    tags: dict[int, Node] | None
    nullable: bool = False


Node = Fixed | Sized | Array | Struct


@functools.cache
def describe(entity_type: type[Entity], flexible: bool | None = None) -> Struct:
    """The wire layout of a kio entity (a request schema or one nested in it)."""
    if flexible is None:
        flexible = bool(entity_type.__flexible__)
    nodes: list[Node] = []
    tags: dict[int, Node] = {}
    for field in dataclasses.fields(entity_type):
        if "tag" in field.metadata:
            # kio reads a tagged field as non-nullable whatever its type says
            tags[int(field.metadata["tag"])] = _field_node(field, flexible, nullable=False)
        else:
            nodes.append(_field_node(field, flexible, _is_nullable(field.type)))
    return Struct(entity_type.__name__, tuple(nodes), tags if flexible else None)


def _field_node(field: dataclasses.Field[Any], flexible: bool, nullable: bool) -> Node:
    annotation = field.type
    assert not isinstance(annotation, str), "kio schemas are resolved dataclasses"
    inner = _strip_none(annotation)
    if get_origin(inner) is tuple:
        element, ellipsis = get_args(inner)
        assert isinstance(ellipsis, EllipsisType), f"{field.name}: not a tuple[X, ...] array"
        item = _value_node(field, _strip_none(element), flexible, nullable=False)
        return Array(field.name, item, flexible, nullable)
    return _value_node(field, inner, flexible, nullable)


def _value_node(field: dataclasses.Field[Any], cls: Any, flexible: bool, nullable: bool) -> Node:
    if dataclasses.is_dataclass(cls):
        struct_ = describe(cls, flexible)  # type: ignore[arg-type]
        return dataclasses.replace(struct_, nullable=True) if nullable else struct_
    kafka_type = field.metadata["kafka_type"]
    if kafka_type in _FIXED_SIZES:
        return Fixed(_FIXED_SIZES[kafka_type])
    if kafka_type not in LEGACY_PREFIX:
        raise TypeError(f"field {field.name}: kafka type {kafka_type!r} is unknown to the guard")
    return Sized(
        field.name, kafka_type, COMPACT if flexible else LEGACY_PREFIX[kafka_type], nullable
    )


def _is_nullable(annotation: Any) -> bool:
    return get_origin(annotation) in (UnionType, Union) and NoneType in get_args(annotation)


def _strip_none(annotation: Any) -> Any:
    if not _is_nullable(annotation):
        return annotation
    (inner,) = (a for a in get_args(annotation) if a is not NoneType)
    return inner


def min_size(node: Node) -> int:
    """The fewest bytes a value of this layout takes."""
    if isinstance(node, Fixed):
        return node.size
    if isinstance(node, Sized):
        return node.prefix or 1
    if isinstance(node, Array):
        return 1 if node.compact else 4
    if node.nullable:
        return 1
    return sum(min_size(n) for n in node.fields) + (0 if node.tags is None else 1)


# -- the guard's steps -----------------------------------------------------------------------------
# A step walks one value: (frame, position) -> position after it. Reading past the frame raises
# IndexError or struct.error, which check() turns into MalformedRequest.
Step = Callable[[bytes, int], int]
Plan = int | Step  # an int: that many bytes, skipped in one add

_I8 = struct.Struct(">b").unpack_from
_I32 = struct.Struct(">i").unpack_from
_LENGTH = {2: struct.Struct(">h").unpack_from, 4: _I32}


def check(walker: Step, frame: bytes, pos: int) -> int:
    """Walk a body from ``pos``; returns where it ends (later bytes are ignored, as by Kafka)."""
    try:
        end = walker(frame, pos)
    except (IndexError, struct.error):
        raise MalformedRequest("request body runs past the end of the frame") from None
    if end > len(frame):
        raise MalformedRequest("request body runs past the end of the frame")
    return end


@functools.cache
def compile_walker(entity_type: type[Entity]) -> Step:
    """The guard for a request schema (a kio request dataclass), compiled once per schema."""
    return _as_step(_compile(describe(entity_type)))


def read_uvarint(buf: bytes, pos: int) -> tuple[int, int]:
    """An unsigned varint of at most 5 bytes (Kafka's limit): (value, position after it)."""
    value = shift = 0
    for i in range(pos, pos + 5):
        byte = buf[i]
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, i + 1
        shift += 7
    raise MalformedRequest("varint longer than 5 bytes")


def _compile(node: Node) -> Plan:
    if isinstance(node, Fixed):
        return node.size
    if isinstance(node, Sized):
        if node.prefix == COMPACT:
            return _compact_sized(node.name, node.nullable)
        return _legacy_sized(node.name, node.prefix, node.nullable)
    if isinstance(node, Array):
        return _array(
            node.name, _compile(node.item), min_size(node.item), node.compact, node.nullable
        )
    plan = _struct(node)
    return _nullable_struct(node.name, plan) if node.nullable else plan


def _struct(node: Struct) -> Plan:
    """Each variable-size field after one add for the fixed-size run before it, a tail add,
    then (flexible versions) the tagged fields, whose usual empty section is read inline."""
    pairs: list[tuple[int, Step]] = []
    skip = 0
    for field in node.fields:
        plan = _compile(field)
        if isinstance(plan, int):
            skip += plan
        else:
            pairs.append((skip, plan))
            skip = 0
    steps, tail = tuple(pairs), skip
    if node.tags is None:
        if not steps:
            return tail
        if len(steps) == 1 and not steps[0][0] and not tail:
            return steps[0][1]

        def entity(buf: bytes, pos: int) -> int:
            for fixed, step in steps:
                pos = step(buf, pos + fixed)
            return pos + tail

        return entity
    tags = _tag_section({t: _as_step(_compile(n)) for t, n in node.tags.items()})

    def flexible_entity(buf: bytes, pos: int) -> int:
        for fixed, step in steps:
            pos = step(buf, pos + fixed)
        pos += tail
        if buf[pos]:
            return tags(buf, pos)
        return pos + 1

    return flexible_entity


def _as_step(plan: Plan) -> Step:
    if not isinstance(plan, int):
        return plan
    size = plan

    def fixed(buf: bytes, pos: int) -> int:
        return pos + size

    return fixed


def null_error(what: str, name: str) -> MalformedRequest:
    return MalformedRequest(f"null {what} for non-nullable field {name}")


def length_error(what: str, name: str, length: int) -> MalformedRequest:
    return MalformedRequest(f"{what} {name} of length {length} does not fit in the frame")


def _compact_sized(name: str, nullable: bool) -> Step:
    """A compact string, bytes or records: uvarint length + 1 (0 is null), then the bytes."""

    def compact(buf: bytes, pos: int) -> int:
        n = buf[pos]
        if n < 0x80:
            pos += 1
        else:
            n, pos = read_uvarint(buf, pos)
        if not n:
            if nullable:
                return pos
            raise null_error("value", name)
        pos += n - 1
        if pos > len(buf):
            raise length_error("value", name, n - 1)
        return pos

    return compact


def _legacy_sized(name: str, prefix: int, nullable: bool) -> Step:
    """A legacy string (int16 length) or bytes/records (int32 length); -1 is null."""
    unpack = _LENGTH[prefix]

    def legacy(buf: bytes, pos: int) -> int:
        (n,) = unpack(buf, pos)
        pos += prefix
        if n < 0:
            if n == -1 and nullable:
                return pos
            raise null_error("value", name) if n == -1 else length_error("value", name, n)
        pos += n
        if pos > len(buf):
            raise length_error("value", name, n)
        return pos

    return legacy


def _array(name: str, item: Plan, item_min: int, compact: bool, nullable: bool) -> Step:
    """An array: its count is checked against the bytes left before any element is walked."""
    least = max(item_min, 1)
    size = item if isinstance(item, int) else 0
    walk = None if isinstance(item, int) else item

    def array(buf: bytes, pos: int) -> int:
        if compact:
            count = buf[pos]
            if count < 0x80:
                pos += 1
            else:
                count, pos = read_uvarint(buf, pos)
            count -= 1  # a compact count is stored + 1; 0 is null
        else:
            (count,) = _I32(buf, pos)
            pos += 4
        if count < 0:
            if count == -1 and nullable:
                return pos
            raise null_error("array", name) if count == -1 else length_error("array", name, count)
        if count * least > len(buf) - pos:
            raise length_error("array", name, count)
        if walk is None:
            return pos + count * size
        for _ in range(count):
            pos = walk(buf, pos)
        return pos

    return array


def _nullable_struct(name: str, plan: Plan) -> Step:
    """A nullable struct (KIP-893): int8 -1 for null, or 1 and then the struct."""
    walk = _as_step(plan)

    def nullable_struct(buf: bytes, pos: int) -> int:
        (marker,) = _I8(buf, pos)
        if marker == -1:
            return pos + 1
        if marker != 1:
            raise MalformedRequest(f"bad null marker {marker} for struct {name}")
        return walk(buf, pos + 1)

    return nullable_struct


def _tag_section(known: dict[int, Step]) -> Step:
    """Tagged fields: count, then (tag, size, value) each. A known tag's value must fill its
    size exactly: kio reads the value and goes on from where it ends, not from the size."""

    def tags(buf: bytes, pos: int) -> int:
        count = buf[pos]
        if not count:
            return pos + 1
        if count < 0x80:
            pos += 1
        else:
            count, pos = read_uvarint(buf, pos)
        if 2 * count > len(buf) - pos:
            raise length_error("tagged fields", "section", count)
        for _ in range(count):
            tag, pos = read_uvarint(buf, pos)
            size, pos = read_uvarint(buf, pos)
            end = pos + size
            if end > len(buf):
                raise length_error("tagged field", str(tag), size)
            walk = known.get(tag)
            if walk is not None and walk(buf, pos) != end:
                raise MalformedRequest(f"tagged field {tag} does not fill its size {size}")
            pos = end
        return pos

    return tags


# a tagged-field section whose tags are all unknown (a request header v2's)
skip_tagged_fields: Step = _tag_section({})
