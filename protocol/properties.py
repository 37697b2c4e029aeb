"""Typed message properties: Python values <-> wire `Property` <-> table maps.

Types and limits follow BlazingMQ: bool, int32, int64, string, binary; at most
255 properties; names start with a letter or digit and are at most 4095 chars.
A Python `int` becomes int32 when it fits and int64 otherwise.
"""

from __future__ import annotations

import base64
from typing import Iterable, Mapping, Union

from protocol import taproot_pb2 as pb

PropertyValue = Union[bool, int, str, bytes]
# The clusters a message has passed through federation links, comma-separated
# (docs/federation.md): set by each link; no link sends a message where it was.
VIA = "taproot.via"

PROPERTIES_MAX = 255
NAME_LENGTH_MAX = 4095
VALUE_BYTES_MAX = 67_104_745            # BlazingMQ: bmqa_messageproperties.h
AREA_BYTES_MAX = 64 * 1024 * 1024 - 8   # all names and values of one message
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def validate_name(name: str) -> str | None:
    if not name or len(name) > NAME_LENGTH_MAX or not name[0].isalnum():
        return f"property name {name!r} must be 1..{NAME_LENGTH_MAX} characters starting with a letter or digit"
    return None


def to_wire(properties: Mapping[str, PropertyValue] | None) -> list[pb.Property]:
    """Raise ValueError with the reason when a property is not representable."""
    if not properties:
        return []
    if len(properties) > PROPERTIES_MAX:
        raise ValueError(f"{len(properties)} properties; at most {PROPERTIES_MAX}")
    out = []
    for name, value in properties.items():
        reason = validate_name(name)
        if reason:
            raise ValueError(reason)
        if isinstance(value, bool):
            out.append(pb.Property(name=name, bool_value=value))
        elif isinstance(value, int):
            if INT32_MIN <= value <= INT32_MAX:
                out.append(pb.Property(name=name, int32_value=value))
            elif INT64_MIN <= value <= INT64_MAX:
                out.append(pb.Property(name=name, int64_value=value))
            else:
                raise ValueError(f"property {name!r}: {value} does not fit in int64")
        elif isinstance(value, str):
            out.append(pb.Property(name=name, string_value=value))
        elif isinstance(value, (bytes, bytearray, memoryview)):
            out.append(pb.Property(name=name, binary_value=bytes(value)))
        else:
            raise ValueError(f"property {name!r}: unsupported type {type(value).__name__}")
    reason = check_sizes(out)
    if reason:
        raise ValueError(reason)
    return out


def _value_size(prop: pb.Property) -> int:
    kind = prop.WhichOneof("value")
    if kind == "string_value":
        return len(prop.string_value.encode())
    if kind == "binary_value":
        return len(prop.binary_value)
    return 8


def check_sizes(properties: list[pb.Property]) -> str | None:
    area = 0
    for prop in properties:
        size = _value_size(prop)
        if size > VALUE_BYTES_MAX:
            return f"property {prop.name!r}: value of {size} bytes exceeds {VALUE_BYTES_MAX}"
        area += len(prop.name) + size
    if area > AREA_BYTES_MAX:
        return f"properties take {area} bytes; at most {AREA_BYTES_MAX}"
    return None


def from_wire(properties: list[pb.Property]) -> dict[str, PropertyValue]:
    out: dict[str, PropertyValue] = {}
    for prop in properties:
        kind = prop.WhichOneof("value")
        out[prop.name] = getattr(prop, kind) if kind else ""
    return out


def validate_wire(properties: list[pb.Property]) -> str | None:
    """Server-side check of a PUT's properties; returns a reason or None."""
    if len(properties) > PROPERTIES_MAX:
        return f"{len(properties)} properties; at most {PROPERTIES_MAX}"
    seen = set()
    for prop in properties:
        reason = validate_name(prop.name)
        if reason:
            return reason
        if prop.name in seen:
            return f"property {prop.name!r} given twice"
        seen.add(prop.name)
        if prop.WhichOneof("value") is None:
            return f"property {prop.name!r} has no value"
    return check_sizes(properties)


_TYPE_NAMES = {"bool_value": "bool", "int32_value": "int32", "int64_value": "int64",
               "string_value": "string", "binary_value": "binary"}


def wire_to_maps(properties: Iterable[pb.Property]) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(values, types) as key/value pair lists for the tables' two string maps."""
    values, types = [], []
    for prop in properties:
        kind = prop.WhichOneof("value")
        value = getattr(prop, kind)
        if kind == "binary_value":
            text = base64.b64encode(value).decode("ascii")
        elif kind == "bool_value":
            text = "true" if value else "false"
        else:
            text = str(value)
        values.append((prop.name, text))
        types.append((prop.name, _TYPE_NAMES[kind]))
    return values, types


def maps_to_wire(values: list[tuple[str, str]] | None, types: list[tuple[str, str]] | None) -> list[pb.Property]:
    if not values:
        return []
    type_of = dict(types or [])
    out = []
    for name, text in values:
        kind = type_of.get(name, "string")
        if kind == "binary":
            out.append(pb.Property(name=name, binary_value=base64.b64decode(text)))
        elif kind == "bool":
            out.append(pb.Property(name=name, bool_value=text == "true"))
        elif kind == "int32":
            out.append(pb.Property(name=name, int32_value=int(text)))
        elif kind == "int64":
            out.append(pb.Property(name=name, int64_value=int(text)))
        else:
            out.append(pb.Property(name=name, string_value=text))
    return out
