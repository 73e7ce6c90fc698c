"""The frames frozen as frame format v5 golden bytes (tests/wire/golden/*.bin).

Parameters are literal dicts, not codec.params(): these fixtures freeze the frame format and
must not move when a codec's defaults do (golden_payloads.py freezes real codec output).
They are complete payload-format-4 parameter sets (test_golden checks that they build; they
were format 2 until the recent-token window, 2026-11-27, and format 3 until V's own chunk size).
Regenerate only for a new frame format version. golden/v1_hello.bin and v2_hello.bin are the
first frames a format-1 and a format-2 peer send (v3_hello.bin, v4_hello.bin: formats 3 and 4),
kept to check that they are refused by name.
"""
from lynx_npu.wire import CodecSpec, Compat, Frame, Kind, ReceiveLimits, page_table, params_to_json

LYNX_PARAMS = {"alpha_k": 3.0, "alpha_v": 3.0, "anchor_bits": 4, "center": "midrange",
               "chunk_size": 32, "k_axis": "channel", "layer_anchor_bits": "[[18,5,4]]",
               "layer_v_chunk_size": "[[3,64]]",
               "num_sink_tokens": 4, "page_size": 256, "payload_format": 9,
               "recent_tokens": 32, "scalar_grid": "byte", "scalar_preview": True,
               "v_anchor_bits": 4,
               "v_axis": "token", "v_chunk_size": 32}
INT8_PARAMS = {"page_size": 256, "payload_format": 9}
RID = 0x0123456789ABCDEF
SENDER = Compat(9, (CodecSpec("lynx", params_to_json(LYNX_PARAMS)),
                    CodecSpec("int8", params_to_json(INT8_PARAMS))),
                session="00112233445566778899aabbccddeeff")
RECEIVER = Compat(9, limits=ReceiveLimits(
    max_request_bytes=8 << 30, max_payload_bytes=64 << 20, max_params_bytes=1024,
    max_layers=4096, max_tokens=1 << 22, max_kv_heads=1024, max_head_dim=1024))


def _payload(n: int, mult: int) -> bytes:
    return bytes((i * mult + 11) % 256 for i in range(n))


FRAMES: dict[str, Frame] = {
    "anchor_lynx": Frame(Kind.ANCHOR, RID, layer=3, num_layers=30, page=2, token_start=516,
                         token_end=772, num_tokens=8192, codec_id=9, dtype=2, num_kv_heads=3,
                         head_dim=64, params=params_to_json(LYNX_PARAMS),
                         payload=_payload(96, 7)),
    "residual_lynx": Frame(Kind.RESIDUAL, RID, layer=29, num_layers=30, page=31,
                           token_start=7940, token_end=8192, num_tokens=8192, codec_id=9,
                           dtype=2, num_kv_heads=3, head_dim=64,
                           params=params_to_json(LYNX_PARAMS), payload=_payload(64, 13)),
    "anchor_int8_fp16": Frame(Kind.ANCHOR, 5, layer=0, num_layers=1, page=0, token_start=0,
                              token_end=7, num_tokens=7, codec_id=2, dtype=1, num_kv_heads=2,
                              head_dim=4, params=params_to_json(INT8_PARAMS),
                              payload=_payload(72, 3)),
    # three pages of one layer's residual in one frame: the page table, then their bytes
    "residual_lynx_pages": Frame(Kind.RESIDUAL, RID, layer=4, num_layers=30, page=0,
                                 token_start=0, token_end=772, num_tokens=8192, codec_id=9,
                                 dtype=2, num_kv_heads=3, head_dim=64,
                                 params=params_to_json(LYNX_PARAMS), extra_pages=2,
                                 payload=page_table([260, 516, 772], [40, 32, 24])
                                 + _payload(96, 5)),
    "hello_sender": Frame(Kind.HELLO, payload=bytes(range(32)) + SENDER.to_json()),
    "hello_receiver": Frame(Kind.HELLO, payload=bytes(range(32, 64)) + RECEIVER.to_json()),
    "auth_hmac": Frame(Kind.AUTH, payload=bytes(range(100, 132))),
    "auth_ok_empty": Frame(Kind.AUTH_OK),
    "ack": Frame(Kind.ACK, RID, layer=3, page=2, ref_kind=Kind.ANCHOR),
    "nack": Frame(Kind.NACK, 42, layer=1, page=9, ref_kind=Kind.RESIDUAL),
    "error": Frame(Kind.ERROR, 42, payload="request 42: deadline of 5.0 s passed".encode()),
    "error_incompatible": Frame(Kind.ERROR, ref_kind=Kind.HELLO, payload=(
        "payload format differs: the sender's is 3, the receiver's 2").encode()),
}
