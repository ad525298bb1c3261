"""A minimal protocol-buffers *encoder*: the wire format, for the few message shapes
profkit writes (pprof's profile.proto). No schema compiler, no dependency.

The wire format (protobuf's "Encoding" documentation): a message is a sequence of
fields; each field is a key ``(field_number << 3) | wire_type`` as a varint, then the
value. profkit needs two wire types:

- 0 (VARINT): int64/uint64/bool, base-128, least significant group first, the high bit
  of each byte set while more follow. A negative int64 is its two's complement as a
  64-bit unsigned number (ten bytes);
- 2 (LEN): a varint length, then that many bytes: strings (UTF-8), embedded messages,
  and *packed* repeated scalars (proto3's default for ``repeated int64``/``uint64``).

proto3 semantics: a scalar equal to its default (0, false, "") is not written, except
inside a repeated field, where every element counts (pprof's ``string_table[0]`` is
"" and must be there).
"""
from __future__ import annotations

from collections.abc import Iterable

VARINT = 0
LEN = 2
_U64 = 1 << 64


# the varints of 0..16383 (one or two bytes): ids and most counts, looked up
_SMALL: tuple[bytes, ...] = tuple(
    bytes((n,)) if n < 0x80 else bytes(((n & 0x7F) | 0x80, n >> 7)) for n in range(1 << 14))


def varint(n: int) -> bytes:
    """*n* as a base-128 varint; a negative *n* as its 64-bit two's complement."""
    if 0 <= n < 16384:
        return _SMALL[n]
    if n < 0:
        n += _U64
    if not 0 <= n < _U64:
        raise ValueError(f"{n} does not fit in 64 bits")
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def text(s: str) -> bytes:
    """UTF-8 of *s*; a name that came from non-UTF-8 bytes (surrogate escapes) is written
    with those bytes as ``\\udcNN`` escapes, since a proto3 string must be valid UTF-8."""
    return s.encode("utf-8", "backslashreplace")


def key(field: int, wire_type: int) -> bytes:
    return varint((field << 3) | wire_type)


class Message:
    """Fields appended in order; :meth:`bytes` is the encoded message.

    ``int_`` skips a zero (proto3 default); ``string``/``message`` are length-delimited;
    ``packed`` writes a repeated integer field as one LEN record (nothing when empty);
    ``repeated_string`` writes every element, empty ones included.
    """

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = bytearray()

    def int_(self, field: int, value: int) -> Message:
        if value:
            self._buf += key(field, VARINT)
            self._buf += varint(int(value))
        return self

    def bool_(self, field: int, value: bool) -> Message:
        return self.int_(field, 1 if value else 0)

    def _len(self, field: int, data: bytes) -> None:
        self._buf += key(field, LEN)
        self._buf += varint(len(data))
        self._buf += data

    def string(self, field: int, value: str) -> Message:
        if value:
            self._len(field, text(value))
        return self

    def repeated_string(self, field: int, values: Iterable[str]) -> Message:
        for v in values:
            self._len(field, text(v))
        return self

    def message(self, field: int, msg: Message) -> Message:
        """An embedded message (written even when empty: presence matters for messages)."""
        self._len(field, msg.bytes())
        return self

    def messages(self, field: int, msgs: Iterable[Message]) -> Message:
        for m in msgs:
            self.message(field, m)
        return self

    def packed(self, field: int, values: Iterable[int]) -> Message:
        data = b"".join(map(varint, values))
        if data:
            self._len(field, data)
        return self

    def bytes(self) -> bytes:
        return bytes(self._buf)
