"""Rouge-L F1 between a generated text and a reference, on words (no stemming, no stop words).

Words are runs of lowercase letters and digits, as ``rouge_score``'s default tokenizer makes
them (text lowercased, everything else a separator). Rouge-L: with ``lcs`` the length of the
longest common subsequence of the two word lists, precision ``lcs / len(candidate)``, recall
``lcs / len(reference)`` and F = their harmonic mean (0 when either list is empty).
"""
from __future__ import annotations

import re

_WORD = re.compile(r"[a-z0-9]+")


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def lcs_length(a: list, b: list) -> int:
    """Length of the longest common subsequence (one row of the dynamic programme at a time)."""
    if len(a) < len(b):
        a, b = b, a
    row = [0] * (len(b) + 1)
    for x in a:
        diagonal = 0  # row[j - 1] of the previous row
        for j, y in enumerate(b, 1):
            above = row[j]
            row[j] = diagonal + 1 if x == y else max(row[j], row[j - 1])
            diagonal = above
    return row[-1]


def rouge_l_f(candidate: str, reference: str) -> float:
    c, r = words(candidate), words(reference)
    if not c or not r:
        return 0.0
    lcs = lcs_length(c, r)
    if lcs == 0:
        return 0.0
    precision, recall = lcs / len(c), lcs / len(r)
    return 2 * precision * recall / (precision + recall)
