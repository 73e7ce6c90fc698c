"""How much does receiving a paced Lynx residual slow a decode step in the same process?

The decode instance drafts on the anchor while the residual streams in; its receiver's reader
thread shares the interpreter (GIL) with the model's forward pass. This probe times a CPU
"decode step" (30 layers x 12 small torch ops on one token, ~14 ms on the 2-core box: the
Python-per-op profile of a SmolLM2 step) with the link idle and while a residual arrives, the
receiver configured as the vLLM decode connector configures it (defer_residual, dequantize).
The sender (SmolLM2-shaped synthetic KV, 1535 tokens, the default lynx codec) runs in a
process of its own, as the prefill instance does.

    python docs/experiments/receiver_interference.py --runs 3 --ack-delay 0,0.02 --json OUT

Prints and writes, per setting and run, the median step with the link idle, during the
residual, and the ratio; settings alternate within each run, so they share the machine state.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import sys
import time

import torch

SHAPE = dict(layers=30, tokens=1535, heads=3, head_dim=64)


def _sender(port: int, gbps: float, frame_s: float, requests: int, go) -> None:
    torch.set_num_threads(1)
    import lynx_npu
    from lynx_npu.transport import Sender, SenderConfig
    from lynx_npu.transport.bench_cmd import _make_layers

    layers = _make_layers(SHAPE["layers"], SHAPE["tokens"], SHAPE["heads"], SHAPE["head_dim"], 0)
    codec = lynx_npu.get_codec("lynx")
    with Sender(SenderConfig(port=port, gbps=gbps, frame_s=frame_s)) as sender:
        for rid in range(1, requests + 1):
            go.get()
            sender.send(rid, codec, layers).wait(120)
        go.get()


def _step(w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    for _ in range(30):
        for _ in range(12):
            x = torch.tanh(torch.nn.functional.linear(x, w) * 0.5 + 0.1)
    return x


def measure(gbps: float, frame_s: float, ack_delay_s: float, requests: int) -> dict:
    from lynx_npu.transport import Receiver, ReceiverConfig

    w, x = torch.randn(576, 576) / 24, torch.randn(1, 576)
    cfg = ReceiverConfig(defer_residual=True, dequantize=True, ack_delay_s=ack_delay_s)
    ctx = mp.get_context("spawn")
    with Receiver(cfg) as receiver:
        go = ctx.Queue()
        proc = ctx.Process(target=_sender, args=(receiver.port, gbps, frame_s, requests, go))
        proc.start()
        for _ in range(20):
            _step(w, x)
        idle, busy = [], []
        for _ in range(30):
            t = time.perf_counter()
            _step(w, x)
            idle.append(time.perf_counter() - t)
        for rid in range(1, requests + 1):
            handle = receiver.request(rid, deadline_s=120)
            go.put(1)
            handle.anchor_ready.wait(120)
            while not handle.residual_ready.is_set():
                t = time.perf_counter()
                _step(w, x)
                busy.append(time.perf_counter() - t)
            receiver.release(rid)
        go.put(1)
        proc.join()
    idle_ms, busy_ms = statistics.median(idle) * 1e3, statistics.median(busy) * 1e3
    return {"ack_delay_s": ack_delay_s, "frame_s": frame_s, "idle_step_ms": idle_ms,
            "residual_step_ms": busy_ms, "slowdown": busy_ms / idle_ms - 1, "steps": len(busy)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gbps", type=float, default=0.2)
    parser.add_argument("--frame-s", default="0.005", help="comma-separated SenderConfig.frame_s")
    parser.add_argument("--ack-delay", default="0,0.02",
                        help="comma-separated ReceiverConfig.ack_delay_s")
    parser.add_argument("--requests", type=int, default=3)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    settings = [(float(f), float(a)) for f in args.frame_s.split(",")
                for a in args.ack_delay.split(",")]
    rows = []
    for run in range(args.runs):
        for frame_s, ack in settings:
            r = measure(args.gbps, frame_s, ack, args.requests)
            r["run"] = run
            rows.append(r)
            print(f"run {run} frame_s {frame_s} ack_delay_s {ack}: step {r['idle_step_ms']:.2f} "
                  f"ms idle, {r['residual_step_ms']:.2f} ms during the residual "
                  f"({100 * r['slowdown']:+.1f}%, {r['steps']} steps)", flush=True)
    for frame_s, ack in settings:
        mine = [r["slowdown"] for r in rows if (r["frame_s"], r["ack_delay_s"]) == (frame_s, ack)]
        print(f"frame_s {frame_s} ack_delay_s {ack}: median slowdown "
              f"{100 * statistics.median(mine):+.1f}% over {len(mine)} runs")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"gbps": args.gbps, "shape": SHAPE, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
