"""lynx_npu: progressive split-stream KV-cache quantization (Lynx) for disaggregated inference.

    import lynx_npu
    codec = lynx_npu.get_codec("lynx")
    enc = codec.encode(k, v)                       # k, v: [num_kv_heads, num_tokens, head_dim]
    k_anchor, v_anchor = codec.decode(enc, stage="anchor")
    k_full, v_full = codec.decode(enc, stage="full")
"""
from .codec import get_codec, list_codecs, register_codec  # noqa: F401

__version__ = "0.1.0"
