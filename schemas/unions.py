"""Union branches named by the codec instead of searched for by fastavro.

    tag = branch_tagger(parsed_schema); schemaless_writer(buf, parsed_schema, tag(record))

fastavro writes a value of a union such as ["null", LlmCall] by validating it against each
branch until one fits. For a Span that validation of its LlmCall (hundreds of token ids and
logprobs) was half the cost of encoding it: 75 us per span, 45 us with the branch checked
here and named (bench.producer's spans, same bytes written). So when a union's value is a
dict holding exactly the Python types of the union's one record branch, the value is passed
in fastavro's tuple notation `(record name, value)` and written directly. The type tests are
as strict as fastavro's validation except in arrays of numbers, whose elements pass as
Python's array module converts them (bools as 0 and 1, numpy numbers as numbers). Any other
value is left as it was, for fastavro's own search, validation and errors: a value this module
is unsure of is never written unchecked.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from typing import Any

Check = Callable[[Any], bool]

_INT = (-(2**31), 2**31 - 1)
_LONG = (-(2**63), 2**63 - 1)
# Element types an array (or map values) of this Avro type may hold for the check to pass.
_ITEM_TYPES = {"string": {str}, "boolean": {bool}, "bytes": {bytes}}
# Arrays of numbers are checked by converting them to a C array of this type code.
_TYPECODES = {"int": "i", "long": "q", "float": "d", "double": "d"}


def _in_range(lo_hi: tuple[int, int]) -> Check:
    lo, hi = lo_hi
    return lambda v: type(v) is int and lo <= v <= hi


_SCALARS: dict[str, Check] = {
    "null": lambda v: v is None,
    "boolean": lambda v: type(v) is bool,
    "int": _in_range(_INT),
    "long": _in_range(_LONG),
    "float": lambda v: type(v) in (float, int),
    "double": lambda v: type(v) in (float, int),
    "string": lambda v: type(v) is str,
    "bytes": lambda v: type(v) is bytes,
}


def _array_check(items: Any, named: dict, building: frozenset) -> Check | None:
    if isinstance(items, str) and items in _TYPECODES:
        typecode = _TYPECODES[items]

        def check(v: Any) -> bool:
            # array() converts in one C loop (~17 ns an element against fastavro's ~100) and
            # refuses what matters of what fastavro's validation refuses: floats or strings
            # for ints, ints out of range, non-numbers for floats.
            if type(v) is not list:
                return False
            try:
                array(typecode, v)
            except (TypeError, OverflowError):
                return False
            return True

        return check
    if isinstance(items, str) and items in _ITEM_TYPES:
        allowed = _ITEM_TYPES[items]
        return lambda v: type(v) is list and set(map(type, v)) <= allowed
    item = _checker(items, named, building)
    if item is None:
        return None
    return lambda v: type(v) is list and all(map(item, v))


def _record_check(schema: dict, named: dict, building: frozenset) -> Check | None:
    fields = []
    for f in schema["fields"]:
        check = _checker(f["type"], named, building | {schema["name"]})
        if check is None:
            return None
        fields.append((f["name"], check, "default" in f))

    def check(v: Any) -> bool:
        if type(v) is not dict:
            return False
        for name, field_check, has_default in fields:
            if name in v:
                if not field_check(v[name]):
                    return False
            elif not has_default:
                return False
        return True

    return check


def _checker(t: Any, named: dict, building: frozenset = frozenset()) -> Check | None:
    """A strict type test for values of Avro type `t`, or None where we have none (also for
    a record that contains itself: `building` holds the records being built)."""
    if isinstance(t, str):
        if t in _SCALARS:
            return _SCALARS[t]
        return None if t in building or t not in named else _checker(named[t], named, building)
    if isinstance(t, list):
        branches = [_checker(b, named, building) for b in t]
        if any(b is None for b in branches):
            return None
        if len(t) == 2 and "null" in t:  # the usual optional field: no generator per value
            other = branches[1 - t.index("null")]
            return lambda v: v is None or other(v)
        return lambda v: any(b(v) for b in branches)
    kind = t.get("type")
    if t.get("name"):
        named.setdefault(t["name"], t)
    if kind == "record":
        return _record_check(t, named, building)
    if kind == "enum":
        symbols = frozenset(t["symbols"])
        return lambda v: type(v) is str and v in symbols
    if kind == "array":
        return _array_check(t["items"], named, building)
    if kind == "map":
        values = t["values"]
        allowed = _ITEM_TYPES.get(values) if isinstance(values, str) else None
        if allowed is None:
            return None
        return lambda v: (type(v) is dict and set(map(type, v)) <= {str}
                          and set(map(type, v.values())) <= allowed)
    # {"type": "long", "logicalType": ...} and the like; fixed and unknown kinds get None.
    return None if kind is None else _checker(kind, named, building)


def _passes(value: Any) -> bool:
    return True


def _record_branch(union: list, named: dict) -> dict | None:
    """The one record of a union like ["null", Rec], or None."""
    records = [named.get(b, b) if isinstance(b, str) else b for b in union]
    records = [b for b in records if isinstance(b, dict) and b.get("type") == "record"]
    return records[0] if len(records) == 1 else None


def branch_tagger(schema: dict, named: dict | None = None,
                  checked: bool = False) -> Callable[[Any], Any]:
    """For a parsed record schema: a function giving a record with its record unions named
    (a shallow copy), or the record itself where there is nothing to name. `checked`: the
    records it will get passed their check already, nested values included."""
    named = {} if named is None else named
    _checker(schema, named)  # registers every named type, wherever it is first defined
    tagged = []
    for f in schema["fields"]:
        t = f["type"]
        if not isinstance(t, list):
            continue
        branch = _record_branch(t, named)
        check = branch and _checker(branch, named)
        if check:
            # The check of a value covers its nested unions, so the inner tagger needn't.
            inner = branch_tagger(branch, named, checked=True)
            tagged.append((f["name"], branch["name"], _passes if checked else check, inner))
    if not tagged:
        return lambda record: record

    def tag(record: Any) -> Any:
        if type(record) is not dict:
            return record
        out = None
        for field, name, check, inner in tagged:
            value = record.get(field)
            if type(value) is dict and check(value):
                if out is None:
                    out = dict(record)
                out[field] = (name, inner(value))
        return record if out is None else out

    return tag
