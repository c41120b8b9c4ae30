"""The Avro contracts (`avsc/NAME.vN.avsc`, every released version kept) and the codec."""

from schemas.codec import Codec, CodecError, SchemaHistory
from schemas.errors import SchemasError

__all__ = ["Codec", "CodecError", "SchemaHistory", "SchemasError"]
