"""Hypothesis strategies of the fuzz suite: protobuf messages from their descriptors, and mutated wire bytes.

``messages(cls)`` draws any message of ``cls`` that protobuf can serialize: every field of its
type's full range (out-of-range enum numbers, NaN and infinities, NUL and control characters in
strings, empty and over-long strings, small repeated fields), nested messages to a bounded depth.
``wire(cls)`` draws what a hostile or broken peer can send: such a message serialized and then
mutated (bytes flipped, cut short, spliced, inserted; a string field holding invalid UTF-8; a
length prefix claiming 2**40 bytes; unknown fields), or plain random bytes.
"""
from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pytest
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass
from hypothesis import settings
from hypothesis import strategies as st


def _long_examples() -> int:
    raw = os.environ.get("CHOPPER_FUZZ_EXAMPLES", "")
    if not raw:
        return 0
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"CHOPPER_FUZZ_EXAMPLES={raw!r}: give the number of examples per test, e.g. 2000")
    return int(raw)


# Examples per test in a long run (0: the bounded ``fuzz`` profile of ``make test``).
LONG_EXAMPLES = _long_examples()


def fuzz(examples: int, timeout_s: float) -> Callable[[Any], Any]:
    """Settings of one fuzz test: ``examples`` in ``make test``, ``CHOPPER_FUZZ_EXAMPLES`` in a long run.

    ``timeout_s`` bounds the test (a hang fails it); a long run scales it with the examples.
    """
    scale = max(1.0, LONG_EXAMPLES / examples)

    def apply(test: Any) -> Any:
        return pytest.mark.timeout(timeout_s * scale)(settings(max_examples=LONG_EXAMPLES or examples)(test))

    return apply


_INT_RANGES = {
    FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SINT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SINT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_FIXED32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1),
    FieldDescriptor.TYPE_FIXED64: (0, 2**64 - 1),
}
# Strings a validator treats specially: empty, typical, at and past the usual length limits,
# non-printable, path-like, and long when URI-encoded.
_SPECIAL_STRINGS = st.sampled_from(["", "j", "forward", "all_reduce", "x" * 256, "x" * 257, "a\x00b", "a\nb",
                                    "../..", "/", "日本語" * 30, " "])


def _scalar(field: FieldDescriptor) -> st.SearchStrategy[Any]:
    kind = field.type
    if kind in _INT_RANGES:
        lo, hi = _INT_RANGES[kind]
        return st.one_of(st.integers(lo, hi), st.sampled_from(sorted({lo, hi, 0, 1, -1 if lo < 0 else 2})))
    if kind == FieldDescriptor.TYPE_DOUBLE:
        return st.floats()
    if kind == FieldDescriptor.TYPE_FLOAT:
        return st.floats(width=32)
    if kind == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if kind == FieldDescriptor.TYPE_STRING:
        return st.one_of(_SPECIAL_STRINGS, st.text(max_size=40), st.text(max_size=400))
    if kind == FieldDescriptor.TYPE_BYTES:
        return st.binary(max_size=64)
    if kind == FieldDescriptor.TYPE_ENUM:
        known = [v.number for v in field.enum_type.values]
        return st.one_of(st.sampled_from(known), st.integers(-(2**31), 2**31 - 1))
    raise NotImplementedError(f"field {field.full_name} of type {kind}")


def _fields(descriptor: Descriptor, depth: int) -> dict[str, st.SearchStrategy[Any]]:
    out: dict[str, st.SearchStrategy[Any]] = {}
    for field in descriptor.fields:
        if field.type == FieldDescriptor.TYPE_MESSAGE:
            if depth <= 0:
                continue
            value: st.SearchStrategy[Any] = _message(field.message_type, depth - 1)
        else:
            value = _scalar(field)
        out[field.name] = st.lists(value, max_size=6) if field.is_repeated else value
    return out


def _message(descriptor: Descriptor, depth: int) -> st.SearchStrategy[Message]:
    cls = GetMessageClass(descriptor)
    return st.fixed_dictionaries({}, optional=_fields(descriptor, depth)).map(lambda kw: cls(**kw))


def messages(cls: type[Message], depth: int = 2) -> st.SearchStrategy[Message]:
    """Any message of ``cls`` (module docstring), nested messages to ``depth`` levels."""
    return _message(cls.DESCRIPTOR, depth)


def varint(n: int) -> bytes:
    """Protobuf base-128 varint of a non-negative ``n``."""
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)


def length_delimited(number: int, payload: bytes, claimed: int | None = None) -> bytes:
    """One length-delimited field (wire type 2); ``claimed`` overrides the length prefix."""
    return varint(number << 3 | 2) + varint(len(payload) if claimed is None else claimed) + payload


def edit(data: bytes, op: str, at: int, extra: bytes) -> bytes:
    """``data`` cut at, flipped at (xor with ``extra[0]``) or with ``extra`` inserted at ``at`` (mod its length)."""
    out = bytearray(data)
    at %= len(out) + 1
    if op == "cut":
        del out[at:]
    elif op == "flip" and out:
        out[min(at, len(out) - 1)] ^= extra[0] or 1
    elif op == "insert":
        out[at:at] = extra
    return bytes(out)


@st.composite
def _mutate(draw: st.DrawFn, cls: type[Message], base: st.SearchStrategy[bytes]) -> bytes:
    data = bytearray(draw(base))
    strings = [f.number for f in cls.DESCRIPTOR.fields if f.type == FieldDescriptor.TYPE_STRING]
    nested = [f.number for f in cls.DESCRIPTOR.fields if f.type == FieldDescriptor.TYPE_MESSAGE]
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "cut", "insert", "splice", "utf8", "claim", "unknown"]))
        if op in ("flip", "cut", "insert"):
            data = bytearray(edit(bytes(data), op, draw(st.integers(0, len(data))), draw(st.binary(min_size=1,
                                                                                                   max_size=8))))
        elif op == "splice":  # a second message after the first: protobuf merges them
            data += draw(base)
        elif op == "utf8" and strings:
            bad = draw(st.sampled_from([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"a\xe2\x82"]))
            data += length_delimited(draw(st.sampled_from(strings)), bad)
        elif op == "claim":  # a length prefix of 2**40 bytes: must not be allocated
            data += length_delimited(draw(st.sampled_from(nested or strings or [1])), b"\x08\x01", 2**40)
        elif op == "unknown":
            data += length_delimited(draw(st.integers(100, 2**29 - 1)), draw(st.binary(max_size=8)))
    return bytes(data)


def wire(cls: type[Message], valid: st.SearchStrategy[Message] | None = None) -> st.SearchStrategy[bytes]:
    """Bytes a peer may send where a ``cls`` is expected (module docstring).

    Args:
        cls: The expected message type.
        valid: Plausible messages to start mutating from; default ``messages(cls)``.
    """
    base = (valid if valid is not None else messages(cls)).map(lambda m: m.SerializeToString())
    return st.one_of(base, _mutate(cls, base), st.binary(max_size=256))
