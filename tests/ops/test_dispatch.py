"""Backend choice: per device, LYNX_BACKEND, explicit choices that cannot run, quiet fallback."""
import os

import pytest
import torch

from lynx_npu import ops
from lynx_npu.codec.lynx_config import LynxConfig
from lynx_npu.ops import BackendUnavailable, backends

CFG = LynxConfig(center="mean")


def test_every_backend_is_registered_with_a_reason_when_absent():
    got = ops.list_backends()
    assert set(got) >= {"torch", "cpu", "triton", "ascend_c"}
    assert got["torch"] is None
    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        assert got["triton"]  # a reason, e.g. no CUDA device
    assert "torch_npu" in got["ascend_c"] or "not built" in got["ascend_c"]


def test_auto_picks_the_device_default(monkeypatch):
    monkeypatch.delenv("LYNX_BACKEND", raising=False)
    want = "cpu" if ops.list_backends()["cpu"] is None else "torch"
    assert ops.backend_for("cpu", CFG, 3, 64, torch.bfloat16) == want


def test_env_var_overrides(monkeypatch):
    monkeypatch.setenv("LYNX_BACKEND", "torch")
    assert ops.backend_for("cpu", CFG, 3, 64, torch.bfloat16) == "torch"
    monkeypatch.setenv("LYNX_BACKEND", "auto")
    assert ops.backend_for("cpu", CFG, 3, 64, torch.bfloat16) in ("cpu", "torch")


def test_explicit_unavailable_backend_raises_with_reason(monkeypatch):
    monkeypatch.delenv("LYNX_BACKEND", raising=False)
    with pytest.raises(BackendUnavailable, match="npu"):
        ops.backend_for("cpu", CFG, 3, 64, torch.bfloat16, backend="ascend_c")
    monkeypatch.setenv("LYNX_BACKEND", "ascend_c")
    k = torch.randn(1, 8, 8)
    with pytest.raises(BackendUnavailable):
        ops.compress(k, k, CFG)


def test_unknown_backend_is_a_value_error():
    with pytest.raises(ValueError, match="unknown backend 'nope'"):
        ops.backend_for("cpu", CFG, 3, 64, torch.bfloat16, backend="nope")


class _Refuses:
    """A backend that declines every input (to exercise the fallback, not a mock of torch)."""

    @staticmethod
    def supports(cfg, num_kv_heads, head_dim, dtype):
        return "declines everything"


def test_auto_falls_back_quietly_and_explicit_raises(monkeypatch):
    monkeypatch.delenv("LYNX_BACKEND", raising=False)
    backends.register_backend("refuses", ("cpu",), lambda: _Refuses, replace=True)
    monkeypatch.setitem(backends.DEVICE_DEFAULT, "cpu", "refuses")
    assert ops.backend_for("cpu", CFG, 3, 64, torch.bfloat16) == "torch"
    with pytest.raises(BackendUnavailable, match="declines everything"):
        ops.backend_for("cpu", CFG, 3, 64, torch.bfloat16, backend="refuses")


def test_bad_inputs_name_the_problem():
    k = torch.randn(2, 16, 8, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="LynxConfig"):
        ops.compress(k, k, {"page_size": 4})
    with pytest.raises(ValueError, match="rank|num_kv_heads"):
        ops.compress(k[0], k[0], CFG)
    with pytest.raises(ValueError, match="dtype"):
        ops.compress(k.int(), k.int(), CFG)
    a, r = ops.compress(k, k, CFG, backend="torch")
    with pytest.raises(ValueError, match="bytes"):
        ops.decompress(a[:-1], r, CFG, k.shape, k.dtype)
    with pytest.raises(ValueError, match="uint8"):
        ops.decompress(a.float(), r, CFG, k.shape, k.dtype)
    with pytest.raises(ValueError, match="shape"):
        ops.decompress(a, r, CFG, (2, 16), k.dtype)
    cache = ops.get_layout("vllm_ascend").allocate(2, 16, 2, 8, torch.bfloat16)
    with pytest.raises(ValueError, match="slot"):
        ops.decompress_paged(a, r, CFG, 16, cache, torch.full((16,), 40), "vllm_ascend")
    with pytest.raises(ValueError, match="unknown KV cache layout"):
        ops.decompress_paged(a, r, CFG, 16, cache, torch.arange(16), "nope")
