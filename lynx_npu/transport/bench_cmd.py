"""``lynx bench transfer``: split-stream transfer between two processes over loopback.

A receiver process and a sender process (multiprocessing, spawn) move a SmolLM2-135M-shaped
KV cache (30 layers, 3 KV heads, head_dim 64, bf16) through the rate-limited link, one codec
after another, and report per codec the time from the first send call to ``anchor_ready`` and
to completion, and the achieved rate (all frame bytes, headers included) against the limit.

The KV is synthetic: Laplacian values with per-channel scales (heavy-tailed like real K/V).
Transfer sizes depend only on the shape, so this is enough to time the link; codec accuracy is
measured on real KV by ``lynx eval codecs``. By default pages are compressed before the clock
starts and the receiver verifies (CRC), acknowledges and keeps frames without dequantizing:
that times the link. ``--encode-inline`` compresses on the sender's pipeline thread during the
transfer and ``--dequantize`` dequantizes into a KV cache on arrival; on a CPU the reference
codecs are far slower than a 1 Gbps link, so those two measure the codec, not the link.
An untimed bf16 warm-up request of 1024 tokens goes first (a fresh connection and receiver
heap run slower for their first megabytes), and both processes collect and freeze the garbage
collector's heap before each timed transfer (a full collection of a process that imported
torch pauses it ~0.1 s; DESIGN §5's rate-limited link would see that as a stall).

JSON (``--json``): {"gbps", "tokens", "results": [{"codec", "anchor_bytes", "total_bytes",
"anchor_ready_s", "complete_s", "achieved_gbps"}]}; for one-stream codecs anchor_ready_s is
the completion time. Progress goes to stderr.
"""
from __future__ import annotations

import argparse
import gc
import json
import multiprocessing as mp
import signal
import sys
import time

from lynx_npu.cli_types import MAX_TOKENS, int_in, names, number_in, output_file

SMOLLM2 = {"layers": 30, "kv_heads": 3, "head_dim": 64}
WARMUP_TOKENS = 1024


def _codec_names() -> list[str]:
    import lynx_npu
    return lynx_npu.list_codecs()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--gbps", type=number_in(0, 1e5, low_open=True), default=1.0,
                        help="link rate limit (Gbps, in (0, 100000])")
    parser.add_argument("--tokens", type=int_in(1, MAX_TOKENS), default=8192,
                        help="prompt tokens per request")
    parser.add_argument("--codec", type=names(_codec_names, "codec"),
                        default="bf16,int8,int4,lynx",
                        help="comma-separated codec names (lynx_npu.list_codecs())")
    parser.add_argument("--json", type=output_file, metavar="OUT.json",
                        help="write the results here")
    parser.add_argument("--plot", type=output_file, metavar="OUT.png",
                        help="write a timeline plot here")
    parser.add_argument("--layers", type=int_in(1, 1024), default=SMOLLM2["layers"])
    parser.add_argument("--kv-heads", type=int_in(1, 1024), default=SMOLLM2["kv_heads"])
    parser.add_argument("--head-dim", type=int_in(1, 4096), default=SMOLLM2["head_dim"])
    parser.add_argument("--connections", type=int_in(1, 16), default=1,
                        help="TCP connections, in [1, 16] (the receiver's max_connections)")
    parser.add_argument("--frame-bytes", type=int_in(1, 1 << 30), default=4 << 20,
                        help="bytes of pages per frame (SenderConfig.frame_bytes, default 4 MiB; "
                             "1: one page a frame)")
    parser.add_argument("--encode-inline", action="store_true",
                        help="compress during the transfer (pipelined) instead of before it")
    parser.add_argument("--dequantize", action="store_true",
                        help="the receiver dequantizes every page into a KV cache on arrival")
    parser.add_argument("--seed", type=int_in(0, 2**32 - 1), default=0)
    parser.add_argument("--timeout", type=number_in(0, 86400, low_open=True), default=600.0,
                        help="seconds before a transfer counts as failed")


def _log(message: str) -> None:
    print(f"[lynx bench transfer] {message}", file=sys.stderr, flush=True)


def _make_layers(num_layers: int, num_tokens: int, heads: int, dim: int, seed: int):
    import torch

    g = torch.Generator().manual_seed(seed)
    layers = []
    for _ in range(num_layers):
        kv = []
        for _ in range(2):
            scale = torch.exp(0.5 * torch.randn(heads, 1, dim, generator=g))
            u = torch.rand(heads, num_tokens, dim, generator=g).clamp_(1e-7, 1 - 1e-7) - 0.5
            lap = -torch.sign(u) * torch.log1p(-2 * u.abs())  # inverse-CDF Laplace(0, 1)
            kv.append((lap * scale).to(torch.bfloat16))
        layers.append(tuple(kv))
    return layers


def _quiet_gc() -> None:
    """Collect now and freeze what survives: a full cyclic GC over a process that imported
    torch takes ~0.1 s, which would otherwise land in the middle of a timed transfer."""
    gc.collect()
    gc.freeze()


def _one_torch_thread() -> None:
    """The two processes share the machine: more torch threads than cores make every small
    op wait for descheduled OpenMP workers (measured 20x slower per page on 2 busy cores)."""
    import torch

    torch.set_num_threads(1)


def _receiver_main(cfg: dict, request_ids: list[int], timeout: float, out, stop) -> None:
    from lynx_npu.transport import Receiver, ReceiverConfig

    _one_torch_thread()

    try:
        with Receiver(ReceiverConfig(**cfg)) as receiver:
            out.put(("port", receiver.port))
            receiver.request(0, deadline_s=timeout).wait()  # the warm-up request
            receiver.release(0)
            for rid in request_ids:
                _quiet_gc()
                handle = receiver.request(rid, deadline_s=timeout)
                handle.residual_ready.wait()
                arrivals = [(t, kind, layer, nbytes) for t, kind, layer, _, nbytes
                            in handle.arrivals]
                out.put(("received", rid, handle.anchor_ready_at, handle.residual_ready_at,
                         arrivals))
                receiver.release(rid)
            stop.wait(timeout)  # stay up until the sender has every acknowledgement
    except BaseException as e:  # report, never hang the parent
        out.put(("error", f"receiver: {type(e).__name__}: {e}"))


def _sender_main(port: int, opts: dict, out) -> None:
    import torch

    import lynx_npu
    from lynx_npu.transport import Sender, SenderConfig

    _one_torch_thread()
    try:
        cfg = SenderConfig(port=port, gbps=opts["gbps"], num_connections=opts["connections"],
                           deadline_s=opts["timeout"], frame_bytes=opts["frame_bytes"])
        with Sender(cfg) as sender:
            # Warm-up (untimed, unreported): the first megabytes through a fresh connection
            # and a fresh receiver heap run slower (buffer growth, page faults).
            warm = lynx_npu.get_codec("bf16")
            layers = _make_layers(opts["layers"], WARMUP_TOKENS, opts["kv_heads"],
                                  opts["head_dim"], opts["seed"])
            sender.send(0, warm, layers).wait()
            for rid, name in enumerate(opts["codecs"], start=1):
                codec = lynx_npu.get_codec(name)
                _log(f"{name}: making {opts['layers']} layers x {opts['tokens']} tokens of KV")
                layers = _make_layers(opts["layers"], opts["tokens"], opts["kv_heads"],
                                      opts["head_dim"], opts["seed"])
                _quiet_gc()
                if opts["encode_inline"]:
                    t0 = time.monotonic()
                    handle = sender.send(rid, codec, layers)
                else:
                    _log(f"{name}: compressing (before the clock starts)")
                    pages = [codec.encode_pages(k, v) for k, v in layers]
                    _quiet_gc()
                    t0 = time.monotonic()
                    handle = sender.send_encoded(
                        rid, codec, pages, num_tokens=opts["tokens"],
                        num_kv_heads=opts["kv_heads"], head_dim=opts["head_dim"],
                        dtype=torch.bfloat16)
                _log(f"{name}: sending")
                handle.wait()
                out.put(("sent", rid, name, t0, handle.anchor_bytes, handle.total_bytes,
                         len(codec.stages) > 1))
    except BaseException as e:
        out.put(("error", f"sender: {type(e).__name__}: {e}"))


def _get(q, timeout: float, procs):
    import queue

    deadline = time.monotonic() + timeout
    while True:
        try:
            msg = q.get(timeout=1.0)
        except queue.Empty:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no result within {timeout:.0f} s") from None
            dead = [p.name for p in procs if p.exitcode not in (None, 0)]
            if dead:
                raise RuntimeError(f"benchmark process(es) {dead} exited") from None
            continue
        if msg[0] == "error":
            raise RuntimeError(msg[1])
        return msg


def measure(opts: dict) -> tuple[list[dict], dict]:
    """Run the transfers; returns the JSON results and per-codec arrival timelines."""
    ctx = mp.get_context("spawn")
    recv_q, send_q, stop = ctx.Queue(), ctx.Queue(), ctx.Event()
    ids = list(range(1, len(opts["codecs"]) + 1))
    receiver = ctx.Process(target=_receiver_main, name="receiver", daemon=True,
                           args=({"dequantize": opts["dequantize"],
                                  "deadline_s": opts["timeout"]}, ids, opts["timeout"], recv_q,
                                 stop))
    receiver.start()
    procs = [receiver]
    try:
        _, port = _get(recv_q, 120, procs)
        sender = ctx.Process(target=_sender_main, name="sender", args=(port, opts, send_q),
                             daemon=True)
        sender.start()
        procs.append(sender)
        results, timelines = [], {}
        for _ in ids:
            _, rid, name, t0, anchor_bytes, total_bytes, progressive = _get(
                send_q, opts["timeout"] + 300, procs)
            _, rid2, anchor_at, full_at, arrivals = _get(recv_q, opts["timeout"], procs)
            assert rid == rid2, (rid, rid2)
            complete_s = full_at - t0
            anchor_s = (anchor_at - t0) if progressive else complete_s
            row = {"codec": name, "anchor_bytes": int(anchor_bytes if progressive
                                                        else total_bytes),
                   "total_bytes": int(total_bytes), "anchor_ready_s": round(anchor_s, 6),
                   "complete_s": round(complete_s, 6),
                   "achieved_gbps": round(total_bytes * 8 / complete_s / 1e9, 6)}
            results.append(row)
            timelines[name] = [(t - t0, kind, layer, n) for t, kind, layer, n in arrivals]
            ideal = row["anchor_bytes"] * 8 / (opts["gbps"] * 1e9)
            _log(f"{name}: anchor_ready {anchor_s:.3f} s (anchor bytes / link = {ideal:.3f} s),"
                 f" complete {complete_s:.3f} s, {row['achieved_gbps']:.3f} Gbps of "
                 f"{opts['gbps']} ({total_bytes / 1e6:.1f} MB)")
        sender.join(timeout=60)
        stop.set()
        receiver.join(timeout=60)
        return results, timelines
    finally:
        stop.set()
        for p in procs:
            if p.is_alive():
                p.terminate()
                p.join(timeout=10)


def run(args: argparse.Namespace) -> int:
    codecs = [c.strip() for c in args.codec.split(",")]  # checked by its argparse type
    opts = {"gbps": args.gbps, "tokens": args.tokens, "codecs": codecs, "layers": args.layers,
            "kv_heads": args.kv_heads, "head_dim": args.head_dim,
            "connections": args.connections, "frame_bytes": args.frame_bytes,
            "encode_inline": args.encode_inline,
            "dequantize": args.dequantize, "seed": args.seed, "timeout": args.timeout}
    _log(f"{args.layers} layers x {args.kv_heads} KV heads x {args.head_dim} dims x "
         f"{args.tokens} tokens, bf16, {args.gbps} Gbps, codecs {codecs}"
         + (", compress inline" if args.encode_inline else ", pre-compressed")
         + (", dequantizing" if args.dequantize else ", frames kept (no dequantization)"))
    # SIGTERM -> SystemExit, so measure()'s cleanup stops the two child processes.
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        results, timelines = measure(opts)
    finally:
        signal.signal(signal.SIGTERM, previous)
    report = {"gbps": float(args.gbps), "tokens": int(args.tokens), "results": results}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
            f.write("\n")
        _log(f"wrote {args.json}")
    if args.plot:
        from .bench_plot import plot_timeline

        plot_timeline(report, timelines, args.plot)
        _log(f"wrote {args.plot}")
    print(json.dumps(report))
    return 0
