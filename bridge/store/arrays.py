"""Arrays the hot statements send, encoded in PostgreSQL's binary array format in one pass.

Every claim and every settlement batch sends arrays: the keys and fences of the rows, their
states and outcome codes, the job types a claim may take. psycopg's general list dumper finds
a dumper for each element and builds the array element by element; for a settlement batch of
16 rows (eight arrays) that cost the claimer, which writes every batch, about 170 us against
about 50 for the encoders here: a few microseconds of client CPU per job, on the thread that
paces the whole pool (docs/benchmarks.md, "Worker tier").

:class:`TextArray` and :class:`BigintArray` are lists marked for these encoders (their dumpers
are registered for every connection, with the array's type, ``text[]`` or ``bigint[]``); a
statement takes them as any parameter, ``%(name)s`` or ``%(name)b``. A plain list still goes
through psycopg's own dumper.
"""

from __future__ import annotations

import struct
from itertools import chain

import psycopg
from psycopg.adapt import Dumper
from psycopg.pq import Format

#: the type oids of text, bigint and of their arrays (pg_type)
TEXT_OID, TEXT_ARRAY_OID = 25, 1009
BIGINT_OID, BIGINT_ARRAY_OID = 20, 1016

_HEADER = struct.Struct(">iiIii")  # dimensions, has nulls, element type, length, lower bound
_EMPTY = struct.Struct(">iiI")  # an empty array: no dimension
_LENGTH = struct.Struct(">i")
_NULL = _LENGTH.pack(-1)


class TextArray(list[str | None]):
    """A ``text[]`` parameter (None elements are NULL)."""

    __slots__ = ()


class BigintArray(list[int]):
    """A ``bigint[]`` parameter (no NULL element)."""

    __slots__ = ()


def encode_text(values: list[str | None], encoding: str = "utf-8") -> bytes:
    """``values`` as a binary ``text[]``."""
    if not values:
        return _EMPTY.pack(0, 0, TEXT_OID)
    nulls = 0
    parts: list[bytes] = []
    length = _LENGTH.pack
    for value in values:
        if value is None:
            parts.append(_NULL)
            nulls = 1
        else:
            data = value.encode(encoding)
            parts += (length(len(data)), data)
    return _HEADER.pack(1, nulls, TEXT_OID, len(values), 1) + b"".join(parts)


def encode_bigint(values: list[int]) -> bytes:
    """``values`` as a binary ``bigint[]``; a None among them raises :class:`TypeError`."""
    count = len(values)
    if not count:
        return _EMPTY.pack(0, 0, BIGINT_OID)
    try:
        body = struct.pack(f">{'iq' * count}", *chain.from_iterable((8, v) for v in values))
    except struct.error as exc:
        raise TypeError(f"a bigint[] parameter holds a non-integer: {exc}") from None
    return _HEADER.pack(1, 0, BIGINT_OID, count, 1) + body


class _TextArrayDumper(Dumper):
    format = Format.BINARY
    oid = TEXT_ARRAY_OID

    def dump(self, obj: list[str | None]) -> bytes:
        encoding = self.connection.info.encoding if self.connection is not None else "utf-8"
        return encode_text(obj, encoding)


class _BigintArrayDumper(Dumper):
    format = Format.BINARY
    oid = BIGINT_ARRAY_OID

    def dump(self, obj: list[int]) -> bytes:
        return encode_bigint(obj)


psycopg.adapters.register_dumper(TextArray, _TextArrayDumper)
psycopg.adapters.register_dumper(BigintArray, _BigintArrayDumper)
