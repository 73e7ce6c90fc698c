"""What a decode step costs on vLLM CPU (docs/demo.md, "What a decode step is made of"):
SmolLM2 (float32, one OpenMP thread, no prefix caching, eager), a 1536-token QMSum prompt, the
time of 65 generated tokens less that of 1, over 64, twice per engine.

    python docs/experiments/decode_step_probe.py plain|connector|lynx

plain: stock vLLM; connector: + the Lynx connector as KV consumer; lynx: the whole Lynx decode
instance (connector, LynxScheduler, the null proposer's speculative path). Local requests only:
no transfer, so what is left is the plug-in's per-step cost.
"""
import json
import os
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

from lynx_npu.integration.vllm_ascend.tools.demo_data import load_prompts  # noqa: E402
from lynx_npu.integration.vllm_ascend.tools.engine_config import decode_engine_args  # noqa: E402
from lynx_npu.integration.vllm_ascend.tools.local_pair import free_port  # noqa: E402
from lynx_npu.integration.vllm_ascend.tools.model_prep import ensure_model_dir  # noqa: E402


def engine_args(variant: str, model: str) -> dict:
    common = dict(dtype="float32", gpu_memory_utilization=0.1, max_model_len=4096,
                  enforce_eager=True)
    if variant == "lynx":
        return decode_engine_args(model, port=free_port(), **common)
    args = dict(model=model, enable_prefix_caching=False, **common)
    if variant == "connector":
        args["kv_transfer_config"] = decode_engine_args(model, port=free_port())["kv_transfer_config"]
    elif variant != "plain":
        raise SystemExit(f"variant {variant!r}: plain, connector or lynx")
    return args


def main():
    from vllm import LLM, SamplingParams

    variant = sys.argv[1]
    llm = LLM(**engine_args(variant, str(ensure_model_dir())))
    prompt = load_prompts(llm.get_tokenizer(), 1, 1536)[0].token_ids
    times = {}
    for n in (1, 65, 1, 65):
        params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
        t = time.perf_counter()
        llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)
        times.setdefault(n, []).append(time.perf_counter() - t)
    steps = [(b - a) / 64 for a, b in zip(times[1], times[65])]
    print(json.dumps({"variant": variant, "times": times, "step_s": steps}))


if __name__ == "__main__":
    main()
