"""The prompts of ``lynx eval quality``, built from the real data files (``../shared/data``).

- ``ppl``: windows of the Paul Graham essays (concatenated in sorted order as ``load_text``
  does): a context of L tokens (L evenly spread over ``[min, max]``, windows evenly spread over
  the corpus) and the next ``ppl_tokens`` tokens, whose teacher-forced likelihood is scored.
- ``needle``: a haystack of essay text with one needle sentence (from ``NEEDLES``) inserted at
  a sentence boundary at a given depth (0 = start, 1 = end), then the needle's question, in
  the model's chat template; the reference is the needle sentence. Sample i takes context
  length ``lengths[i % len(lengths)]``, depth ``depths[(i // len(lengths)) % len(depths)]``,
  needle ``i % len(NEEDLES)`` and a haystack starting at a different place of the corpus.
- ``qmsum``: ``demo_data.load_prompts`` (a meeting's transcript cut to a token budget + its
  first general query, in the chat template); the reference is that query's answer.
- ``mmlu``: few-shot MMLU-Pro prompts (questions evenly spaced over the file, examples from the
  question's category, ``accept_cmd``'s question format) ending in "The answer is (", so the
  next token is the option letter.
"""
from __future__ import annotations

import pathlib
from dataclasses import dataclass

from .accept_cmd import MMLU_PRO_HEAD, mmlu_pro_question, read_mmlu_pro
from .model import essay_paths, load_qmsum

# (needle sentence, question): facts not in the essays, so only the needle can answer.
NEEDLES = (
    ("The best thing to do in San Francisco is eat a sandwich and sit in Dolores Park on a "
     "sunny day.", "What is the best thing to do in San Francisco?"),
    ("The secret ingredient in Grandma Rosa's tomato sauce is a spoonful of smoked paprika.",
     "What is the secret ingredient in Grandma Rosa's tomato sauce?"),
    ("The password to the old lighthouse on Cedar Island is blue falcon seventeen.",
     "What is the password to the old lighthouse on Cedar Island?"),
    ("The annual kite festival in Millbrook is always held on the first Sunday of October.",
     "When is the annual kite festival in Millbrook held?"),
)
NEEDLE_PROMPT = ("{haystack}\n\nAnswer the question using only the text above, in one short "
                 "sentence.\n{question}")


@dataclass(frozen=True)
class TeacherForced:
    id: str
    context: list[int]
    continuation: list[int]


@dataclass(frozen=True)
class Generation:
    id: str
    prompt: list[int]
    reference: str


@dataclass(frozen=True)
class Choice:
    id: str
    prompt: list[int]
    option_tokens: list[int]   # the token of each option letter after the prompt
    answer: int                # index of the right option


def _prefix(tokenizer) -> list[int]:
    """The special tokens the tokenizer puts before any text (Gemma: BOS; SmolLM2: none)."""
    return tokenizer("")["input_ids"]


def corpus_ids(data_dir: pathlib.Path, tokenizer) -> list[int]:
    text = "\n\n".join(p.read_text(encoding="utf-8").strip() for p in essay_paths(data_dir))
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def _spread(count: int, low: int, high: int) -> list[int]:
    """``count`` ints evenly spread over [low, high]."""
    if count == 1:
        return [low]
    return [low + (high - low) * i // (count - 1) for i in range(count)]


def ppl_samples(data_dir: pathlib.Path, tokenizer, count: int, context: tuple[int, int],
                num_tokens: int) -> list[TeacherForced]:
    ids, prefix = corpus_ids(data_dir, tokenizer), _prefix(tokenizer)
    lengths = _spread(count, *context)
    room = len(ids) - max(lengths) - num_tokens
    if room < 0:
        raise ValueError(f"the essays in {str(data_dir)!r} have {len(ids)} tokens: too few for "
                         f"{max(lengths)} tokens of context + {num_tokens} scored")
    out = []
    for i, (length, start) in enumerate(zip(lengths, _spread(count, 0, room))):
        body = length - len(prefix)
        out.append(TeacherForced(f"essays @{start}, {length} tokens",
                                 prefix + ids[start:start + body],
                                 ids[start + body:start + body + num_tokens]))
    return out


def chat_ids(tokenizer, content: str) -> list[int]:
    text = tokenizer.apply_chat_template([{"role": "user", "content": content}],
                                         tokenize=False, add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def insert_needle(haystack: str, needle: str, depth: float) -> str:
    """``needle`` after the last sentence end at or before ``depth`` of the haystack."""
    if not 0 <= depth <= 1:
        raise ValueError(f"needle depth {depth} must be in [0, 1]")
    cut = int(depth * len(haystack))
    if cut < len(haystack):
        cut = haystack.rfind(". ", 0, cut + 1) + 1 if cut > 0 else 0  # 0 when no sentence end
    before, after = haystack[:cut].rstrip(), haystack[cut:].lstrip()
    return " ".join(part for part in (before, needle, after) if part)


def needle_samples(data_dir: pathlib.Path, tokenizer, count: int, lengths: list[int],
                   depths: list[float]) -> list[Generation]:
    ids = corpus_ids(data_dir, tokenizer)
    starts = _spread(count, 0, max(0, len(ids) - max(lengths)))
    out = []
    for i in range(count):
        length, depth = lengths[i % len(lengths)], depths[(i // len(lengths)) % len(depths)]
        needle, question = NEEDLES[i % len(NEEDLES)]
        overhead = len(chat_ids(tokenizer, NEEDLE_PROMPT.format(haystack=needle,
                                                                question=question)))
        if overhead + 16 > length:
            raise ValueError(f"needle context length {length} is too short: the needle, the "
                             f"question and the chat template take {overhead} tokens")
        hay = tokenizer.decode(ids[starts[i]:starts[i] + length - overhead])
        prompt = chat_ids(tokenizer, NEEDLE_PROMPT.format(
            haystack=insert_needle(hay, needle, depth), question=question))
        out.append(Generation(f"{length} tokens, depth {depth:g}, needle {i % len(NEEDLES)}",
                              prompt, needle))
    return out


def qmsum_samples(path: pathlib.Path, tokenizer, count: int, num_tokens: int) -> list[Generation]:
    from lynx_npu.integration.vllm_ascend.tools.demo_data import load_prompts

    meetings = load_qmsum(path)
    prompts = load_prompts(tokenizer, count, num_tokens, path)
    return [Generation(f"meeting {p.meeting}", p.token_ids,
                       meetings[p.meeting].general_queries[0][1]) for p in prompts]


def letter_tokens(tokenizer, prompt_text: str, prompt: list[int], count: int) -> list[int]:
    """The token each option letter adds after ``prompt``; an error if the tokenizer would merge
    a letter into the prompt's last token (the letter's logit would then not be the answer's)."""
    out = []
    for i in range(count):
        letter = chr(65 + i)
        ids = tokenizer(prompt_text + letter)["input_ids"]
        if len(ids) != len(prompt) + 1 or ids[:-1] != prompt:
            raise ValueError(f"the tokenizer does not give option letter {letter!r} a token of "
                             f"its own after the prompt")
        out.append(ids[-1])
    return out


def mmlu_samples(path: pathlib.Path, tokenizer, count: int, shots: int) -> list[Choice]:
    rows = read_mmlu_pro(path)
    if len(rows) < count:
        raise ValueError(f"{str(path)!r} has {len(rows)} questions; {count} requested")
    tested = [i * len(rows) // count for i in range(count)]
    taken = set(tested)
    out = []
    for i in tested:
        row = rows[i]
        examples = [r for j, r in enumerate(rows) if r["category"] == row["category"]
                    and j not in taken][:shots]
        if len(examples) < shots:
            raise ValueError(f"category {row['category']!r} of {str(path)!r} has {len(examples)} "
                             f"untested questions; --shots {shots} needs that many")
        text = (MMLU_PRO_HEAD.format(row["category"])
                + "".join(mmlu_pro_question(r, True) for r in examples)
                + mmlu_pro_question(row, False) + " The answer is (")
        prompt = tokenizer(text)["input_ids"]
        answer = ord(row["answer"].strip()) - 65
        if not 0 <= answer < len(row["options"]):
            raise ValueError(f"{str(path)!r}: question {row.get('question_id', i)} has answer "
                             f"{row['answer']!r} outside its {len(row['options'])} options")
        out.append(Choice(f"question {row.get('question_id', i)} ({row['category']})", prompt,
                          letter_tokens(tokenizer, text, prompt, len(row["options"])), answer))
    return out
