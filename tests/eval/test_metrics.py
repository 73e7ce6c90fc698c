import math

import pytest
import torch

from lynx_npu.eval.metrics import attention_vnmse, causal_attention, nmse, vector_nmse


def _naive_attention(q, k, v, window=None, scale=None):
    """Loop over heads and queries: query head h reads KV head h // G, query i of the last n
    sits at position T - n + i and sees keys 0..T - n + i (only the last ``window`` of them on
    a sliding-window layer)."""
    hq, n, d = q.shape
    hkv, t, _ = k.shape
    groups = hq // hkv
    out = torch.empty(hq, n, d, dtype=torch.float64)
    for h in range(hq):
        kv = h // groups
        for i in range(n):
            pos = t - n + i
            lo = 0 if window is None else max(0, pos - window + 1)
            sc = 1 / math.sqrt(d) if scale is None else scale
            s = torch.tensor([float(q[h, i].double() @ k[kv, j].double()) * sc
                              for j in range(lo, pos + 1)], dtype=torch.float64)
            p = torch.softmax(s, 0)
            out[h, i] = (p[:, None] * v[kv, lo:pos + 1].double()).sum(0)
    return out


def test_nmse_known_values():
    x = torch.randn(3, 17, 8)
    assert nmse(x, x) == 0.0
    assert nmse(x, 1.1 * x) == pytest.approx(0.01, rel=1e-5)
    assert nmse(x, torch.zeros_like(x)) == pytest.approx(1.0, rel=1e-6)
    assert nmse(torch.zeros(2, 2, 2), torch.zeros(2, 2, 2)) == 0.0
    assert nmse(torch.zeros(2, 2, 2), torch.ones(2, 2, 2)) == math.inf


def test_nmse_sums_over_the_whole_tensor_not_per_row():
    x = torch.tensor([[[3.0, 4.0], [0.0, 1.0]]])          # ||x||^2 = 26
    x_hat = torch.tensor([[[3.0, 4.0], [0.0, 0.0]]])      # error 1 in the small row only
    assert nmse(x, x_hat) == pytest.approx(1 / 26)


def test_vector_nmse_is_the_mean_of_per_vector_ratios():
    o = torch.tensor([[[3.0, 4.0], [0.0, 1.0]]])          # norms^2 25 and 1
    o_hat = torch.tensor([[[3.0, 4.0], [0.0, 0.0]]])      # ratios 0 and 1
    assert vector_nmse(o, o_hat) == pytest.approx(0.5)
    o = torch.randn(4, 9, 16)
    assert vector_nmse(o, o * 0.9) == pytest.approx(0.01, rel=1e-5)


@pytest.mark.parametrize("hq,hkv,t,n", [(6, 2, 11, 4), (3, 3, 7, 7), (4, 1, 9, 1)])
def test_causal_attention_matches_a_naive_gqa_loop(hq, hkv, t, n):
    g = torch.Generator().manual_seed(hq * 100 + t)
    q = torch.randn(hq, n, 8, generator=g)
    k = torch.randn(hkv, t, 8, generator=g)
    v = torch.randn(hkv, t, 8, generator=g)
    got = causal_attention(q, k, v)
    assert got.dtype == torch.float32 and got.shape == (hq, n, 8)
    torch.testing.assert_close(got.double(), _naive_attention(q, k, v), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("window", [1, 3, 8])
def test_sliding_window_attention_matches_a_naive_loop(window):
    """Gemma 3's local layers: the query at t sees keys t-window+1..t; 12 keys, last 6 queries."""
    g = torch.Generator().manual_seed(window)
    q, k, v = (torch.randn(4, 6, 8, generator=g), torch.randn(1, 12, 8, generator=g),
               torch.randn(1, 12, 8, generator=g))
    got = causal_attention(q, k, v, window=window, scale=0.3)
    torch.testing.assert_close(got.double(), _naive_attention(q, k, v, window, 0.3),
                               rtol=1e-5, atol=1e-6)
    # The window matters: ignoring it (global causal) gives another output.
    assert not torch.allclose(got, causal_attention(q, k, v, scale=0.3), atol=1e-3)


def test_keys_outside_the_window_are_invisible_and_count_for_vnmse_only_inside():
    q, k, v = torch.randn(2, 3, 4), torch.randn(1, 10, 4), torch.randn(1, 10, 4)
    # Queries at positions 7, 8, 9 with window 4 see keys 4..7, 5..8, 6..9: keys 0..3 never.
    k2, v2 = k.clone(), v.clone()
    k2[:, :4], v2[:, :4] = 1e3, -1e3
    torch.testing.assert_close(causal_attention(q, k2, v2, window=4), causal_attention(q, k, v, window=4))
    assert attention_vnmse(q, k, v, k2, v2, window=4) == 0.0
    assert attention_vnmse(q, k, v, k2, v2) > 0.1          # a global layer does see them
    # Key 4 is seen by the first query only.
    k3 = k.clone()
    k3[:, 4] = 50.0
    o, o3 = causal_attention(q, k, v, window=4), causal_attention(q, k3, v, window=4)
    assert not torch.allclose(o3[:, 0], o[:, 0])
    torch.testing.assert_close(o3[:, 1:], o[:, 1:])
    with pytest.raises(ValueError, match="window"):
        causal_attention(q, k, v, window=0)


def test_future_keys_are_invisible():
    q, k, v = torch.randn(2, 3, 4), torch.randn(1, 10, 4), torch.randn(1, 10, 4)
    o = causal_attention(q, k, v)
    k3, v3 = k.clone(), v.clone()
    k3[:, 8:], v3[:, 8:] = 1e3, -1e3  # positions 8, 9: visible only to the last two queries
    o3 = causal_attention(q, k3, v3)
    torch.testing.assert_close(o3[:, 0], o[:, 0])
    assert not torch.allclose(o3[:, 1:], o[:, 1:])


def test_attention_vnmse_zero_for_exact_kv_and_positive_otherwise():
    q, k, v = torch.randn(6, 5, 8), torch.randn(2, 20, 8), torch.randn(2, 20, 8)
    assert attention_vnmse(q, k, v, k, v) == 0.0
    # V error only, uniform scale: o_hat = 1.1 o exactly (attention is linear in V).
    assert attention_vnmse(q, k, v, k, 1.1 * v) == pytest.approx(0.01, rel=1e-4)
    o = causal_attention(q, k, v)
    noisy = k + 0.1 * torch.randn_like(k)
    assert attention_vnmse(q, k, v, noisy, v, o=o) == attention_vnmse(q, k, v, noisy, v) > 0


def test_attention_uses_the_reference_for_o_and_the_decoded_kv_for_o_hat():
    # Swapping the roles must change the answer: vNMSE is normalised by ||o||, not ||o_hat||.
    q, k, v = torch.randn(2, 3, 4), torch.randn(1, 6, 4), torch.randn(1, 6, 4)
    a = attention_vnmse(q, k, v, k, 2 * v)
    b = attention_vnmse(q, k, 2 * v, k, v)
    assert a == pytest.approx(1.0, rel=1e-4) and b == pytest.approx(0.25, rel=1e-4)


def test_bad_shapes_are_value_errors():
    q, k = torch.randn(6, 5, 8), torch.randn(4, 20, 8)
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        causal_attention(q, k, k)
    with pytest.raises(ValueError, match="queries but only"):
        causal_attention(torch.randn(4, 30, 8), k, k)
    with pytest.raises(ValueError, match="head_dim"):
        causal_attention(torch.randn(4, 5, 7), k, k)
    with pytest.raises(ValueError, match="x_hat shape"):
        nmse(k, k[:, :3])
    with pytest.raises(ValueError, match="k_hat shape"):
        attention_vnmse(torch.randn(4, 5, 8), k, k, k[:, :3], k)
