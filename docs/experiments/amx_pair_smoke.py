# Smoke run of a bfloat16 LocalPair on an AMX host (docs/deploy.md, "vLLM on CPU hosts with AMX"):
# python docs/experiments/amx_pair_smoke.py [BLOCK_SIZE]   (default: vLLM's, 128 on the CPU)
import sys
import time
from lynx_npu.eval.model import MODELS
from lynx_npu.integration.vllm_ascend.tools.demo_data import load_prompts, default_data
from lynx_npu.integration.vllm_ascend.tools.local_pair import LocalPair, PairConfig
from lynx_npu.integration.vllm_ascend.tools.model_prep import ensure_model_dir
from lynx_npu.integration.vllm_ascend import vllm_compat
import torch

def main():
    print("isa bf16 bs128:", vllm_compat.cpu_attn_isa(torch.bfloat16, 128, 64), flush=True)
    t0 = time.time()
    p = LocalPair(PairConfig(str(ensure_model_dir()), gbps=0.05, residual_timeout_s=8.0, dtype="bfloat16", block_size=int(sys.argv[1]) if len(sys.argv) > 1 else None,
                             lynx_plan=MODELS["smollm2"].lynx_plan))
    print("pair up", round(time.time() - t0), flush=True)
    prompts = [q.token_ids for q in load_prompts(p.tokenizer, 3, 700, default_data())]
    out = []
    for i, pr in enumerate(prompts):
        loc = p.run_local(pr, max_tokens=40).tokens
        ex = p.run(pr, "bf16", max_tokens=40)
        i8 = p.run(pr, "lynx-int8", max_tokens=40)
        lx = p.run(pr, "lynx", max_tokens=40)
        print(i, "bf16==local", ex.tokens == loc, "lynx-int8==local", i8.tokens == loc,
              "lynx==lynx-int8", lx.tokens == i8.tokens, "agree", sum(a == b for a, b in zip(lx.tokens, i8.tokens)),
              {k: lx.stats.get(k) for k in ("stage", "drafts_proposed", "drafts_accepted", "early_start", "verifications")}, flush=True)
    p.close()


if __name__ == '__main__':
    main()
