"""Issue 18, items 1 and 8 (codecs): what a hostile peer's frame or a careless caller's tensor
can make the reference codecs do.

- decode_page sizes a received page from its header's claim by arithmetic and refuses a
  payload of another size before anything of the claimed size exists (a peak-RSS bound in a
  fresh process: a 61-byte frame claiming 8 heads x 16384 tokens x 128 used to cost ~0.6 GB);
- every finite input of the KV dtype decodes to finite values (float16 at +-65504 came back
  Inf from 8 of 9 codecs); what a format cannot carry is refused by name;
- cachegen codes subnormal tokens (a bfloat16 subnormal peak made its symbols garbage).
"""
import json
import subprocess
import sys
import textwrap

import pytest
import torch

import lynx_npu
from lynx_npu.codec.base import TensorCodec

TENSOR_CODECS = ["bf16", "int8", "int4", "kivi4", "quantspec"]
ALL = lynx_npu.list_codecs()
DTYPES = [torch.float16, torch.bfloat16, torch.float32]


def _constriction(name):
    if name == "cachegen":
        pytest.importorskip("constriction")


@pytest.mark.parametrize("name", TENSOR_CODECS)
@pytest.mark.parametrize("shape", [(3, 1, 64), (2, 33, 5), (1, 300, 8)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_field_specs_are_the_fields_encode_returns(name, shape, dtype):
    codec = lynx_npu.get_codec(name)
    assert isinstance(codec, TensorCodec)
    k = torch.randn(shape).to(dtype)
    enc = codec.encode(k, k)
    got = [(n, s, t.dtype, tuple(t.shape)) for n, s, t in enc.fields]
    want = [(f.name, f.stage, f.dtype, f.shape) for f in codec.field_specs(shape, dtype)]
    assert got == want
    sizes = codec.page_nbytes(shape[1], shape[0], shape[2], dtype)
    assert sum(sizes.values()) == enc.nbytes(codec.stages[-1])


MEMORY_PROBE = textwrap.dedent("""
    import json, resource, sys, torch, lynx_npu
    torch.set_num_threads(1)
    H, T, D = 8, 16384, 128          # the claim: 16M values, ~32 MB as float16
    names = json.loads(sys.argv[1])
    codecs = {}
    for name in names:
        codecs[name] = lynx_npu.get_codec(name, page_size=T)  # the peer's frame says so
        # warm-up: the same code path on a real tiny page (lazy imports, tables)
        k = torch.randn(1, 8, 16, dtype=torch.float16)
        p = codecs[name].encode_pages(k, k)[0]
        codecs[name].decode_page(p.anchor, p.residual, 0, 8, num_kv_heads=1, head_dim=16,
                                 dtype=torch.float16)
    frame = torch.zeros(61, dtype=torch.uint8)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    errors = {}
    for name, codec in codecs.items():
        try:
            codec.decode_page(frame, None, 0, T, num_kv_heads=H, head_dim=D,
                              dtype=torch.float16)
            errors[name] = None
        except ValueError as e:
            errors[name] = str(e)
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"peak_kib": after - before, "errors": errors}))
""")


def test_a_tiny_frame_claiming_a_huge_page_is_refused_before_allocating_it():
    names = [n for n in ALL if n != "cachegen"]
    proc = subprocess.run([sys.executable, "-c", MEMORY_PROBE, json.dumps(names)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    for name in names:
        assert got["errors"][name] and "61 bytes" in got["errors"][name], (name, got)
    # The claim is ~32 MB as float16 (the old decode_page encoded a zero page of it: ~0.6 GB
    # of peak); refusing it by arithmetic costs nothing proportional to it.
    assert got["peak_kib"] < 16 * 1024, got


@pytest.mark.parametrize("name", TENSOR_CODECS)
def test_decode_page_names_the_size_it_expected(name):
    codec = lynx_npu.get_codec(name)
    k = torch.randn(2, 40, 16, dtype=torch.bfloat16)
    page = codec.encode_pages(k, k)[0]
    with pytest.raises(ValueError, match=f"has {page.anchor.numel() - 1} bytes; {name} "
                                         f"expects {page.anchor.numel()}"):
        codec.decode_page(page.anchor[:-1], page.residual, 0, 40, num_kv_heads=2,
                          head_dim=16, dtype=torch.bfloat16)
    if page.residual is not None:
        with pytest.raises(ValueError, match="full page buffer has"):
            codec.decode_page(page.anchor, torch.cat([page.residual, page.residual[:1]]), 0,
                              40, num_kv_heads=2, head_dim=16, dtype=torch.bfloat16)


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("kw,match", [
    ({"token_end": 257 + 4}, r"token_end=261 must be in \[1, 260\]"),  # beyond the page size
    ({"token_end": 0}, r"token_end=0 must be in \[1, "),
    ({"num_kv_heads": 0}, r"num_kv_heads=0 must be in \[1, "),
    ({"head_dim": 1 << 30}, r"head_dim=1073741824 must be in \[1, 1048576\]"),
    ({"dtype": torch.int8}, "dtype=torch.int8 must be one of"),
])
def test_a_claimed_page_geometry_is_checked_before_sizing(name, kw, match):
    _constriction(name)
    codec = lynx_npu.get_codec(name)
    if name == "cachegen":  # pages of chunk_size = 256 tokens, no sinks
        match = match.replace("261 must be in \\[1, 260\\]", "261 must be in \\[1, 256\\]")
    elif not name.startswith("lynx"):  # pages of page_size = 256 tokens, no sinks
        match = match.replace("\\[1, 260\\]", "\\[1, 256\\]")
    args = {"token_end": 16, "num_kv_heads": 2, "head_dim": 16, "dtype": torch.float16, **kw}
    end = args.pop("token_end")
    with pytest.raises(ValueError, match=match):
        codec.decode_page(torch.zeros(64, dtype=torch.uint8), None, 0, end, **args)


def _edge_kv(dtype, top, seed=0):
    """Values spread over [-top, top] with both ends present, as k and v."""
    g = torch.Generator().manual_seed(seed)
    k = ((torch.rand(2, 80, 32, generator=g) * 2 - 1) * top).to(dtype)
    k[0, 0, :] = top
    k[1, 7, :] = -top
    k[0, 5, 3] = top
    v = k.flip(1).contiguous()
    return k, v


@pytest.mark.parametrize("name", ALL)
def test_float16_at_its_largest_finite_values_decodes_finite(name):
    _constriction(name)
    codec = lynx_npu.get_codec(name)
    k, v = _edge_kv(torch.float16, 65504.0)
    enc = codec.encode(k, v)
    for stage in codec.stages:
        k2, v2 = codec.decode(enc, stage)
        assert bool(torch.isfinite(k2).all() and torch.isfinite(v2).all()), stage
    for p in codec.encode_pages(k, v):
        for res in {None, p.residual}:
            pk, pv = codec.decode_page(p.anchor, res, p.token_start, p.token_end,
                                       num_kv_heads=2, head_dim=32, dtype=torch.float16)
            assert bool(torch.isfinite(pk).all() and torch.isfinite(pv).all())


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_wide_dtypes_decode_finite_or_are_refused_by_name(name, dtype):
    """bfloat16 / float32 reach ~3.4e38: the affine codecs keep float16 scalars (finite to
    65504) and refuse what they cannot carry; Lynx normalises by a page channel's range in
    float32 and refuses a range past it; everything accepted decodes finite."""
    _constriction(name)
    codec = lynx_npu.get_codec(name)
    for top in (6e4, 1e6, 1e30, 2.0 ** 126, 3e38):
        k, v = _edge_kv(dtype, top)
        try:
            enc = codec.encode(k, v)
        except ValueError as e:
            if name in ("int8", "int4", "kivi4", "quantspec"):
                assert top > 65504 and "float16 scale or minimum would overflow" in str(e)
            else:
                assert name.startswith("lynx") and top > 2.0 ** 126, (top, e)
                assert "overflows float32" in str(e)
            assert str(e).startswith("k spans")
            continue
        for stage in codec.stages:
            k2, v2 = codec.decode(enc, stage)
            assert bool(torch.isfinite(k2).all() and torch.isfinite(v2).all()), (top, stage)


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_input_is_refused_by_every_codec_entry(name, bad):
    _constriction(name)
    codec = lynx_npu.get_codec(name)
    k = torch.randn(2, 40, 16)
    v = k.clone()
    v[1, 39, 15] = bad
    for encode in (codec.encode, codec.encode_pages):
        with pytest.raises(ValueError, match=r"v contains NaN or Inf \(first at index "
                                             r"\(1, 39, 15\)"):
            encode(k, v)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float16])
def test_cachegen_codes_subnormal_tokens(dtype):
    pytest.importorskip("constriction")
    codec = lynx_npu.get_codec("cachegen")
    tiny = torch.finfo(dtype).smallest_normal
    g = torch.Generator().manual_seed(3)
    k = (torch.randn(2, 64, 16, generator=g) * tiny / 8).to(dtype)  # subnormal peaks
    k[:, :8] = torch.randn(2, 8, 16, generator=g).to(dtype)         # and normal tokens
    v = k.flip(1).contiguous()
    k2, v2 = codec.roundtrip(k, v)
    for x, x2 in ((k, k2), (v, v2)):
        peak = x.float().abs().amax(dim=(0, 2), keepdim=True)
        err = (x2.float() - x.float()).abs()
        # half a quantization step (peak / MAX, MAX = 15 with 32 bins) plus the dtype's
        # rounding of the reconstruction
        fi = torch.finfo(dtype)
        bound = peak / 15 / 2 * 1.01 + x.float().abs() * fi.eps + fi.smallest_normal
        assert bool((err <= bound).all())
        tiny_tokens = slice(8, None)  # subnormal peaks: not flushed to zero
        assert bool((x2[:, tiny_tokens] != 0).any())
        assert bool(torch.isfinite(x2).all())
