"""The typed control protocol's schema language: what a control message may hold, checked both ways.

Every control exchange (the agents' map-output service, the pipelined rendezvous) is one of the
*operations* of a ``Service``: a name, a request schema, a response schema, size caps and a
default deadline. Nothing from the network is unpickled, unmarshalled or evaluated: a message is
UTF-8 JSON (``{"op": name, "args": {...}}``; answered by ``{"ok": value}`` or
``{"error": {"code": ..., "message": ...}}``), decoded without duplicate keys or NaN, and then
checked field by field against the operation's schema (exact field names, exact JSON types, bounds
on every number, length and count; bytes travel as base64 with a cap). Anything else - an unknown
operation or field, a wrong type, a value out of bounds, a message over its cap, bytes that are
not JSON (a pickle, say) - is refused with ``ControlMessageError`` naming the operation and the
peer, and the connection is closed. Why JSON and not protobuf: the engine stays free of
generated code and gRPC (``tests/test_architecture.py``), and protobuf would silently keep unknown
fields and has no bounds, which the schemas here check anyway.

This module is what both ends share: the schemas, ``Operation`` and ``Service``, strict JSON, and
the error codes of a refused call. The ends are ``control_server.ControlServer`` and
``control_client.ControlClient``.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from arrow_shuffle.errors import (
    ControlMessageError,
    ControlRequestError,
    PartitionNotFoundError,
    ShuffleAuthenticationError,
    ShuffleConfigError,
    ShuffleError,
    ShuffleProtocolError,
)
from arrow_shuffle.frames import MAX_CONTROL_PAYLOAD

I32 = (1 << 31) - 1
I64 = (1 << 63) - 1


# -- schemas ---------------------------------------------------------------------------------------
class Schema:
    """One JSON value's type and bounds. ``encode`` checks a Python value and makes it JSON-able
    (the sender refuses to send what the receiver would refuse); ``decode`` checks a decoded JSON
    value and returns the Python value. Both raise ``ControlMessageError`` naming the path."""

    def encode(self, value: Any, path: str) -> Any:
        raise NotImplementedError

    def decode(self, value: Any, path: str) -> Any:
        raise NotImplementedError


def _bad(path: str, what: str, value: Any) -> ControlMessageError:
    shown = type(value).__name__ if not isinstance(value, int | float | bool) else repr(value)
    return ControlMessageError(f"field {path or '<message>'}: expected {what}, got {shown}")


@dataclass(frozen=True)
class Int(Schema):
    low: int = 0
    high: int = I32

    def encode(self, value: Any, path: str) -> Any:
        return self.decode(value, path)

    def decode(self, value: Any, path: str) -> Any:
        if isinstance(value, bool) or not isinstance(value, int) or not self.low <= value <= self.high:
            raise _bad(path, f"an integer in [{self.low}, {self.high}]", value)
        return value


@dataclass(frozen=True)
class Float(Schema):
    low: float = -math.inf
    high: float = math.inf

    def encode(self, value: Any, path: str) -> Any:
        return self.decode(value, path)

    def decode(self, value: Any, path: str) -> Any:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise _bad(path, "a number", value)
        number = float(value)
        if not math.isfinite(number) or not self.low <= number <= self.high:
            raise _bad(path, f"a finite number in [{self.low}, {self.high}]", value)
        return number


@dataclass(frozen=True)
class Str(Schema):
    """Printable text only: no NUL, newline or other control character can reach a log line or
    a path through a control message."""

    max_len: int = 256
    min_len: int = 0

    def encode(self, value: Any, path: str) -> Any:
        return self.decode(value, path)

    def decode(self, value: Any, path: str) -> Any:
        if (
            not isinstance(value, str)
            or not self.min_len <= len(value) <= self.max_len
            or not value.isprintable()
        ):
            raise _bad(path, f"printable text of {self.min_len}..{self.max_len} characters", value)
        return value


@dataclass(frozen=True)
class Bytes(Schema):
    """Bytes, as base64 text on the wire."""

    max_len: int = MAX_CONTROL_PAYLOAD

    def encode(self, value: Any, path: str) -> Any:
        if not isinstance(value, bytes | bytearray | memoryview) or len(value) > self.max_len:
            raise _bad(path, f"at most {self.max_len} bytes", value)
        return base64.b64encode(bytes(value)).decode("ascii")

    def decode(self, value: Any, path: str) -> Any:
        if not isinstance(value, str) or len(value) > 4 * (self.max_len // 3 + 1):
            raise _bad(path, f"base64 of at most {self.max_len} bytes", value)
        try:
            raw = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise ControlMessageError(f"field {path}: not base64") from exc
        if len(raw) > self.max_len:
            raise _bad(path, f"at most {self.max_len} bytes", raw)
        return raw


@dataclass(frozen=True)
class Null(Schema):
    def encode(self, value: Any, path: str) -> Any:
        return self.decode(value, path)

    def decode(self, value: Any, path: str) -> Any:
        if value is not None:
            raise _bad(path, "null", value)
        return None


@dataclass(frozen=True)
class List(Schema):
    item: Schema
    max_items: int

    def encode(self, value: Any, path: str) -> Any:
        if not isinstance(value, list | tuple) or len(value) > self.max_items:
            raise _bad(path, f"a list of at most {self.max_items} items", value)
        return [self.item.encode(v, f"{path}[{i}]") for i, v in enumerate(value)]

    def decode(self, value: Any, path: str) -> Any:
        if not isinstance(value, list) or len(value) > self.max_items:
            raise _bad(path, f"a list of at most {self.max_items} items", value)
        return [self.item.decode(v, f"{path}[{i}]") for i, v in enumerate(value)]


@dataclass(frozen=True)
class Tuple(Schema):
    """A fixed-length list whose items have their own types; a Python tuple."""

    items: tuple[Schema, ...]

    def encode(self, value: Any, path: str) -> Any:
        if not isinstance(value, list | tuple) or len(value) != len(self.items):
            raise _bad(path, f"a list of exactly {len(self.items)} items", value)
        return [s.encode(v, f"{path}[{i}]") for i, (s, v) in enumerate(zip(self.items, value, strict=True))]

    def decode(self, value: Any, path: str) -> Any:
        if not isinstance(value, list) or len(value) != len(self.items):
            raise _bad(path, f"a list of exactly {len(self.items)} items", value)
        return tuple(
            s.decode(v, f"{path}[{i}]") for i, (s, v) in enumerate(zip(self.items, value, strict=True))
        )


@dataclass(frozen=True)
class Record(Schema):
    """An object with exactly these fields (every one required, no other allowed)."""

    fields: Mapping[str, Schema]

    def _each(self, value: Any, path: str, how: str) -> dict[str, Any]:
        if not isinstance(value, Mapping):
            raise _bad(path, "an object", value)
        unknown = sorted(str(k) for k in value if k not in self.fields)
        if unknown:
            raise ControlMessageError(f"field {path or '<message>'}: unknown field(s) {unknown[:5]}")
        missing = sorted(k for k in self.fields if k not in value)
        if missing:
            raise ControlMessageError(f"field {path or '<message>'}: missing field(s) {missing}")
        at = f"{path}." if path else ""
        return {k: getattr(s, how)(value[k], f"{at}{k}") for k, s in self.fields.items()}

    def encode(self, value: Any, path: str) -> Any:
        return self._each(value, path, "encode")

    def decode(self, value: Any, path: str) -> Any:
        return self._each(value, path, "decode")


@dataclass(frozen=True)
class Map(Schema):
    """An object from short string keys to values of one type."""

    value: Schema
    max_items: int
    max_key_len: int = 128

    def _each(self, value: Any, path: str, how: str) -> dict[str, Any]:
        if not isinstance(value, Mapping) or len(value) > self.max_items:
            raise _bad(path, f"an object of at most {self.max_items} entries", value)
        out = {}
        for key, item in value.items():
            Str(self.max_key_len, 1).decode(key, f"{path}<key>")
            out[key] = getattr(self.value, how)(item, f"{path}[{key!r}]")
        return out

    def encode(self, value: Any, path: str) -> Any:
        return self._each(value, path, "encode")

    def decode(self, value: Any, path: str) -> Any:
        return self._each(value, path, "decode")


PARTITION_ID = Record(
    {"app": Str(256, 1), "shuffle": Int(0, I32), "map": Int(0, I32), "attempt": Int(0, I64)}
)
"""``ids.PartitionId.to_wire()`` as a schema."""
PARTITION_REQUEST = Record({"partition": PARTITION_ID, "subpartition": Int(0, I32)})
"""The body of a data stream's PARTITION_REQUEST frame (``partition_server``)."""


# -- operations and services -----------------------------------------------------------------------
@dataclass(frozen=True)
class Operation:
    """One call: its request fields, its response, their size caps (encoded JSON bytes) and the
    client's default overall deadline."""

    name: str
    request: Record
    response: Schema
    max_request_bytes: int = MAX_CONTROL_PAYLOAD
    max_response_bytes: int = MAX_CONTROL_PAYLOAD
    timeout_s: float = 30.0


@dataclass(frozen=True)
class Service:
    """A named set of operations; the name is what a client claims in the handshake, so a
    client of one service is refused by another's server."""

    name: str
    operations: tuple[Operation, ...]
    by_name: dict[str, Operation] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "by_name", {op.name: op for op in self.operations})
        for op in self.operations:  # ControlClient.call(op, timeout_s, **fields)
            if {"op", "timeout_s"} & set(op.request.fields):
                raise ShuffleConfigError(f"operation {op.name!r}: 'op' and 'timeout_s' are not field names")

    @property
    def max_request_bytes(self) -> int:
        return max(op.max_request_bytes for op in self.operations)

    def operation(self, name: Any, where: str) -> Operation:
        op = self.by_name.get(name) if isinstance(name, str) else None
        if op is None:
            shown = repr(name)[:80]
            raise ControlMessageError(f"unknown operation {shown} for service {self.name!r} {where}")
        return op


def decode_json(body: bytes, where: str) -> Any:
    """Strict JSON: UTF-8, no duplicate keys, no NaN/Infinity; else ``ControlMessageError``."""

    def no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out = dict(pairs)
        if len(out) != len(pairs):
            raise ValueError("duplicate key")
        return out

    def no_constant(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    try:
        return json.loads(body.decode("utf-8"), object_pairs_hook=no_duplicates, parse_constant=no_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ControlMessageError(
            f"not a JSON control message ({type(exc).__name__}: {str(exc)[:80]}) {where}".rstrip()
        ) from exc


def encode_json(message: Any) -> bytes:
    """Compact JSON of an already schema-checked message."""
    return json.dumps(message, separators=(",", ":"), allow_nan=False).encode()


ERROR_REPLY = Record({"code": Str(32, 1), "message": Str(4096)})
"""The ``error`` of a refused call's reply: a code of ``ERROR_CLASSES`` and the server's message."""
ERROR_CLASSES: dict[str, Callable[[str], ShuffleError]] = {
    "protocol": ControlMessageError,
    "authentication": ShuffleAuthenticationError,
    "not-found": PartitionNotFoundError,
    "refused": ControlRequestError,
    "internal": ControlRequestError,
}


def reply_code(exc: BaseException) -> str:
    """The error code a server replies with for ``exc`` (``internal``: a bug, details kept in its log)."""
    if isinstance(exc, ShuffleProtocolError):
        return "protocol"
    if isinstance(exc, ShuffleAuthenticationError):
        return "authentication"
    if isinstance(exc, PartitionNotFoundError):
        return "not-found"
    if isinstance(exc, ShuffleError):
        return "refused"
    return "internal"


def printable(text: str, limit: int = 4096) -> str:
    """Text from a peer, safe to log: control characters (newlines included) become ``?``."""
    return "".join(c if c.isprintable() else "?" for c in text[:limit])


def shape(message: Any) -> str:
    """What a message that is not the expected object looks like, for an error."""
    if isinstance(message, dict):
        return f"an object with fields {sorted(str(k) for k in message)[:5]}"
    return f"a JSON {type(message).__name__}"
