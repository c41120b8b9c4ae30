"""The Avro contracts (`avsc/NAME.vN.avsc`, every released version kept) and the codec."""

from schemas.codec import Codec, CodecError, SchemaHistory

__all__ = ["Codec", "CodecError", "SchemaHistory"]
