"""Union branches named by the codec: the same bytes as fastavro's own search, and a value
the cheap checks are unsure of goes through fastavro's validation (a clear CodecError)."""

from __future__ import annotations

import copy
import io

import pytest
from fastavro import parse_schema, schemaless_writer

from schemas import Codec, CodecError
from schemas.unions import branch_tagger
from testkit.records import EXAMPLES, span, tool_span

CODEC = Codec()
SPAN = CODEC.history.current("Span")


def _plain(schema, record) -> bytes:
    buf = io.BytesIO()
    buf.write(schema.header)
    schemaless_writer(buf, schema.parsed, record)
    return buf.getvalue()


def _records():
    no_usage = span()
    no_usage["llm"]["usage"] = None
    no_result = tool_span()
    no_result["tool"]["result"] = None
    yield from (("Span", span()), ("Span", tool_span()), ("Span", no_usage), ("Span", no_result))
    yield from EXAMPLES.items()
    for schema in CODEC.history.versions["Span"]:
        yield schema, span()


@pytest.mark.parametrize("name, record", list(_records()))
def test_named_branches_write_the_bytes_fastavro_writes(name, record):
    schema = name if not isinstance(name, str) else CODEC.history.current(name)
    assert _plain(schema, schema.tag_unions(record)) == _plain(schema, record)


def test_span_parts_are_named_and_the_record_is_not_changed():
    record = span()
    before = copy.deepcopy(record)
    tagged = SPAN.tag_unions(record)
    assert tagged["llm"][0] == "dev.tracetrain.LlmCall"
    assert tagged["llm"][1]["usage"][0] == "dev.tracetrain.Usage"
    assert SPAN.tag_unions(tool_span())["tool"][0] == "dev.tracetrain.ToolCall"
    assert record == before


@pytest.mark.parametrize("part, field, value", [
    ("llm", "prompt_token_ids", [1, 2.5, 3]),  # fastavro would write 2 without its search
    ("llm", "response_token_ids", [2**31]),  # beyond an Avro int
    ("llm", "response_logprobs", [-0.5, "x"]),
    ("llm", "policy_version", 3.0),
    ("llm", "usage", {"prompt_tokens": 3.5, "completion_tokens": 1}),
    ("tool", "ok", "yes"),  # fastavro would write True without its search
])
def test_a_wrong_value_is_not_named_and_fails_fastavros_validation(part, field, value):
    record = tool_span() if part == "tool" else span()
    record[part][field] = value
    assert not isinstance(SPAN.tag_unions(record)[part], tuple)
    with pytest.raises(CodecError, match="Span record does not match its schema") as info:
        CODEC.encode("Span", record)
    assert info.value.reason == "invalid_record"


def test_a_branch_the_caller_named_is_left_alone():
    record = span()
    record["llm"] = ("dev.tracetrain.LlmCall", record["llm"])
    assert SPAN.tag_unions(record)["llm"] is record["llm"]
    assert CODEC.decode(CODEC.encode("Span", record))["llm"]["model"] == record["llm"][1]["model"]


def test_a_record_that_contains_itself_is_left_to_fastavro():
    schema = parse_schema({"type": "record", "name": "Node", "fields": [
        {"name": "value", "type": "int"},
        {"name": "next", "type": ["null", "Node"]}]})
    record = {"value": 1, "next": {"value": 2, "next": None}}
    assert branch_tagger(schema)(record) is record
