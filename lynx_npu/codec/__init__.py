"""Pure-PyTorch reference codecs: the specification every kernel matches."""
from .base import Codec, Encoded, EncodedPage, validate_kv  # noqa: F401
from .registry import (CODEC_IDS, PAYLOAD_FORMAT, codec_from_params, codec_from_wire,  # noqa: F401
                       get_codec, list_codecs, register_codec, wire_params)
from . import baselines, cachegen, lynx  # noqa: F401,E402  (registers the codecs)
