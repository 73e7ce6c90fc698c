"""The sending side of ``lynx bench datapath``'s wire stage, in a process of its own.

Prefill and decode are separate processes in a deployment; a sender and a receiver in one
Python process also contend for one interpreter lock, which the link's rate would then measure
(on 2 cores here: 3.4-4.3 Gbit/s in one process, 5-8.8 in two, same pages). So the benchmark
writes the staged wire pages to one host file (tmpfs where there is one), starts this module
with their index, and times the link from "go" to the receiver's last residual.

Protocol on stdio: the peer connects and sends a warm-up request (id 1: the first layer), prints
``ready``; on each ``go <id>`` line it sends request ``id`` (every page, all anchors first:
``Sender.send_encoded``), waits for its ACKs and prints ``sent <id>``; it exits when stdin
closes. Any failure: one line on stderr and a non-zero exit, which the benchmark reports.
"""
from __future__ import annotations

import argparse
import json
import mmap
import sys

import lynx_npu
from lynx_npu.ops import WirePage

DTYPES = ("bfloat16", "float16")


def write_pages(path: str, layers) -> list[list[list[int]]]:
    """The pages of ``layers`` (EncodedLayers) into one file -> their index: per layer, per
    page [index, token_start, token_end, anchor offset, anchor bytes, residual offset,
    residual bytes (-1: none)]."""
    index, off = [], 0
    with open(path, "wb") as f:
        for layer in layers:
            rows = []
            for p in layer.pages:
                a = f.write(p.anchor)
                r = f.write(p.residual) if p.residual is not None else -1
                rows.append([p.index, p.token_start, p.token_end, off, a, off + a, r])
                off += a + max(r, 0)
            index.append(rows)
    return index


def read_pages(path: str, index) -> tuple[mmap.mmap, list[list[WirePage]]]:
    """The file of ``write_pages`` mapped -> (the map, per layer its WirePages over it)."""
    with open(path, "rb") as f:
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    view = memoryview(mapped)
    layers = [[WirePage(i, t0, t1, view[a_off:a_off + a],
                        view[r_off:r_off + r] if r >= 0 else None)
               for i, t0, t1, a_off, a, r_off, r in rows] for rows in index]
    return mapped, layers


def main(argv=None) -> int:
    import torch

    from lynx_npu.transport import Sender, SenderConfig

    p = argparse.ArgumentParser(prog="python -m lynx_npu.eval.wire_peer",
                                description=__doc__.splitlines()[0])
    p.add_argument("--pages", required=True, help="the file of write_pages")
    p.add_argument("--index", required=True, help="its index, JSON")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--connections", type=int, default=4)
    p.add_argument("--frame-bytes", type=int, default=None)
    p.add_argument("--codec", required=True)
    p.add_argument("--kv", required=True, help="num_tokens,num_kv_heads,head_dim")
    p.add_argument("--dtype", choices=DTYPES, required=True)
    args = p.parse_args(argv)
    with open(args.index) as f:
        index = json.load(f)
    tokens, heads, head_dim = (int(x) for x in args.kv.split(","))
    meta = dict(num_tokens=tokens, num_kv_heads=heads, head_dim=head_dim,
                dtype=getattr(torch, args.dtype))
    codec = lynx_npu.get_codec(args.codec)
    try:
        _, layers = read_pages(args.pages, index)  # mapped until the process exits
        link = {} if args.frame_bytes is None else {"frame_bytes": args.frame_bytes}
        with Sender(SenderConfig(port=args.port, num_connections=args.connections,
                                 deadline_s=600, **link)) as sender:
            if not sender.send_encoded(1, codec, layers[:1], **meta).wait(600):
                raise RuntimeError("the warm-up request was not acknowledged")
            print("ready", flush=True)
            for line in sys.stdin:  # "go <request id>" until the benchmark closes stdin
                word, rid = line.split()
                if word != "go" or int(rid) < 2:
                    raise RuntimeError(f"expected 'go <request id >= 2>', got {line!r}")
                if not sender.send_encoded(int(rid), codec, layers, **meta).wait(600):
                    raise RuntimeError(f"request {rid} was not acknowledged")
                print(f"sent {rid}", flush=True)
    except Exception as e:  # one line for the benchmark to report
        print(f"wire peer: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
