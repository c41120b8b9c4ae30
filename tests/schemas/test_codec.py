"""The codec: both encodings round-trip, old writers resolve, an independent reader agrees,
and bad input raises CodecError naming the problem."""

from __future__ import annotations

import io
import json

import avro.io
import avro.schema
import pytest

from schemas import Codec, CodecError, SchemaHistory
from schemas.codec import SINGLE_OBJECT_MAGIC
from testkit.records import EXAMPLES, span, tool_span


def _floats_close(a, b):
    return all(abs(x - y) < 1e-5 * max(1, abs(x)) for x, y in zip(a, b, strict=True))


def _same(record: dict, decoded: dict) -> None:
    """Equal, allowing float32 rounding of logprobs."""
    for key, value in record.items():
        got = decoded[key]
        if isinstance(value, dict) and "response_logprobs" in value:
            assert _floats_close(value["response_logprobs"], got["response_logprobs"])
            assert {k: v for k, v in value.items() if k != "response_logprobs"} == {
                k: v for k, v in got.items() if k != "response_logprobs"}
        elif key == "behaviour_logprobs":
            assert _floats_close(value, got)
        else:
            assert got == value, key


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_single_object_round_trip(name):
    codec = Codec()
    data = codec.encode(name, EXAMPLES[name])
    assert data[:2] == SINGLE_OBJECT_MAGIC
    assert data[2:10] == codec.history.current(name).fingerprint
    _same(EXAMPLES[name], codec.decode(data, name))


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_confluent_wire_format_round_trip(name):
    # mock:// is confluent-kafka's in-process registry: no registry server installs here.
    codec = Codec(registry_url="mock://codec-test")
    data = codec.encode(name, EXAMPLES[name], topic=f"tracetrain.{name.lower()}")
    assert data[0] == 0 and len(data) > 5
    _same(EXAMPLES[name], codec.decode(data, name))


def test_tool_span_round_trip():
    codec = Codec()
    record = tool_span()
    assert codec.decode(codec.encode("Span", record))["tool"] == record["tool"]


def test_every_history_version_has_distinct_fingerprint():
    history = SchemaHistory()
    assert len(history.by_fingerprint) == sum(len(v) for v in history.versions.values())
    assert history.current("Span").version == 3


def test_message_from_older_writer_decodes_with_current_reader():
    """Span v1 lacks policy_name (added in v2 with a default): old messages still decode."""
    codec = Codec()
    v1 = codec.history.version("Span", 1)
    record = span()
    del record["policy_name"]
    buf = io.BytesIO()
    buf.write(v1.header)
    from fastavro import schemaless_writer

    schemaless_writer(buf, v1.parsed, record)
    decoded = codec.decode(buf.getvalue(), "Span")
    assert decoded["policy_name"] is None
    assert decoded["rollout_id"] == record["rollout_id"]
    assert decoded["llm"]["prompt_token_ids"] == record["llm"]["prompt_token_ids"]


def test_cancelled_status_resolves_to_unset_for_older_readers():
    """v3 adds the status 'cancelled' (a client that went away mid-stream); a process still
    reading with v2 gets the enum's default, 'unset', instead of failing on the record."""
    codec = Codec()
    record = span()
    record["status"] = "cancelled"
    data = codec.encode("Span", record)
    assert codec.decode(data)["status"] == "cancelled"
    from fastavro import schemaless_reader

    v2, v3 = codec.history.version("Span", 2), codec.history.version("Span", 3)
    assert data[:10] == v3.header
    assert schemaless_reader(io.BytesIO(data[10:]), v3.parsed, v2.parsed)["status"] == "unset"


def test_transitions_written_before_retokenized_read_as_tokenised_by_the_engine():
    """Transition v3 adds `retokenized` (default false): a v2 record, written before the streams
    stage re-tokenised OpenTelemetry calls, reads as a call with the engine's own token ids; a
    learner still reading with v2 drops the flag and sees an ordinary record."""
    from fastavro import schemaless_reader, schemaless_writer

    codec = Codec()
    v2, v3 = codec.history.version("Transition", 2), codec.history.version("Transition", 3)
    assert codec.history.current("Transition") is v3
    record = {**EXAMPLES["Transition"], "sampling_temperature": 0.7}
    buf = io.BytesIO()
    buf.write(v2.header)
    schemaless_writer(buf, v2.parsed, record)
    decoded = codec.decode(buf.getvalue(), "Transition")
    assert decoded["retokenized"] is False and decoded["sampling_temperature"] == 0.7
    data = codec.encode("Transition", {**record, "behaviour_logprobs": [], "retokenized": True})
    assert codec.decode(data)["retokenized"] is True
    old_reader = schemaless_reader(io.BytesIO(data[10:]), v3.parsed, v2.parsed)
    assert "retokenized" not in old_reader and old_reader["behaviour_logprobs"] == []


def test_new_fields_always_have_defaults():
    """Backward compatibility rule: a field missing from the previous version has a default."""
    history = SchemaHistory()
    for versions in history.versions.values():
        for old, new in zip(versions, versions[1:], strict=False):
            old_names = {f["name"] for f in old.raw["fields"]}
            for field in new.raw["fields"]:
                if field["name"] not in old_names:
                    assert "default" in field, f"{new.name} v{new.version}.{field['name']}"


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_apache_avro_reads_our_single_object_messages(name):
    """The Apache `avro` package, an independent implementation, agrees on fingerprint and body."""
    codec = Codec()
    data = codec.encode(name, EXAMPLES[name])
    schema = avro.schema.parse(json.dumps(codec.history.current(name).raw))
    assert data[:2] == b"\xc3\x01"
    assert data[2:10] == schema.fingerprint("CRC-64-AVRO")
    decoder = avro.io.BinaryDecoder(io.BytesIO(data[10:]))
    decoded = avro.io.DatumReader(schema).read(decoder)
    _same(EXAMPLES[name], decoded)


def test_truncated_message():
    data = Codec().encode("Span", span())
    with pytest.raises(CodecError, match="truncated: Span v3 body is cut short") as info:
        Codec().decode(data[: len(data) // 2])
    assert info.value.reason == "truncated"
    with pytest.raises(CodecError, match="header is 10"):
        Codec().decode(data[:6])


def test_unknown_fingerprint():
    data = bytearray(Codec().encode("Reward", EXAMPLES["Reward"]))
    data[2:10] = b"\x00" * 8
    with pytest.raises(CodecError, match="fingerprint 0000000000000000 matches no schema") as info:
        Codec().decode(bytes(data))
    assert info.value.reason == "unknown_schema"


@pytest.mark.parametrize("data", [b"\x07garbage", b"{\"json\": 1}", b"\xc3\x02" + b"0" * 20])
def test_wrong_magic_byte(data):
    with pytest.raises(CodecError, match="expected c301 .Avro single-object. or 00") as info:
        Codec().decode(data)
    assert info.value.reason == "bad_magic"


def test_empty_message():
    with pytest.raises(CodecError, match="empty"):
        Codec().decode(b"")


def test_confluent_message_without_registry_is_a_clear_error():
    data = Codec(registry_url="mock://other").encode("Reward", EXAMPLES["Reward"], topic="x")
    with pytest.raises(CodecError, match="no schema registry URL is set"):
        Codec().decode(data)


def test_wrong_schema_for_topic():
    data = Codec().encode("Reward", EXAMPLES["Reward"])
    with pytest.raises(CodecError, match="message is a Reward, expected a Span") as info:
        Codec().decode(data, "Span")
    assert info.value.reason == "wrong_schema"


def test_record_missing_required_field():
    record = dict(EXAMPLES["Reward"])
    del record["rollout_id"]
    with pytest.raises(CodecError, match=r"Reward record is missing required field\(s\) \['rollout_id'\]"):
        Codec().encode("Reward", record)


def test_record_with_wrong_type_names_the_field():
    record = dict(EXAMPLES["Reward"], value="high")
    with pytest.raises(CodecError, match="Reward record does not match its schema.*value") as info:
        Codec().encode("Reward", record)
    assert info.value.reason == "invalid_record"


def test_trailing_bytes():
    data = Codec().encode("Reward", EXAMPLES["Reward"]) + b"\x00\x01"
    with pytest.raises(CodecError, match="2 bytes after the end of a Reward"):
        Codec().decode(data)


def test_unknown_schema_name():
    with pytest.raises(KeyError, match="unknown schema 'Spam'"):
        Codec().encode("Spam", {})
