"""Pure-PyTorch reference codecs: the specification every kernel matches."""
from .base import Codec, Encoded, EncodedPage, validate_kv  # noqa: F401
from .registry import CODEC_IDS, codec_from_wire, get_codec, list_codecs, register_codec  # noqa: F401
from . import baselines, cachegen, lynx  # noqa: F401,E402  (registers the codecs)
