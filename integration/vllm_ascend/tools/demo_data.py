"""Real long prompts for the demo and the end-to-end tests: QMSum meeting transcripts.

Each prompt is one meeting's transcript (``speaker: text`` turns), cut to a token budget at a
turn boundary, followed by one of the meeting's queries, in the model's chat template. The
data is ``qmsum/val.jsonl`` under ``$LYNX_DATA`` if set, else under ``../shared/data`` of the
working directory (the README runs from the repository root), else of the checkout this file is
in, unless a path is given.
"""
from __future__ import annotations

import json
import os
import pathlib
from dataclasses import dataclass

REPO_ROOT = pathlib.Path(__file__).resolve().parents[3]  # in a checkout
QMSUM = pathlib.Path("qmsum") / "val.jsonl"


def default_data() -> pathlib.Path:
    """Where the QMSum file is looked for when no path is given (the module docstring)."""
    if os.environ.get("LYNX_DATA"):
        return pathlib.Path(os.environ["LYNX_DATA"]) / QMSUM
    for root in (pathlib.Path.cwd().parent, REPO_ROOT.parent):
        if (root / "shared" / "data" / QMSUM).is_file():
            return root / "shared" / "data" / QMSUM
    return pathlib.Path.cwd().parent / "shared" / "data" / QMSUM


@dataclass(frozen=True)
class Prompt:
    meeting: int
    query: str
    token_ids: list[int]
    content: str        # the user message (for chat requests to an OpenAI server)


def load_prompts(tokenizer, num_prompts: int, num_tokens: int,
                 path: str | pathlib.Path | None = None) -> list[Prompt]:
    """``num_prompts`` chat prompts of at most ``num_tokens`` tokens (transcript + query)."""
    path = pathlib.Path(path) if path is not None else default_data()
    if not path.is_file():
        raise FileNotFoundError(f"QMSum data not found at {path} (pass --data PATH)")
    if num_prompts < 1 or num_tokens < 64:
        raise ValueError(f"need num_prompts >= 1 and num_tokens >= 64, got {num_prompts=}, "
                         f"{num_tokens=}")
    prompts = []
    with path.open() as f:
        for meeting, line in enumerate(f):
            row = json.loads(line)
            query = row["general_query_list"][0]["query"]
            wrapper = _chat(tokenizer, "", query)
            budget = num_tokens - len(wrapper)
            turns, used = [], 0
            for turn in row["meeting_transcripts"]:
                text = f"{turn['speaker']}: {turn['content']}\n"
                n = len(tokenizer(text, add_special_tokens=False)["input_ids"])
                if used + n > budget:
                    break
                turns.append(text)
                used += n
            if used < budget // 2:
                continue  # too short a meeting for this budget
            transcript = "".join(turns)
            prompts.append(Prompt(meeting, query, _chat(tokenizer, transcript, query),
                                  _content(transcript, query)))
            if len(prompts) == num_prompts:
                break
    if len(prompts) < num_prompts:
        raise ValueError(f"{path} has only {len(prompts)} meetings long enough for "
                         f"{num_tokens}-token prompts")
    return prompts


def _content(transcript: str, query: str) -> str:
    return f"Meeting transcript:\n{transcript}\nAnswer using the transcript.\n{query}"


def _chat(tokenizer, transcript: str, query: str) -> list[int]:
    content = _content(transcript, query)
    text = tokenizer.apply_chat_template([{"role": "user", "content": content}],
                                         tokenize=False, add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False)["input_ids"]
