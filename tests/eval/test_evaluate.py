from dataclasses import dataclass

import pytest
import torch

import lynx_npu
from lynx_npu.codec import Codec, Encoded
from lynx_npu.eval.capture import LayerQKV
from lynx_npu.eval.codecs_cmd import format_table, make_report
from lynx_npu.eval.evaluate import build_refs, evaluate_codec
from lynx_npu.eval.progress import set_enabled

H, HQ, T, D = 2, 6, 48, 8


@dataclass(frozen=True)
class _Enc(Encoded):
    k: torch.Tensor
    v: torch.Tensor

    def nbytes(self, stage="full"):
        self.check_stage(stage)
        return 100 if stage == "anchor" else 300


class ScaledVCodec(Codec):
    """A two-stage test codec with known errors: the anchor keeps K and returns 0.9 V, full is
    exact. Its sizes are fixed: 100 bytes to the anchor, 300 in all, per layer."""

    name = "scaled-v"
    stages = ("anchor", "full")

    def encode(self, k, v):
        return _Enc(tuple(k.shape), k.dtype, self.stages, k.clone(), v.clone())

    def decode(self, enc, stage="full"):
        enc.check_stage(stage)
        return enc.k, (0.9 * enc.v if stage == "anchor" else enc.v)


def _layers(num_layers=3):
    g = torch.Generator().manual_seed(0)
    return [LayerQKV(torch.randn(HQ, T, D, generator=g), torch.randn(H, T, D, generator=g),
                     torch.randn(H, T, D, generator=g)) for _ in range(num_layers)]


@pytest.fixture(autouse=True)
def _quiet():
    set_enabled(False)
    yield
    set_enabled(True)


def test_known_errors_and_sizes_per_stage():
    refs = build_refs(_layers(), num_queries=16, kv_dtype=torch.float32)
    assert refs[0].q.shape == (HQ, 16, D) and refs[0].o.shape == (HQ, 16, D)
    res = evaluate_codec(ScaledVCodec(), refs, split_stages=("anchor",))
    anchor, full = (s.summary() for s in res.stages)
    assert anchor["stage"] == "anchor" and full["stage"] == "full"
    assert anchor["bits_per_value"] == pytest.approx(8 * 100 / (2 * H * T * D))
    assert full["bits_per_value"] == pytest.approx(8 * 300 / (2 * H * T * D))
    assert anchor["k_nmse"] == 0 and anchor["v_nmse"] == pytest.approx(0.01, rel=1e-5)
    assert anchor["attn_vnmse"] == pytest.approx(0.01, rel=1e-4)
    assert anchor["attn_vnmse_k_only"] == 0
    assert anchor["attn_vnmse_v_only"] == pytest.approx(0.01, rel=1e-4)
    assert len(anchor["per_layer_attn_vnmse"]) == 3
    assert full["k_nmse"] == full["v_nmse"] == full["attn_vnmse"] == 0
    assert "attn_vnmse_k_only" not in full


def test_queries_are_clamped_to_the_sequence_and_reference_uses_the_cast_kv():
    refs = build_refs(_layers(1), num_queries=1000, kv_dtype=torch.bfloat16)
    assert refs[0].q.shape[1] == T and refs[0].k.dtype == torch.bfloat16
    # bf16 passthrough of a bf16 cache is exact: the harness charges a codec only its own error.
    (stage,) = evaluate_codec(lynx_npu.get_codec("bf16"), refs).stages
    assert stage.summary()["attn_vnmse"] == 0 and stage.bits_per_value == 16
    with pytest.raises(ValueError, match="num_queries"):
        build_refs(_layers(1), num_queries=0, kv_dtype=torch.float32)


@pytest.mark.parametrize("name", ["int8", "lynx"])
def test_real_codecs_run_through_the_harness(name):
    refs = build_refs(_layers(2), num_queries=8, kv_dtype=torch.float32)
    codec = lynx_npu.get_codec(name)
    res = evaluate_codec(codec, refs)
    assert [s.stage for s in res.stages] == list(codec.stages)
    for s in res.stages:
        summary = s.summary()
        assert 0 < summary["attn_vnmse"] < 0.1 and 0 < summary["k_nmse"] < 0.1
        assert s.bits_per_value > 4
    # Progressive codecs: the full stage is better than the anchor.
    if len(res.stages) == 2:
        assert res.stages[1].summary()["attn_vnmse"] < res.stages[0].summary()["attn_vnmse"]


def test_report_and_table():
    refs = build_refs(_layers(2), num_queries=8, kv_dtype=torch.float32)
    codec = ScaledVCodec()
    res = evaluate_codec(codec, refs, label="scaled-v:x=1")
    meta = {"model": "tiny", "tokens": T, "data": "synthetic", "queries": 8,
            "kv_dtype": "float32", "layers": [0, 1]}
    report = make_report(meta, [("scaled-v:x=1", codec)], [res], total_s=1.0)
    assert {"model", "tokens", "data", "codecs"} <= set(report)
    rows = report["codecs"]
    assert [(r["codec"], r["stage"]) for r in rows] == [("scaled-v:x=1", "anchor"),
                                                        ("scaled-v:x=1", "full")]
    for key in ("bits_per_value", "k_nmse", "v_nmse", "attn_vnmse", "per_layer_attn_vnmse"):
        assert key in rows[0]
    table = format_table(report).splitlines()
    assert len(table) == 4 and "attn vNMSE" in table[1] and table[2].startswith("scaled-v:x=1")


def test_per_layer_codecs_get_their_layer():
    """CacheGen's bins depend on the layer: the harness encodes layer i with for_layer(i, n)."""
    layers = _layers(12)
    refs = build_refs(layers, num_queries=8, kv_dtype=torch.float32)
    codec = lynx_npu.get_codec("cachegen")
    result = evaluate_codec(codec, refs)
    expected = sum(codec.for_layer(i, len(refs)).encode(r.k, r.v).nbytes("full")
                   for i, r in enumerate(refs))
    layer0 = sum(codec.encode(r.k, r.v).nbytes("full") for r in refs)
    assert expected != layer0  # the schedule changes the bins within 12 layers
    assert result.stages[0].nbytes == expected


def test_a_sliding_window_layer_is_measured_with_its_window():
    """A codec that corrupts only keys outside every query's window costs a sliding-window layer
    nothing, the same layer without a window a lot."""
    from lynx_npu.eval.metrics import causal_attention

    class FarKeysCodec(ScaledVCodec):
        def decode(self, enc, stage="full"):
            k = enc.k.clone()
            k[:, :T - 16 - 4] = 30.0     # keys that none of the last 16 queries sees with window 4
            return k, enc.v

    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(HQ, T, D, generator=g), torch.randn(H, T, D, generator=g),
               torch.randn(H, T, D, generator=g))
    local, glob = LayerQKV(q, k, v, window=4, scale=0.2), LayerQKV(q, k, v)
    refs = build_refs([local, glob], num_queries=16, kv_dtype=torch.float32)
    assert (refs[0].window, refs[0].scale, refs[1].window, refs[1].scale) == (4, 0.2, None, None)
    torch.testing.assert_close(refs[0].o, causal_attention(q[:, -16:], k, v, window=4, scale=0.2))
    full = evaluate_codec(FarKeysCodec(), refs).stages[-1]
    assert full.per_layer_attn_vnmse[0] == 0.0
    assert full.per_layer_attn_vnmse[1] > 0.01
