"""Entropy coding for the CacheGen baseline: per-channel 16-bit CDF tables + range coding.

CacheGen (as in LMCache) models each channel's quantized symbols with their own empirical
distribution over the chunk's tokens and arithmetic-codes them (torchac there). Here:

- ``cdf_table(symbols, num_symbols)``: the side channel. Per channel, the symbol counts are
  scaled to integer frequencies summing to ``FREQ_TOTAL`` = 65535, every symbol that occurs
  keeping at least 1, and stored as the ``num_symbols - 1`` interior CDF points in uint16
  (the 0 start and the ``FREQ_TOTAL`` end are implicit). LMCache stores ``bins + 1`` int16
  CDF points per channel; this is the same information, 3 entries shorter.
- ``encode_symbols`` / ``decode_symbols``: constriction's range coder (queue: first in, first
  out) with one concrete ``Categorical`` model per channel, built from the table alone, so
  encoder and decoder construct bit-identical models. Symbols are coded channel by channel,
  a whole channel's tokens per call (the loop is over channels, never over symbols).
"""
from __future__ import annotations

import importlib

import numpy as np

FREQ_TOTAL = 65535  # largest total whose interior CDF points all fit in uint16


def _constriction():
    # Imported on use: only the cachegen baseline needs it, and `import lynx_npu` must work
    # on a base install (pip install lynx_npu, without the eval extra).
    try:
        return importlib.import_module("constriction")
    except ImportError as e:
        raise ImportError("the cachegen codec needs constriction: pip install 'lynx_npu[eval]'") from e


def cdf_table(symbols: np.ndarray, num_symbols: int) -> np.ndarray:
    """[tokens, channels] symbols in [0, num_symbols) -> [channels, num_symbols - 1] uint16."""
    tokens, channels = symbols.shape
    flat = np.arange(channels, dtype=np.int64)[None, :] * num_symbols + symbols
    counts = np.bincount(flat.reshape(-1), minlength=channels * num_symbols)
    counts = counts.reshape(channels, num_symbols)
    freq = counts * FREQ_TOTAL // tokens
    freq = np.where(counts > 0, np.maximum(freq, 1), 0)
    # The most frequent symbol absorbs the rounding: it holds >= FREQ_TOTAL / num_symbols,
    # far more than the at most num_symbols units it can lose.
    top = counts.argmax(axis=1)
    rows = np.arange(channels)
    freq[rows, top] += FREQ_TOTAL - freq.sum(axis=1)
    assert (freq[rows, top] >= 1).all()
    return np.cumsum(freq[:, :-1], axis=1).astype(np.uint16)


def table_frequencies(table: np.ndarray) -> np.ndarray:
    """Inverse of the table's cumulative form: [channels, n - 1] uint16 -> [channels, n] float32."""
    channels = table.shape[0]
    cdf = np.concatenate([np.zeros((channels, 1), np.int64), table.astype(np.int64),
                          np.full((channels, 1), FREQ_TOTAL, np.int64)], axis=1)
    freq = np.diff(cdf, axis=1)
    if (freq < 0).any():
        raise ValueError("corrupt CacheGen CDF table: points are not non-decreasing")
    return freq.astype(np.float32)  # exact: integers below 2**24


def _models(freq: np.ndarray) -> list:
    categorical = _constriction().stream.model.Categorical
    return [categorical(row, perfect=False) for row in freq]


def encode_symbols(groups: list[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    """Range-code groups of ([tokens, channels] symbols, [channels, n-1] table) -> uint32 words."""
    encoder = _constriction().stream.queue.RangeEncoder()
    for symbols, table in groups:
        cols = np.ascontiguousarray(symbols.T, dtype=np.int32)
        for col, model in zip(cols, _models(table_frequencies(table))):
            encoder.encode(col, model)
    return encoder.get_compressed()


def decode_symbols(words: np.ndarray, groups: list[tuple[int, np.ndarray]]) -> list[np.ndarray]:
    """Inverse of ``encode_symbols``: groups of (tokens, table) -> [tokens, channels] int32 each."""
    decoder = _constriction().stream.queue.RangeDecoder(np.ascontiguousarray(words, np.uint32))
    out = []
    for tokens, table in groups:
        cols = [decoder.decode(model, tokens) for model in _models(table_frequencies(table))]
        out.append(np.stack(cols, axis=1))
    # A whole stream leaves nothing behind; leftovers mean a wrong shape or a foreign buffer.
    # (Truncation cannot be seen here: the coder reads missing words as zeros; the wire CRC does.)
    if not decoder.maybe_exhausted():
        raise ValueError(f"range-coded stream of {words.size} words has words left after the "
                         "expected symbols")
    return out
