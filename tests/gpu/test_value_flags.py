"""Input no page can carry, refused by the Triton compress kernel itself (ops/value_flags.py).

Pass 1 reads every value for the page min / max anyway; with NaN-propagating min / max a
channel's min or max is not finite exactly when one of its values is NaN or Inf, so the kernel
flags bad input (and the first bad page and head) at one test per channel: ops.compress reads
the flags once after its launch, the page serde when it stages the bytes, and neither runs a
pass of its own over the KV (which cost the H100 half its compress bandwidth, 2026-11-25).
Same contract as the reference: NaN / Inf anywhere (body or sink tokens), or a page channel
whose range overflows float32; channels past head_dim (padding) never count.
"""
import contextlib
import importlib.util
import os

import pytest
import torch

if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed (pip install 'lynx_npu[triton]')", allow_module_level=True)
CUDA = torch.cuda.is_available()
if not CUDA and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("no CUDA device; set TRITON_INTERPRET=1 to run the Triton kernels on the CPU "
                "interpreter (ci/test.sh does)", allow_module_level=True)

import lynx_npu  # noqa: E402
from lynx_npu import ops  # noqa: E402
from lynx_npu.codec.lynx_config import LynxConfig  # noqa: E402
from lynx_npu.gpu import launch  # noqa: E402
from lynx_npu.ops import KV_CACHE_LAYOUTS, PagedKVCache, serde_for, value_flags  # noqa: E402
from lynx_npu.ops.plan import F_BODY0, F_NUM_BODY, F_TOKEN0, layer_plan  # noqa: E402

from ..ops.parity import random_kv, reference_streams  # noqa: E402
from ..ops.serde_checks import block_slots  # noqa: E402

DEVICE = "cuda" if CUDA else "cpu"
CFG = dict(page_size=64, chunk_size=16, num_sink_tokens=4)
H, T = 2, 150
# (head, token, channel): a body value, a sink token (copied, not coded), the last value of
# a ragged last page
SPOTS = [(1, 70, 5), (0, 2, 31), (1, 149, 31)]


def _page_of(plan, token: int) -> int:
    for p, row in enumerate(plan.table.tolist()):
        if row[F_TOKEN0] <= token < row[F_BODY0] + row[F_NUM_BODY]:
            return p
    raise AssertionError(token)


def _flags(k, v, cfg):
    plan = layer_plan(cfg, *k.shape, k.dtype)
    flags = value_flags.new(DEVICE)
    launch.compress(k.to(DEVICE), v.to(DEVICE), plan, flags=flags)
    return plan, value_flags.first_bad(flags.cpu(), plan)


@contextlib.contextmanager
def no_second_pass():
    """Any aminmax / check_values (the old pre-pass) inside fails the test."""
    def refuse(*a, **kw):
        raise AssertionError("a pass over the KV outside the kernel")
    with pytest.MonkeyPatch.context() as m:
        m.setattr(torch, "aminmax", refuse)
        m.setattr(ops.api, "check_values", refuse)
        yield


@pytest.mark.parametrize("v_axis", ["token", "channel"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_the_kernel_flags_non_finite_values_and_where(v_axis, bad):
    cfg = LynxConfig(v_axis=v_axis, k_axis="token" if v_axis == "channel" else "channel", **CFG)
    k, v = random_kv(H, T, 32, torch.bfloat16, seed=6)
    for which in "kv":
        for spot in SPOTS:
            kk, vv = k.clone(), v.clone()
            (kk if which == "k" else vv)[spot] = bad
            plan, got = _flags(kk, vv, cfg)
            assert got == [(which, value_flags.NONFINITE, _page_of(plan, spot[1]), spot[0])], \
                (which, spot)
    with pytest.raises(ValueError, match=r"v contains NaN or Inf \(first at index \(1, 149, 31\)"):
        ops.compress(kk.to(DEVICE), vv.to(DEVICE), cfg, backend="triton")
    ops.compress(k.to(DEVICE), v.to(DEVICE), cfg, backend="triton")  # no stale flag after it


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_kernel_flags_a_page_range_past_float32(dtype):
    cfg = LynxConfig(**CFG)
    k, v = random_kv(H, T, 32, dtype, seed=7)
    v[1, 80, 3], v[1, 90, 3] = 3e38, -1e38   # one channel of one page spans 4e38
    plan, got = _flags(k, v, cfg)
    assert got == [("v", value_flags.RANGE, _page_of(plan, 80), 1)]
    with pytest.raises(ValueError, match=r"v spans .*overflows float32"):
        ops.compress(k.to(DEVICE), v.to(DEVICE), cfg, backend="triton")
    v[1, 90, 3] = 3e38                        # the same values, range 0: carried
    assert _flags(k, v, cfg)[1] == []


@pytest.mark.parametrize("v_axis", ["token", "channel"])
def test_padding_past_head_dim_never_flags(v_axis):
    """head_dim 40 leaves 24 channels of the strip padding (loaded as NaN): finite input gives
    the reference's bytes and no flag, with no pass outside the kernel; a NaN in the last real
    channel is flagged."""
    cfg = LynxConfig(v_axis=v_axis, k_axis="token" if v_axis == "channel" else "channel", **CFG)
    k, v = random_kv(H, 90, 40, torch.bfloat16, seed=8)
    assert _flags(k, v, cfg)[1] == []
    with no_second_pass():
        a, r = ops.compress(k.to(DEVICE), v.to(DEVICE), cfg, backend="triton")
    want = reference_streams(cfg, k, v)
    assert torch.equal(a.cpu(), want[0]) and torch.equal(r.cpu(), want[1])
    k[0, 50, 39] = float("nan")
    assert _flags(k, v, cfg)[1] == [("k", value_flags.NONFINITE, 0, 0)]


def _cache(num_layers, layout="vllm_flash_nhd", d=32):
    bs = 16
    nb = -(-T // bs) + 3
    lay = KV_CACHE_LAYOUTS[layout]
    cache = PagedKVCache.build(layout, [lay.allocate(nb, bs, H, d, torch.bfloat16, DEVICE)
                                        for _ in range(num_layers)])
    slots = block_slots(T, nb, bs, "random", seed=11).to(DEVICE)
    kv = [random_kv(H, T, d, torch.bfloat16, seed=i) for i in range(num_layers)]
    return cache, slots, kv


def test_the_page_serde_refuses_at_staging_without_a_second_pass():
    """encode_cache (one layer) and encode_layers (a request's layers in one launch): the
    flags travel with the bytes to the host and ``wait()`` raises, naming layer, head and
    tokens; clean layers stage as before."""
    codec = lynx_npu.get_codec("lynx", **CFG)
    serde = serde_for(codec, "triton")
    cache, slots, kv = _cache(3)
    kv[1][1][0, 100, 7] = float("nan")        # v of layer 1, head 0, token 100
    for i, (k, v) in enumerate(kv):
        cache.write(i, slots, k, v)
    with no_second_pass():
        serde.encode_cache(cache.layer(0), slots).wait()
        layer = serde.encode_cache(cache.layer(1), slots)
        with pytest.raises(ValueError, match=r"v contains NaN or Inf \(first in head 0, "
                                             r"tokens \[68, 132\)\); KV must be finite"):
            layer.wait()
        layers = list(serde.encode_layers(cache, slots))
        for layer in layers:  # every layer of the refused request says why
            with pytest.raises(ValueError, match=r"v contains NaN or Inf \(first in layer 1, "
                                                 r"head 0, tokens \[68, 132\)\)"):
                layer.wait()
    with pytest.raises(ValueError, match="v contains NaN or Inf"):  # a dense layer too
        serde.encode(*(x.to(DEVICE) for x in kv[1])).wait()
    kv[1][1][0, 100, 7] = 3e38                 # finite but a page range past float32: bf16 ok
    cache.write(1, slots, *kv[1])
    kv[1][1][0, 101, 7] = -3e38
    cache.write(1, slots, *kv[1])
    with pytest.raises(ValueError, match=r"v: a page channel's range .*overflows float32, .*"
                                         r"layer 1, head 0, tokens \[68, 132\)"):
        next(iter(serde.encode_layers(cache, slots))).wait()
