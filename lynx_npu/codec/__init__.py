"""Pure-PyTorch reference codecs: the specification every kernel matches."""
from .base import Codec, Encoded, validate_kv  # noqa: F401
from .registry import get_codec, list_codecs, register_codec  # noqa: F401
