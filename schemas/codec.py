"""The one codec for every topic: Avro single-object encoding, or Confluent's wire format.

Single-object encoding (Avro spec): 0xC3 0x01, the writer schema's 8-byte CRC-64-AVRO
fingerprint, then the body. It needs no server: the fingerprint is looked up in the schema
history kept in `schemas/avsc/`. When a schema registry URL is set, values are written in the
Confluent wire format (0x00 + 4-byte schema id) through confluent-kafka's serializers.
Readers pick the format by the first byte and resolve old writer schemas to the current one.
"""

from __future__ import annotations

import io
import struct
from typing import Any

from fastavro import schemaless_reader, schemaless_writer
from fastavro.validation import ValidationError as AvroValidationError
from fastavro.validation import validate

from schemas.errors import CodecError
from schemas.history import SchemaHistory, SchemaVersion

SINGLE_OBJECT_MAGIC = b"\xc3\x01"
CONFLUENT_MAGIC = 0x00
_HEADER_LEN = 10

# What fastavro raises on a body that ends early or holds garbage.
_DECODE_ERRORS = (EOFError, ValueError, IndexError, KeyError, UnicodeDecodeError, struct.error,
                  TypeError, OverflowError, MemoryError)
_ENCODE_ERRORS = (ValueError, TypeError, KeyError, AttributeError, OverflowError, struct.error)


class Codec:
    """Encode and decode the design's records by schema name ("Span", "Reward", ...)."""

    def __init__(self, history: SchemaHistory | None = None, registry_url: str | None = None):
        self.history = history or SchemaHistory()
        self.registry_url = registry_url
        self._registry = None
        self._serializers: dict[str, Any] = {}
        self._deserializers: dict[str, Any] = {}

    # -- writing ---------------------------------------------------------------------------

    def encode(self, name: str, record: dict, topic: str | None = None) -> bytes:
        """Bytes of `record` written with the current `name` schema."""
        if self.registry_url:
            return self._encode_confluent(name, record, topic)
        schema = self.history.current(name)
        buf = io.BytesIO()
        buf.write(schema.header)
        try:
            schemaless_writer(buf, schema.parsed, schema.tag_unions(record))
        except _ENCODE_ERRORS as exc:
            raise CodecError("invalid_record", self._explain_invalid(schema, record, exc)) from exc
        return buf.getvalue()

    @staticmethod
    def _explain_invalid(schema: SchemaVersion, record: Any, exc: Exception) -> str:
        if not isinstance(record, dict):
            return f"{schema.name} record must be a dict, got {type(record).__name__}"
        missing = [
            f["name"] for f in schema.raw["fields"] if f["name"] not in record and "default" not in f
        ]
        if missing:
            return f"{schema.name} record is missing required field(s) {missing}"
        try:
            validate(record, schema.parsed, raise_errors=True)
        except AvroValidationError as verr:
            detail = "; ".join(str(e) for e in getattr(verr, "errors", [verr]))
            return f"{schema.name} record does not match its schema: {detail}"
        return f"{schema.name} record could not be written: {exc!r}"

    # -- reading ---------------------------------------------------------------------------

    def decode(self, data: bytes, name: str | None = None) -> dict:
        """The record in `data`, resolved to the current schema of its name.

        With `name`, a message of another schema is an error (a span on the rewards topic)."""
        if not data:
            raise CodecError("empty", "message is empty; expected an Avro single-object or Confluent message")
        if data[:2] == SINGLE_OBJECT_MAGIC:
            return self._decode_single_object(data, name)
        if data[0] == CONFLUENT_MAGIC:
            return self._decode_confluent(data, name)
        raise CodecError(
            "bad_magic",
            f"first bytes {data[:2].hex()!r}: expected c301 (Avro single-object) or 00 (Confluent)",
        )

    def writer_schema(self, data: bytes) -> SchemaVersion:
        """The history entry a single-object message was written with."""
        if len(data) < _HEADER_LEN:
            raise CodecError("truncated", f"{len(data)} bytes; a single-object header is {_HEADER_LEN}")
        fp = bytes(data[2:_HEADER_LEN])
        writer = self.history.by_fingerprint.get(fp)
        if writer is None:
            raise CodecError(
                "unknown_schema",
                f"fingerprint {fp.hex()} matches no schema in the history "
                f"(known: {', '.join(self.history.names)})",
            )
        return writer

    def _decode_single_object(self, data: bytes, name: str | None) -> dict:
        writer = self.writer_schema(data)
        if name is not None and writer.name != name:
            raise CodecError("wrong_schema", f"message is a {writer.name}, expected a {name}")
        reader = self.history.current(writer.name)
        buf = io.BytesIO(data)
        buf.seek(_HEADER_LEN)
        try:
            if reader is writer:
                record = schemaless_reader(buf, writer.parsed, None)
            else:
                record = schemaless_reader(buf, writer.parsed, reader.parsed)
        except _DECODE_ERRORS as exc:
            raise CodecError(
                "truncated", f"{writer.name} v{writer.version} body is cut short or corrupt ({exc!r})"
            ) from exc
        if buf.tell() != len(data):
            raise CodecError(
                "trailing_bytes",
                f"{len(data) - buf.tell()} bytes after the end of a {writer.name} record",
            )
        return record

    # -- Confluent wire format ---------------------------------------------------------------

    def _client(self):
        if self._registry is None:
            if not self.registry_url:
                raise CodecError(
                    "no_registry",
                    "message is in the Confluent wire format (0x00) but no schema registry URL "
                    "is set (TRACETRAIN_SCHEMA_REGISTRY__URL)",
                )
            from confluent_kafka.schema_registry import SchemaRegistryClient

            # new_client gives the in-process mock for a mock:// URL (tests), the REST client otherwise.
            self._registry = SchemaRegistryClient.new_client({"url": self.registry_url})
        return self._registry

    def _encode_confluent(self, name: str, record: dict, topic: str | None) -> bytes:
        from confluent_kafka.schema_registry.avro import AvroSerializer
        from confluent_kafka.serialization import MessageField, SerializationContext

        schema = self.history.current(name)
        serializer = self._serializers.get(name)
        if serializer is None:
            serializer = AvroSerializer(
                self._client(), _schema_str(schema)
            )
            self._serializers[name] = serializer
        ctx = SerializationContext(topic or f"tracetrain.{name.lower()}", MessageField.VALUE)
        try:
            return serializer(record, ctx)
        except Exception as exc:  # confluent wraps fastavro's errors in its own types
            raise CodecError("invalid_record", self._explain_invalid(schema, record, exc)) from exc

    def _decode_confluent(self, data: bytes, name: str | None) -> dict:
        from confluent_kafka.schema_registry.avro import AvroDeserializer
        from confluent_kafka.serialization import MessageField, SerializationContext

        if len(data) < 5:
            raise CodecError("truncated", f"{len(data)} bytes; a Confluent header is 5")
        client = self._client()
        schema_id = struct.unpack(">I", data[1:5])[0]
        try:
            registered = client.get_schema(schema_id)
        except Exception as exc:
            raise CodecError("unknown_schema", f"schema id {schema_id} is not in the registry") from exc
        import json

        writer_name = json.loads(registered.schema_str).get("name")
        if name is not None and writer_name != name:
            raise CodecError("wrong_schema", f"message is a {writer_name}, expected a {name}")
        reader = self.history.current(writer_name)
        deserializer = self._deserializers.get(writer_name)
        if deserializer is None:
            deserializer = AvroDeserializer(client, _schema_str(reader))
            self._deserializers[writer_name] = deserializer
        try:
            return deserializer(data, SerializationContext("", MessageField.VALUE))
        except Exception as exc:
            raise CodecError("truncated", f"{writer_name} body is cut short or corrupt ({exc!r})") from exc


def _schema_str(schema: SchemaVersion) -> str:
    import json

    return json.dumps(schema.raw)
