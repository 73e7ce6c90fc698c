"""``lynx bench datapath``: the whole KV data path on one device, stage by stage.

A paged KV cache on the device (``--layout``, blocks in ``--block-order``) -> compress with the
page serde (the gather from the blocks, the wire layout and the scalar previews included:
lynx_npu.ops.page_serde) -> staging to host memory -> frames over loopback TCP (the embedded
split-stream transport, no rate limit) -> the receiver -> staging to the device -> decompress
straight into a second paged cache on the same device (other blocks, shuffled).

Stages are run one after the other and timed on their own with the kernel benchmark's harness
(lynx_npu/eval/bench_kernels.py: wall clock on the CPU, device events around back-to-back calls
on accelerators, median of ``--repeats``), beside the device's copy bandwidth measured in the
same run the same way. Device stages count every launch of a whole request (all layers), their
GB/s are bytes read + written per second: compress = KV read + wire bytes written, decompress =
wire bytes read + KV written; ``*_kv_gbps`` is KV bytes per second. The link's rate is wire
bytes (frame headers included) per second, in Gbit/s, with the sender in a process of its
own by default (``--wire-peer``: prefill and decode are two processes in a deployment; in one,
both sides share the interpreter lock and the link's rate measures that). Host staging (``d2h``,
``h2d``) is reported apart (on the CPU there is none: the wire bytes are the kernel's buffers): the second
run of each, after the first run's buffers are freed, so that it reuses their pinned memory as a
worker's later requests do (``d2h_first_s``: the first, which allocates it).

Checks: the wire pages equal the codec's reference ``encode_pages`` of the KV, byte for byte,
and the received cache equals the reference ``decode_page`` of those pages, value for value,
at every slot (``exact``); the references run on the same device (torch), layer by layer.

JSON (``--json``): {"device", "copy_gbps", "tokens", "compress_gbps", "decompress_gbps",
"wire_gbps", "exact", ...: every stage's seconds and rates, the shape, layout, backends}.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

import lynx_npu
from lynx_npu.cli_types import MAX_TOKENS, int_in, output_file
from lynx_npu.ops import KV_CACHE_LAYOUTS, PagedKVCache, serde_for
from lynx_npu.ops.dest import paged
from lynx_npu.ops.lynx_serde import PLAN_TABLE_BACKENDS
from lynx_npu.transport.config import SenderConfig

from . import wire_peer
from .bench_kernels import _sync, copy_gbps, device_name, timer_for
from .progress import progress

DEFAULT_SHAPE = {"cpu": (30, 3, 8192, 64), "cuda": (32, 8, 16384, 128)}  # SmolLM2, Llama-8B
DEFAULT_LAYOUT = {"cpu": "vllm_cpu", "cuda": "vllm_flash_nhd"}
BLOCK_SIZE = {"cpu": 32, "cuda": 16}
CODECS = ("lynx", "lynx-int8", "lynx-int4")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", choices=("cpu", "cuda"),
                        help="default: cuda if available, else cpu")
    parser.add_argument("--tokens", type=int_in(1, MAX_TOKENS), help="default 8192 (cpu), 16384 (cuda)")
    parser.add_argument("--layers", type=int_in(1, 1024), help="default 30 (cpu), 32 (cuda)")
    parser.add_argument("--kv-heads", type=int_in(1, 1024), help="default 3 (cpu), 8 (cuda)")
    parser.add_argument("--head-dim", type=int_in(1, 4096), help="default 64 (cpu), 128 (cuda)")
    parser.add_argument("--dtype", choices=("bfloat16", "float16"), default="bfloat16")
    parser.add_argument("--layout", choices=sorted(KV_CACHE_LAYOUTS),
                        help="paged cache layout (default vllm_cpu on cpu, vllm_flash_nhd on "
                             "cuda)")
    parser.add_argument("--block-order", choices=("random", "sequential"), default="random")
    parser.add_argument("--block-size", type=int_in(1, 4096), help="default 32 (cpu), 16 (cuda)")
    parser.add_argument("--codec", choices=CODECS, default="lynx")
    parser.add_argument("--backend", default=None, help="ops backend (default: automatic)")
    parser.add_argument("--connections", type=int_in(1, 16), default=4, help="TCP connections")
    parser.add_argument("--frame-bytes", type=int_in(1, 1 << 30), default=None,
                        help="bytes of pages per frame (SenderConfig.frame_bytes; default its "
                             "default, 4 MiB; 1: one page a frame, frame format 3's way)")
    parser.add_argument("--decode-threads", type=int_in(1, 64), default=1,
                        help="the receiver's page workers (ReceiverConfig.num_decode_threads, "
                             "the connector's num_decode_threads; default 1, as there): each "
                             "hands its pages on, here a copy into one host buffer")
    parser.add_argument("--wire-peer", choices=("process", "thread"), default="process",
                        help="where the wire stage's sender runs: a process of its own, as "
                             "prefill is in a deployment (default), or a thread of this one")
    parser.add_argument("--repeats", type=int_in(1, 100000), default=None,
                        help="timed repetitions of each device stage (default 5 cpu, 10 cuda)")
    parser.add_argument("--check-layers", type=int_in(0, 1024), default=0,
                        help="layers checked against the reference (default 0: all)")
    parser.add_argument("--seed", type=int_in(0, 2**32 - 1), default=0)
    parser.add_argument("--json", type=output_file, metavar="OUT.json", help="write the results here")


def _log(message: str) -> None:
    print(f"[lynx bench datapath] {message}", file=sys.stderr, flush=True)


def _kv(layers, heads, tokens, head_dim, dtype, device, seed):
    """Synthetic KV made on the device: Laplacian K with per-channel scales, Gaussian V."""
    g = torch.Generator(device=device).manual_seed(seed)
    out = []
    for _ in range(layers):
        u = torch.rand(heads, tokens, head_dim, generator=g, device=device) - 0.5
        scale = torch.rand(1, 1, head_dim, generator=g, device=device) * 4 + 0.1
        k = -torch.sign(u) * torch.log1p(-2 * u.abs().clamp(max=0.4999999)) * scale
        v = torch.randn(heads, tokens, head_dim, generator=g, device=device) * 0.5
        out.append((k.to(dtype), v.to(dtype)))
    return out


def _cache(layout, layers, heads, tokens, head_dim, dtype, device, block_size, order, seed):
    num_blocks = -(-tokens // block_size) + 8
    lay = KV_CACHE_LAYOUTS[layout]
    cache = PagedKVCache.build(lay, [lay.allocate(num_blocks, block_size, heads, head_dim,
                                                  dtype, device) for _ in range(layers)])
    blocks = (torch.randperm(num_blocks, generator=torch.Generator().manual_seed(seed))
              if order == "random" else torch.arange(num_blocks))
    t = torch.arange(tokens)
    slots = blocks[t // block_size] * block_size + t % block_size
    return cache, slots


def _inbox(serde, shape, dtype):
    """Where the receiver's sink puts every frame: one host buffer, written before the clock
    starts (a consumer frees each payload once decoded; keeping 10**3 fresh allocations
    alive instead would time the host's page faults, not the link)."""
    num_layers, heads, tokens, head_dim = shape
    place, off = {}, 0
    for layer in range(num_layers):
        for t0, t1, a, r in serde.page_nbytes(tokens, heads, head_dim, dtype):
            place[(layer, t0)] = (t1, off, a, off + a, r or 0)
            off += a + (r or 0)
    raw = torch.ones(max(off, 1), dtype=torch.uint8).numpy()  # touched: no page faults later
    return place, raw


def _wire(serde, codec, codec_name, layers, shape, dtype, connections, peer, repeats,
          decode_threads=1, frame_bytes=None):
    """Send the staged layers over loopback ``repeats`` times -> (median seconds, frame bytes
    of one request, the pages received). The sender runs in a process of its own
    (``peer="process"``, lynx_npu/eval/wire_peer.py) or on a thread of this one (``"thread"``:
    both sides then share one interpreter lock)."""
    from lynx_npu.ops import WirePage
    from lynx_npu.transport import Receiver, ReceiverConfig

    received: dict[int, dict[int, object]] = {}
    place, raw = _inbox(serde, shape, dtype)
    whole = memoryview(raw)

    def on_encoded(rid, layer, page, stage):
        if rid < 2:  # the warm-up
            return
        t1, a_off, a, r_off, r = place[(layer, page.token_start)]
        have = received.setdefault(layer, {}).get(page.token_start)
        if have is None or have.residual is None:
            raw[a_off:a_off + a] = np.frombuffer(page.anchor, dtype=np.uint8)
        if page.residual is not None:
            raw[r_off:r_off + r] = np.frombuffer(page.residual, dtype=np.uint8)
        received[layer][page.token_start] = WirePage(
            page.index, page.token_start, t1, whole[a_off:a_off + a],
            whole[r_off:r_off + r] if page.residual is not None else None)

    times, marks = [], []
    with Receiver(ReceiverConfig(deadline_s=600, max_request_bytes=1 << 40,
                                 num_decode_threads=decode_threads),
                  on_encoded=on_encoded) as receiver:
        send = _thread_peer if peer == "thread" else _process_peer
        with send(receiver.port, codec, codec_name, layers, shape, dtype, connections,
                  frame_bytes) as go:
            for rid in range(2, 2 + repeats):
                received.clear()
                handle = receiver.request(rid)
                t0 = time.monotonic()
                go(rid)
                if not handle.residual_ready.wait(600):
                    raise RuntimeError(f"the wire stage did not finish: {handle.progress()}")
                times.append(time.monotonic() - t0)
                # where the time went: frames admitted (first, last) and the last page handed
                # on; a late last page means the consumer, not the link, set the pace
                marks.append((handle.arrivals[0][0] - t0, handle.arrivals[-1][0] - t0,
                              handle.anchor_ready_at - t0, handle.residual_ready_at - t0))
                receiver.release(rid)
    nbytes = sum(n for *_, n in handle.arrivals)
    first, last, anchor, done = (float(np.median(m)) for m in zip(*marks))
    timeline = {"first_frame_s": first, "last_frame_s": last, "anchor_ready_s": anchor,
                "residual_ready_s": done}
    return float(np.median(times)), nbytes, {layer: list(p.values())
                                             for layer, p in received.items()}, timeline


@contextlib.contextmanager
def _thread_peer(port, codec, codec_name, layers, shape, dtype, connections, frame_bytes=None):
    """A Sender in this process, warmed up by request 1 (the first layer); yields go(id),
    which sends request ``id`` (every page, anchors first)."""
    from lynx_npu.transport import Sender, SenderConfig

    num_layers, heads, tokens, head_dim = shape
    meta = dict(num_tokens=tokens, num_kv_heads=heads, head_dim=head_dim, dtype=dtype)
    pages = [layer.pages for layer in layers]
    link = {} if frame_bytes is None else {"frame_bytes": frame_bytes}
    with Sender(SenderConfig(port=port, num_connections=connections, deadline_s=600,
                             **link)) as sender:
        if not sender.send_encoded(1, codec, pages[:1], **meta).wait(600):
            raise RuntimeError("the warm-up request was not acknowledged")
        sent = []
        yield lambda rid: sent.append(sender.send_encoded(rid, codec, pages, **meta))
        for handle in sent:
            if not handle.wait(600):
                raise RuntimeError(f"request {handle.request_id} was not acknowledged")


@contextlib.contextmanager
def _process_peer(port, codec, codec_name, layers, shape, dtype, connections,
                  frame_bytes=None):
    """lynx_npu.eval.wire_peer in a child process, the pages handed over in one host file
    (tmpfs where there is one: /dev/shm); yields go(id), which writes its "go <id>" line."""
    num_layers, heads, tokens, head_dim = shape
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    with tempfile.TemporaryDirectory(prefix="lynx-wire-", dir=shm) as tmp:
        pages, index = os.path.join(tmp, "pages.bin"), os.path.join(tmp, "index.json")
        with open(index, "w") as f:
            json.dump(wire_peer.write_pages(pages, layers), f)
        argv = [sys.executable, "-m", "lynx_npu.eval.wire_peer", "--pages", pages, "--index",
                index, "--port", str(port), "--connections", str(connections),
                "--codec", codec_name, "--kv", f"{tokens},{heads},{head_dim}",
                "--dtype", str(dtype).removeprefix("torch.")]
        if frame_bytes is not None:
            argv += ["--frame-bytes", str(frame_bytes)]
        with subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) as child:
            def expect(line: str) -> None:
                if child.stdout.readline().strip() != line:
                    child.kill()
                    raise RuntimeError(f"the wire peer failed: {child.stderr.read().strip()}")

            def go(rid: int) -> None:
                child.stdin.write(f"go {rid}\n")
                child.stdin.flush()
                pending.append(f"sent {rid}")

            pending: list[str] = []
            try:
                expect("ready")
                yield go
                for line in pending:
                    expect(line)
                child.stdin.close()
                if child.wait(60) != 0:
                    raise RuntimeError(f"the wire peer failed: {child.stderr.read().strip()}")
            finally:
                if child.poll() is None:
                    child.kill()


def _check(codec, src, src_slots, dst, dst_slots, encoded, layers: int) -> bool:
    """Wire bytes == the reference encoder's; the received cache == the reference decoder's
    (the reference on the host, as the tests run it)."""
    exact = True
    with progress(layers, "[lynx bench datapath] checking layers") as bar:
        for i in range(layers):
            k, v = (x.cpu() for x in src.read(i, src_slots))
            ref = codec.encode_pages(k, v)
            exact &= len(ref) == len(encoded[i].pages)
            for got, want in zip(encoded[i].pages, ref):
                same = bytes(got.anchor) == want.anchor.numpy().tobytes() and (
                    want.residual is None
                    or bytes(got.residual) == want.residual.numpy().tobytes())
                exact &= same
            wk = [codec.decode_page(p.anchor, p.residual, p.token_start, p.token_end,
                                    num_kv_heads=k.shape[0], head_dim=k.shape[2],
                                    dtype=k.dtype) for p in ref]
            gk, gv = (x.cpu() for x in dst.read(i, dst_slots))
            exact &= bool(torch.equal(gk, torch.cat([x[0] for x in wk], 1)))
            exact &= bool(torch.equal(gv, torch.cat([x[1] for x in wk], 1)))
            bar.update()
    return exact


def run(args) -> int:
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        _log("device cuda is not available here")
        return 2
    layers, heads, tokens, head_dim = DEFAULT_SHAPE[device]
    layers, heads = args.layers or layers, args.kv_heads or heads
    tokens, head_dim = args.tokens or tokens, args.head_dim or head_dim
    shape = (layers, heads, tokens, head_dim)
    if min(shape) < 1 or args.connections < 1:
        raise ValueError(f"shape {shape} and --connections {args.connections} must be >= 1")
    dtype = getattr(torch, args.dtype)
    layout = args.layout or DEFAULT_LAYOUT[device]
    block_size = args.block_size or BLOCK_SIZE[device]
    repeats = args.repeats or (5 if device == "cpu" else 10)
    codec = lynx_npu.get_codec(args.codec)
    serde = serde_for(codec, args.backend)
    used = serde.compress_backend(device, heads, head_dim, dtype)
    if used not in PLAN_TABLE_BACKENDS:
        raise ValueError(f"the {used!r} backend runs the reference codec (no wire-layout "
                         f"kernels); the data path needs one of {sorted(PLAN_TABLE_BACKENDS)}")
    _log(f"device {device}, {layers} layers x [{heads}, {tokens}, {head_dim}] {args.dtype}, "
         f"{layout} cache, {args.block_order} blocks of {block_size}, codec {args.codec}")

    kv = _kv(layers, heads, tokens, head_dim, dtype, device, args.seed)
    kv_bytes = sum(2 * k.numel() * k.element_size() for k, _ in kv)
    src, src_slots = _cache(layout, layers, heads, tokens, head_dim, dtype, device, block_size,
                            args.block_order, args.seed + 1)
    dst, dst_slots = _cache(layout, layers, heads, tokens, head_dim, dtype, device, block_size,
                            args.block_order, args.seed + 2)
    for i, (k, v) in enumerate(kv):
        src.write(i, src_slots.to(device), k, v)
    copy = copy_gbps(kv, device, repeats)
    del kv
    _log(f"copy {copy:.1f} GB/s (read + write)")
    timer = timer_for(device)
    src_dev, dst_dev = src_slots.to(device), dst_slots.to(device)
    backend_c = serde.compress_backend(device, heads, head_dim, dtype)
    backend_d = serde.decompress_backend(device, heads, head_dim, dtype)

    # 1. compress every layer of the request on the device (gather + wire layout + previews)
    compress_s = timer(lambda: _compress(serde, src, src_dev), device, repeats)
    device_layers = _compress(serde, src, src_dev)
    _sync(device)
    # 2. stage to host memory (the wire pages). The first staging allocates the pinned
    # buffer (fresh host memory: on the H100 VM ~0.5 s per GB); it is freed before the timed
    # second one, which reuses it from torch's pinned-memory cache, as a worker's later
    # requests do (keeping the first alive timed a second fresh allocation: "d2h 1075.6 ms")
    t0 = time.perf_counter()
    encoded = [layer.wait() for layer in _stage(serde, device_layers)]
    d2h_first_s = time.perf_counter() - t0
    del encoded
    t0 = time.perf_counter()
    encoded = [layer.wait() for layer in _stage(serde, device_layers)]
    d2h_s = time.perf_counter() - t0
    wire_bytes = sum(layer.nbytes for layer in encoded)
    _log(f"compress ({backend_c}) {compress_s * 1e3:.2f} ms: "
         f"{(kv_bytes + wire_bytes) / compress_s / 1e9:.1f} GB/s; d2h {d2h_s * 1e3:.1f} ms "
         f"({wire_bytes / d2h_s / 1e9:.1f} GB/s; first, allocating: "
         f"{d2h_first_s * 1e3:.1f} ms)")
    # 3. loopback TCP
    wire_s, frame_bytes, received, timeline = _wire(
        serde, codec, args.codec, encoded, shape, dtype, args.connections, args.wire_peer,
        repeats, args.decode_threads, args.frame_bytes)
    _log(f"wire {wire_s:.3f} s: {frame_bytes * 8 / wire_s / 1e9:.2f} Gbit/s "
         f"(median of {repeats}; {args.connections} connections, {args.decode_threads} "
         f"decode threads, the sender in a {args.wire_peer} of its own); medians: first frame "
         f"{timeline['first_frame_s'] * 1e3:.0f} ms, last {timeline['last_frame_s'] * 1e3:.0f} "
         f"ms, anchor ready {timeline['anchor_ready_s'] * 1e3:.0f} ms, all handed on "
         f"{timeline['residual_ready_s'] * 1e3:.0f} ms")
    # 4. stage the received pages to the device, 5. decompress into the second cache
    staged = _stage_received(serde, received, dst)
    del staged
    t0 = time.perf_counter()
    staged = _stage_received(serde, received, dst)
    _sync(device)
    h2d_s = time.perf_counter() - t0
    decompress_s = timer(lambda: _apply(serde, staged, dst, dst_dev), device, repeats)
    _log(f"decompress ({backend_d}) {decompress_s * 1e3:.2f} ms: "
         f"{(kv_bytes + wire_bytes) / decompress_s / 1e9:.1f} GB/s; h2d {h2d_s * 1e3:.1f} ms")
    _apply(serde, staged, dst, dst_dev)
    _sync(device)
    checked = min(args.check_layers or layers, layers)
    exact = _check(codec, src, src_dev, dst, dst_dev, encoded, checked)
    _log(f"exact: {exact} ({checked} of {layers} layers checked)")

    out = {"device": device_name(device), "copy_gbps": copy, "tokens": tokens,
           "layers": layers, "kv_heads": heads, "head_dim": head_dim, "dtype": args.dtype,
           "layout": layout, "block_order": args.block_order, "block_size": block_size,
           "codec": args.codec, "compress_backend": backend_c, "decompress_backend": backend_d,
           "kv_bytes": kv_bytes, "wire_bytes": wire_bytes, "frame_bytes": frame_bytes,
           "compress_s": compress_s, "compress_gbps": (kv_bytes + wire_bytes) / compress_s / 1e9,
           "compress_kv_gbps": kv_bytes / compress_s / 1e9,
           "d2h_s": d2h_s, "d2h_gbps": wire_bytes / d2h_s / 1e9, "d2h_first_s": d2h_first_s,
           "wire_s": wire_s, "wire_gbps": frame_bytes * 8 / wire_s / 1e9,
           "connections": args.connections, "decode_threads": args.decode_threads,
           "max_frame_bytes": args.frame_bytes or SenderConfig.frame_bytes,
           "wire_timeline": timeline,
           # glibc's thresholds decide whether freed receive buffers go back to the OS (and
           # fault in again): docs/benchmarks.md, "Wire"
           "malloc_env": {k: v for k, v in os.environ.items() if k.startswith("MALLOC_")},
           "wire_peer": args.wire_peer, "h2d_s": h2d_s, "decompress_s": decompress_s,
           "decompress_gbps": (kv_bytes + wire_bytes) / decompress_s / 1e9,
           "decompress_kv_gbps": kv_bytes / decompress_s / 1e9,
           "exact": exact, "checked_layers": checked,
           "units": {"*_gbps": "GB/s read + written (device stages)",
                     "*_kv_gbps": "GB/s of KV", "wire_gbps": "Gbit/s of frame bytes"},
           "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}
    out["compress_vs_copy"] = out["compress_gbps"] / copy
    out["decompress_vs_copy"] = out["decompress_gbps"] / copy
    if device == "cpu":
        out["threads"] = torch.get_num_threads()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    print(json.dumps(out, indent=1))
    return 0 if exact else 1


def _compress(serde, cache, slots):
    """Every layer compressed on the device, as ``encode_layers`` does, not staged -> [the
    request's DeviceLayers] (one launch for all layers) or [(buffer, LayerWire, backend,
    flags)] per layer."""
    layers = serde.compress_layers(cache, slots)
    if layers is not None:
        return [layers]
    name, impl = serde._select(cache.device, cache.num_kv_heads, cache.head_size, cache.dtype)
    out = []
    for i in range(cache.num_layers):
        flags = serde._new_flags(impl, cache.device)
        out.append((*serde.compress_cache(cache.layer(i), slots, flags=flags), flags))
    return out


def _stage(serde, device_layers):
    """The wire pages of ``_compress``' output, staged to host memory (one copy each)."""
    for item in device_layers:
        if isinstance(item, tuple):
            yield serde.to_wire(*item)
        else:
            yield from serde.stage_layers(item)


def _stage_received(serde, received, cache):
    """The received pages on the device: one staging for all layers where one launch decodes
    them all, else one per layer."""
    h, d, dtype, dev = cache.num_kv_heads, cache.head_size, cache.dtype, cache.device
    _, impl = serde._select(dev, h, d, dtype)
    if serde._layered(impl, cache):
        flat = [(layer, p) for layer, ps in sorted(received.items()) for p in ps]
        return serde.stage([p for _, p in flat], dev, h, d, dtype,
                           layers=[layer for layer, _ in flat])
    return {layer: serde.stage(ps, dev, h, d, dtype) for layer, ps in received.items()}


def _apply(serde, staged, cache, slots):
    if not isinstance(staged, dict):
        return serde.apply_layers(staged, cache, slots)
    for layer, s in staged.items():
        serde.apply(s, paged(cache.layer(layer), slots), cache.num_kv_heads, cache.head_size)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="lynx bench datapath", description=__doc__.splitlines()[0])
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
