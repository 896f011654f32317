"""gRPC message framing and a small protobuf wire-format reader for the fields the gRPC parsers need.

A gRPC request body through Envoy is `[compressed flag:1][length:4 BE][message]`; compressed frames are refused (as
the router does). The reader decodes protobuf's wire types without a generated module: each field number maps to a
list of raw values (ints for varints/fixed, bytes for length-delimited), and malformed input raises BadRequest.
"""

from __future__ import annotations

import struct

from epp.framework import BadRequest

GRPC_HEADER = 5


def grpc_message(data: bytes) -> bytes:
    """The first message of a gRPC-framed body."""
    if len(data) < GRPC_HEADER:
        raise BadRequest(f"invalid gRPC frame: expected at least {GRPC_HEADER} bytes for header, got {len(data)}")
    if data[0] == 1:
        raise BadRequest("compressed gRPC payload is not supported")
    if data[0] != 0:
        raise BadRequest(f"invalid gRPC frame: compressed flag {data[0]}")
    (length,) = struct.unpack(">I", data[1:5])
    if len(data) < GRPC_HEADER + length:
        raise BadRequest(
            f"incomplete gRPC payload: header indicates {length} bytes, only {len(data) - GRPC_HEADER} available"
        )
    return data[GRPC_HEADER : GRPC_HEADER + length]


def grpc_frame(message: bytes) -> bytes:
    return b"\x00" + struct.pack(">I", len(message)) + message


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if i >= len(buf):
            raise BadRequest("invalid protobuf message: truncated varint")
        b = buf[i]
        i += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, i
        shift += 7
        if shift >= 64:
            raise BadRequest("invalid protobuf message: varint too long")


def fields(buf: bytes) -> dict[int, list[int | bytes]]:
    """Field number → values in wire order (varint/fixed as int, length-delimited as bytes; groups refused)."""
    out: dict[int, list[int | bytes]] = {}
    i = 0
    n = len(buf)
    while i < n:
        key, i = _varint(buf, i)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise BadRequest("invalid protobuf message: field number 0")
        value: int | bytes
        if wire == 0:
            value, i = _varint(buf, i)
        elif wire == 1:
            if i + 8 > n:
                raise BadRequest("invalid protobuf message: truncated fixed64")
            (value,) = struct.unpack_from("<Q", buf, i)
            i += 8
        elif wire == 2:
            size, i = _varint(buf, i)
            if i + size > n:
                raise BadRequest("invalid protobuf message: truncated length-delimited field")
            value = buf[i : i + size]
            i += size
        elif wire == 5:
            if i + 4 > n:
                raise BadRequest("invalid protobuf message: truncated fixed32")
            (value,) = struct.unpack_from("<I", buf, i)
            i += 4
        else:
            raise BadRequest(f"invalid protobuf message: unsupported wire type {wire}")
        out.setdefault(number, []).append(value)
    return out


def last_bytes(f: dict[int, list[int | bytes]], number: int) -> bytes | None:
    values = f.get(number)
    if not values:
        return None
    v = values[-1]
    if not isinstance(v, bytes):
        raise BadRequest(f"invalid protobuf message: field {number} is not length-delimited")
    return v


def last_str(f: dict[int, list[int | bytes]], number: int) -> str:
    v = last_bytes(f, number)
    if v is None:
        return ""
    try:
        return v.decode()
    except UnicodeDecodeError:
        raise BadRequest(f"invalid protobuf message: field {number} is not UTF-8") from None


def last_int(f: dict[int, list[int | bytes]], number: int) -> int | None:
    values = f.get(number)
    if not values:
        return None
    v = values[-1]
    if not isinstance(v, int):
        raise BadRequest(f"invalid protobuf message: field {number} is not a varint")
    return v


def repeated_uint32(f: dict[int, list[int | bytes]], number: int) -> list[int]:
    """A repeated uint32 field, packed or not."""
    out: list[int] = []
    for v in f.get(number, ()):
        if isinstance(v, int):
            out.append(v & 0xFFFFFFFF)
            continue
        i = 0
        while i < len(v):
            x, i = _varint(v, i)
            out.append(x & 0xFFFFFFFF)
    return out


def repeated_str(f: dict[int, list[int | bytes]], number: int) -> list[str]:
    out = []
    for v in f.get(number, ()):
        if not isinstance(v, bytes):
            raise BadRequest(f"invalid protobuf message: field {number} is not a string")
        try:
            out.append(v.decode())
        except UnicodeDecodeError:
            raise BadRequest(f"invalid protobuf message: field {number} is not UTF-8") from None
    return out


def repeated_messages(f: dict[int, list[int | bytes]], number: int) -> list[dict[int, list[int | bytes]]]:
    out = []
    for v in f.get(number, ()):
        if not isinstance(v, bytes):
            raise BadRequest(f"invalid protobuf message: field {number} is not a message")
        out.append(fields(v))
    return out
