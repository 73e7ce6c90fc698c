"""A tiny random Llama with a byte-level tokenizer and a chat template, and a data folder in the
real files' format (cut from ../shared/data), for fast tests of ``lynx eval quality``."""
from __future__ import annotations

import pathlib
import shutil

import torch

SHARED = pathlib.Path(__file__).resolve().parents[3] / "shared" / "data"
CHAT = ("{% for m in messages %}<s>{{ m['role'] }}\n{{ m['content'] }}</s>\n{% endfor %}"
        "{% if add_generation_prompt %}<s>assistant\n{% endif %}")


def byte_tokenizer():
    """Every byte a token (no merges), <s> and </s> special; no BOS added."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    vocab.update({"<s>": len(vocab), "</s>": len(vocab) + 1})
    tk = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tk.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<s>", eos_token="</s>")
    tok.chat_template = CHAT
    return tok


def tiny_llama(vocab_size: int, max_positions: int = 4096):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=16, max_position_embeddings=max_positions,
                         initializer_range=0.2)
    return LlamaForCausalLM(config).eval()


def data_dir(root: pathlib.Path, essays: int = 3, meetings: int = 2,
             questions: int = 40) -> pathlib.Path:
    """``root`` with paul_graham_essays/ (the first essays), qmsum/val.jsonl (the first
    meetings) and mmlu_pro/mmlu_pro_dev3000.jsonl (the first questions) of the real data."""
    (root / "paul_graham_essays").mkdir(parents=True)
    real = sorted(p for p in (SHARED / "paul_graham_essays").glob("*.txt")
                  if not p.name.startswith("LICENSE"))
    for p in real[:essays]:
        shutil.copy(p, root / "paul_graham_essays" / p.name)
    for name, count in (("qmsum/val.jsonl", meetings),
                        ("mmlu_pro/mmlu_pro_dev3000.jsonl", questions)):
        (root / name).parent.mkdir(parents=True)
        with (SHARED / name).open(encoding="utf-8") as f:
            lines = [next(f) for _ in range(count)]
        (root / name).write_text("".join(lines), encoding="utf-8")
    return root
