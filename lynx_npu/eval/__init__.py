"""lynx_npu.eval: codec error on real KV of a real model (docs/eval.md).

model.py (SmolLM2 from its GGUF, text and QMSum loaders) -> capture.py (post-RoPE Q/K/V of
every layer) -> metrics.py (NMSE, causal GQA attention vNMSE) -> evaluate.py (one codec over
all layers) -> codecs_cmd.py / sweep_cmd.py (the ``lynx eval`` commands).
"""
