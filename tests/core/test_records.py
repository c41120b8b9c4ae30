"""tracetrain.records against the current `.avsc` files: every record (nested ones too) has a
TypedDict of its name with the same fields, optional exactly where the schema has a default,
nullable exactly where it is a union with null, and of the matching Python type."""

from __future__ import annotations

import typing

import pytest

from schemas import SchemaHistory
from tracetrain import records

PRIMITIVES = {"string": str, "long": int, "int": int, "double": float, "float": float,
              "boolean": bool}
HISTORY = SchemaHistory()


def python_type(avro) -> object:
    """The type hint a TypedDict field must have for Avro type `avro`."""
    if isinstance(avro, list):
        branches = [python_type(b) for b in avro if b != "null"]
        hint = branches[0] if len(branches) == 1 else typing.Union[tuple(branches)]  # noqa: UP007
        return hint | None if "null" in avro else hint
    if isinstance(avro, str):
        return PRIMITIVES[avro]
    kind = avro["type"]
    if kind == "record":
        return getattr(records, avro["name"])
    if kind == "enum":
        return typing.Literal[tuple(avro["symbols"])]
    if kind == "array":
        return list[python_type(avro["items"])]
    if kind == "map":
        return dict[str, python_type(avro["values"])]
    return python_type(kind)


def nested_records(avro, found: dict) -> dict:
    """Every record schema inside `avro`, by name."""
    if isinstance(avro, list):
        for branch in avro:
            nested_records(branch, found)
    elif isinstance(avro, dict):
        if avro.get("type") == "record":
            found[avro["name"]] = avro
            for f in avro["fields"]:
                nested_records(f["type"], found)
        for key in ("items", "values"):
            if key in avro:
                nested_records(avro[key], found)
    return found


def all_records() -> list[tuple[str, dict]]:
    found: dict = {}
    for name in records.RECORDS:
        nested_records(HISTORY.current(name).raw, found)
    return sorted(found.items())


def test_every_schema_has_a_record_type():
    assert set(records.RECORDS) == set(HISTORY.names)
    assert {name for name, _ in all_records()} >= {"Span", "LlmCall", "ToolCall", "Usage", "Resource"}


@pytest.mark.parametrize(("name", "schema"), all_records(), ids=lambda v: v if isinstance(v, str) else "")
def test_record_type_matches_its_schema(name, schema):
    typed = getattr(records, name)
    hints = typing.get_type_hints(typed)
    fields = {f["name"]: f for f in schema["fields"]}
    assert list(hints) == list(fields), f"{name}: fields (in order) differ from the schema"
    assert typed.__optional_keys__ == {n for n, f in fields.items() if "default" in f}, name
    for field_name, field in fields.items():
        want, got = python_type(field["type"]), hints[field_name]
        if want is str and typing.get_origin(got) is typing.Literal:
            # A plain string in the schema that only some values are allowed in (Checkpoint.mode).
            assert all(isinstance(v, str) for v in typing.get_args(got)), f"{name}.{field_name}"
            continue
        assert got == want, f"{name}.{field_name}: {got} != {want} (schema {field['type']})"
