"""Where the lengths are in an encoded request: a walk of the guard's layout (``describe``)
that records each length field, for structure-aware mutations.

Independent of the guard's compiled steps on purpose: the unit tests use it as a second
reading of the same bytes.
"""

from __future__ import annotations

import dataclasses
import struct

from stonemq.protocol.guard import COMPACT, Array, Fixed, Node, Sized, Struct, describe


@dataclasses.dataclass(frozen=True)
class Length:
    """One length field of an encoded request."""

    offset: int  # of the length field itself
    width: int  # its bytes (a varint's actual width)
    form: str  # "compact" (uvarint n + 1, 0 is null), "uvarint" (n), "int16"/"int32" (-1 null)
    kind: str  # "array", "string", "bytes", "records" or "tags" (a tagged-field count)
    name: str
    value: int  # as stored (a compact length is count + 1)
    nullable: bool
    left: int  # bytes after the length field, to the end of the buffer


def read_uvarint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def encode_uvarint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def lengths(entity_type: type, buf: bytes, pos: int = 0) -> tuple[list[Length], int]:
    """Every length field of the valid body of ``entity_type`` at ``pos``, and its end."""
    out: list[Length] = []
    end = _walk(describe(entity_type), buf, pos, out)
    return out, end


def _length(buf: bytes, pos: int, form: str) -> tuple[int, int]:
    if form in ("compact", "uvarint"):
        return read_uvarint(buf, pos)
    fmt = ">h" if form == "int16" else ">i"
    return struct.unpack_from(fmt, buf, pos)[0], pos + struct.calcsize(fmt)


def _record(
    out: list[Length], buf: bytes, pos: int, form: str, kind: str, name: str, nullable: bool
) -> tuple[int | None, int]:
    """Read and note a length; returns (count or size, None for null) and the position after."""
    raw, after = _length(buf, pos, form)
    out.append(Length(pos, after - pos, form, kind, name, raw, nullable, len(buf) - after))
    n = raw - 1 if form == "compact" else raw
    return (None if n < 0 else n), after


def _walk(node: Node, buf: bytes, pos: int, out: list[Length]) -> int:
    if isinstance(node, Fixed):
        return pos + node.size
    if isinstance(node, Sized):
        form = "compact" if node.prefix == COMPACT else {2: "int16", 4: "int32"}[node.prefix]
        n, pos = _record(out, buf, pos, form, node.kind, node.name, node.nullable)
        return pos + (n or 0)
    if isinstance(node, Array):
        form = "compact" if node.compact else "int32"
        n, pos = _record(out, buf, pos, form, "array", node.name, node.nullable)
        for _ in range(n or 0):
            pos = _walk(node.item, buf, pos, out)
        return pos
    return _walk_struct(node, buf, pos, out)


def _walk_struct(node: Struct, buf: bytes, pos: int, out: list[Length]) -> int:
    if node.nullable:
        if buf[pos] == 0xFF:
            return pos + 1
        pos += 1
    for field in node.fields:
        pos = _walk(field, buf, pos, out)
    if node.tags is None:
        return pos
    count, pos = _record(out, buf, pos, "uvarint", "tags", node.name, False)
    for _ in range(count or 0):
        tag, pos = read_uvarint(buf, pos)
        size, pos = read_uvarint(buf, pos)
        known = node.tags.get(tag)
        if known is not None:
            _walk(known, buf, pos, out)
        pos += size
    return pos
