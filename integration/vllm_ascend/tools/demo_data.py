"""Real long prompts for the demo and the end-to-end tests: QMSum meeting transcripts.

Each prompt is one meeting's transcript (``speaker: text`` turns), cut to a token budget at a
turn boundary, followed by one of the meeting's queries, in the model's chat template. The
data is read from ``../shared/data/qmsum/val.jsonl`` relative to the repository root unless a
path is given.
"""
from __future__ import annotations

import json
import pathlib
from dataclasses import dataclass

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
DEFAULT_DATA = REPO_ROOT.parent / "shared" / "data" / "qmsum" / "val.jsonl"


@dataclass(frozen=True)
class Prompt:
    meeting: int
    query: str
    token_ids: list[int]
    content: str        # the user message (for chat requests to an OpenAI server)


def load_prompts(tokenizer, num_prompts: int, num_tokens: int,
                 path: str | pathlib.Path | None = None) -> list[Prompt]:
    """``num_prompts`` chat prompts of at most ``num_tokens`` tokens (transcript + query)."""
    path = pathlib.Path(path) if path is not None else DEFAULT_DATA
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
