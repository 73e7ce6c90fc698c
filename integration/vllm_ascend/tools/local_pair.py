"""A Lynx prefill instance and a Lynx decode instance of vLLM on this machine, driven in-process.

This is what ``lynx demo`` and the end-to-end tests run. Each instance is a ``vllm.LLM`` (its
engine core and worker are child processes); KV moves between them over the built-in
split-stream transport on loopback, at an emulated link rate. A *transfer* submits the decode
request first (it waits for its KV) and then the prefill request with the same prompt; the
prefill instance's prefix cache makes every prompt after its first transfer cost one token.

Call from code guarded by ``if __name__ == "__main__":`` (vLLM starts its processes by spawn).
"""
from __future__ import annotations

import itertools
import os
import random
import socket
import threading
import time
from dataclasses import dataclass, field

from .engine_config import decode_engine_args, prefill_engine_args


def configure_cpu_threads() -> None:
    """Two vLLM instances on a few cores: one OpenMP thread each and no core pinning (vLLM's
    auto-binding pins both instances to the same cores, and its spin-waiting threads then
    halve decode speed)."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")


_MIN_PORT = 20000  # free_port picks from [_MIN_PORT, the ephemeral range)


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (Linux; 32768 elsewhere)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(host: str = "127.0.0.1", count: int = 1) -> int:
    """The first of ``count`` consecutive ports free now, below the ephemeral range: vLLM's
    engines take their own ports with bind(0), i.e. from that range, between our pick and our
    receiver's bind, so a port picked there can be handed to one, which then holds it only
    while it lives (the likely cause of a CI run's decode engine failing to start, with the
    port free again by the time ``port_taken`` looked)."""
    low = _ephemeral_low()
    rng = random.Random()
    for _ in range(256):
        if low - count <= _MIN_PORT:
            break
        base = rng.randrange(_MIN_PORT, low - count)
        if not any(port_taken(port, host) for port in range(base, base + count)):
            return base
    with socket.socket() as s:  # no room below the range: any free port
        s.bind((host, 0))
        return s.getsockname()[1]


def port_taken(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a TCP listener (or any socket) holds ``port`` now."""
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return True
        return False


_START_ATTEMPTS = 3  # decode instance starts, each on a fresh port if the last was taken


TRANSPORTS = ("tcp", "mooncake", "lmcache")


@dataclass(frozen=True)
class PairConfig:
    model: str
    gbps: float | None = 1.0           # emulated link rate, prefill -> decode
    transport: str = "tcp"             # "tcp" (the embedded split stream), "mooncake", "lmcache"
    lmcache_dir: str | None = None     # lmcache: the shared directory (None: a fresh one in
                                       # /dev/shm, removed on close)
    max_drafts: int = 64
    # the model's Lynx plan (lynx calibrate: Lynx codec parameters), given to both instances
    lynx_plan: dict | None = None
    residual_timeout_s: float = 30.0
    transfer_timeout_s: float = 600.0  # the decode side's deadline of a whole transfer
    early_start_s: float | None = None  # the decode connector's (None: its default)
    # float32 on CPU: vLLM-CPU's bf16 kernels compute a position differently in a multi-token
    # pass than in a one-token step, which breaks token-for-token equality of any speculative
    # decoding at near ties (docs/demo.md); float32 is also faster on CPUs without AVX512-BF16.
    dtype: str = "float32"
    # vLLM's KV block size (None: vLLM's default, 128 on the CPU; bfloat16 in blocks of a
    # multiple of 32 is then its AMX tile layout on CPUs with AMX, docs/deploy.md)
    block_size: int | None = None
    kv_cache_bytes: int = 512 << 20
    max_model_len: int = 8192
    max_num_seqs: int = 8              # requests each instance runs at once
    tensor_parallel_size: int = 1      # of each instance (decode rank r listens on port + r)
    # The KV crosses the link as 16-bit values, as in a bf16 deployment (the engines compute in
    # float32 only for the reason above); the codecs' scalars are then 16-bit too.
    wire_dtype: str | None = "bfloat16"
    # The decode instance keeps vLLM's statistics (the Lynx counters and gauges, read with
    # ``decode.get_metrics()``); the prefill's stay off, as one process has one metrics registry.
    decode_log_stats: bool = False

    def __post_init__(self):
        if self.gbps is not None and not self.gbps > 0:
            raise ValueError(f"{self.gbps=} must be > 0 or None")
        if self.transport not in TRANSPORTS:
            raise ValueError(f"{self.transport=} must be one of {TRANSPORTS}")
        if self.kv_cache_bytes < 16 << 20:
            raise ValueError(f"{self.kv_cache_bytes=} must be at least 16 MiB")
        if self.max_num_seqs < 1:
            raise ValueError(f"{self.max_num_seqs=} must be >= 1")
        if self.tensor_parallel_size < 1:
            raise ValueError(f"{self.tensor_parallel_size=} must be >= 1")
        if self.block_size is not None and not (self.block_size >= 1
                                                and self.block_size & (self.block_size - 1) == 0):
            raise ValueError(f"{self.block_size=} must be a power of two")


@dataclass
class TransferRun:
    """One request decoded from transferred KV, as a streaming client saw it."""

    codec: str
    tokens: list[int]
    arrivals: list[float]                   # monotonic time each token reached the client
    deltas: list[tuple[float, list[int]]]   # (arrival, tokens) of every streamed delta
    finish_reason: str | None
    stats: dict = field(default_factory=dict)  # the decode output's kv_transfer_params["lynx"]
    submitted_at: float = 0.0
    prefill_done_at: float | None = None
    link_gbps: float | None = None          # the emulated link's rate (None: not paced)

    @property
    def start(self) -> float:
        """Start of decoding: when the prefill instance began sending the KV, i.e. the first
        frame's arrival less its time on the paced link (a frame crosses it whole: counted from
        its arrival, a codec whose first frame is larger would start its clock later); the
        submission where no frame came."""
        first = self.stats.get("first_frame_at")
        if first is None:
            return self.submitted_at
        if self.link_gbps:
            first -= self.stats.get("first_frame_bytes", 0) * 8 / (self.link_gbps * 1e9)
        return first

    def time_to_token(self, k: int) -> float:
        """Seconds from the start of decoding to the k-th (1-based) token's generation; an
        accepted draft counts from when it was drafted (the paper's TTKT)."""
        times = self.stats.get("token_times") or self.arrivals
        return times[k - 1] - self.start

    def client_time_to_token(self, k: int) -> float:
        return self.arrivals[k - 1] - self.start


class LocalPair:
    def __init__(self, config: PairConfig, log=print):
        configure_cpu_threads()
        from vllm import LLM  # imported here: vLLM is optional for the rest of lynx_npu

        self.config, self.log = config, log
        self.link_gbps = config.gbps  # the emulated link's rate now (ttkt_sweep changes it)
        self.port = free_port(count=config.tensor_parallel_size)
        self._tmp_dir = None
        lmcache_dir = config.lmcache_dir
        if config.transport == "lmcache" and lmcache_dir is None:
            import tempfile
            shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
            lmcache_dir = self._tmp_dir = tempfile.mkdtemp(prefix="lynx-lmcache-", dir=shm)
        objects = {"lmcache_dir": lmcache_dir} if config.transport == "lmcache" else {}
        common = dict(dtype=config.dtype, kv_cache_memory_bytes=config.kv_cache_bytes,
                      max_model_len=config.max_model_len, enforce_eager=True, seed=0,
                      max_num_seqs=config.max_num_seqs, disable_log_stats=True,
                      tensor_parallel_size=config.tensor_parallel_size)
        if config.block_size is not None:
            common["block_size"] = config.block_size
        t0 = time.monotonic()

        def start_prefill(port: int):
            return LLM(**prefill_engine_args(config.model, peer=f"127.0.0.1:{port}",
                                             gbps=config.gbps, transport=config.transport,
                                             wire_dtype=config.wire_dtype,
                                             lynx_plan=config.lynx_plan, **objects, **common))

        # The two instances start side by side: most of a start is two processes importing
        # vLLM (~20 s each on one core), so a pair comes up in about the time of one instance.
        log(f"[lynx] starting the prefill instance (link {config.gbps} Gbps over "
            f"{config.transport}) ...")
        prefill = _Background(start_prefill, self.port)
        try:
            for attempt in range(1, _START_ATTEMPTS + 1):
                log(f"[lynx] starting the decode instance (receiver on 127.0.0.1:{self.port}) ...")
                try:
                    self.decode = LLM(**decode_engine_args(
                        config.model, port=self.port, max_drafts=config.max_drafts,
                        residual_timeout_s=config.residual_timeout_s,
                        transfer_timeout_s=config.transfer_timeout_s,
                        transport=config.transport, early_start_s=config.early_start_s,
                        gbps=config.gbps, lynx_plan=config.lynx_plan, **objects,
                        **{**common, "disable_log_stats": not config.decode_log_stats}))
                    break
                except Exception:
                    # The port was free when chosen; another process (vLLM's own engines pick
                    # ports the same way) may bind it before the receiver does. Only that is
                    # retried, on a new port; any other failure is raised as it is.
                    if attempt == _START_ATTEMPTS or not port_taken(self.port):
                        raise
                    log(f"[lynx] 127.0.0.1:{self.port} was taken before the receiver bound "
                        f"it; retrying on another port")
                    self.port = free_port(count=config.tensor_parallel_size)
        except BaseException:
            _shutdown(prefill.result(raise_error=False))
            raise
        try:
            self.prefill = prefill.result()
        except BaseException:
            _shutdown(self.decode)
            raise
        if prefill.args != (self.port,):  # the receiver moved: the prefill's peer with it
            _shutdown(self.prefill)
            self.prefill = start_prefill(self.port)
        log(f"[lynx] both instances up in {time.monotonic() - t0:.0f} s")
        self.tokenizer = self.prefill.get_tokenizer()
        self._ids = itertools.count(int(time.time()) % 1_000_000 * 1000 + 1)

    def run(self, prompt: list[int], codec: str, *, max_tokens: int = 64,
            ignore_eos: bool = True, stop_token_ids: list[int] | None = None,
            drop_residual: bool = False, max_drafts: int | None = None,
            temperature: float = 0.0, seed: int | None = None,
            json_schema: dict | None = None) -> TransferRun:
        """Prefill ``prompt`` on the prefill instance, move its KV with ``codec`` and decode it
        on the decode instance (greedily unless ``temperature`` > 0; under ``json_schema``'s
        grammar if given)."""
        return self.run_many([prompt], codec, max_tokens=max_tokens, ignore_eos=ignore_eos,
                             stop_token_ids=stop_token_ids, drop_residual=drop_residual,
                             max_drafts=max_drafts, temperature=temperature, seeds=[seed],
                             json_schema=json_schema)[0]

    def run_many(self, prompts: list[list[int]], codec: str, *, max_tokens: int = 64,
                 ignore_eos: bool = True, stop_token_ids: list[int] | None = None,
                 drop_residual: bool = False, max_drafts: int | None = None,
                 temperature: float = 0.0, seeds: list[int | None] | None = None,
                 json_schema: dict | None = None) -> list[TransferRun]:
        """:meth:`run` for several transfers at once: every request is submitted to both
        instances before the first step, so they share the link (each in its own transfer)
        and the decode instance's batches; request i samples with ``seeds[i]``."""
        seeds = [None] * len(prompts) if seeds is None else list(seeds)
        if len(seeds) != len(prompts):
            raise ValueError(f"{len(seeds)=} must equal {len(prompts)=}")
        jobs = []
        for prompt, seed in zip(prompts, seeds):
            tid = next(self._ids)
            decode_params = {"transfer_id": tid}
            if max_drafts is not None:
                decode_params["max_drafts"] = max_drafts
            prefill_params = {"transfer_id": tid, "codec": codec}
            if drop_residual:
                prefill_params["drop_residual"] = True
            jobs.append((prompt, seed, decode_params, prefill_params))
        return self._run(codec, jobs, max_tokens, ignore_eos, stop_token_ids, temperature,
                         json_schema)

    def run_local(self, prompt: list[int], *, max_tokens: int = 64, ignore_eos: bool = True,
                  stop_token_ids: list[int] | None = None,
                  json_schema: dict | None = None) -> TransferRun:
        """Decode ``prompt`` on the decode instance alone (local prefill, no transfer)."""
        return self._run("local", [(prompt, None, None, None)], max_tokens, ignore_eos,
                         stop_token_ids, 0.0, json_schema)[0]

    def _run(self, codec, jobs, max_tokens, ignore_eos, stop_token_ids,
             temperature, json_schema=None) -> list[TransferRun]:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

        def params(n, lynx, temp=0.0, seed=None, grammar=None):
            extra = {"kv_transfer_params": {"lynx": lynx}} if lynx else None
            structured = StructuredOutputsParams(json=grammar) if grammar else None
            return SamplingParams(temperature=temp, seed=seed, max_tokens=n,
                                  ignore_eos=ignore_eos, stop_token_ids=stop_token_ids,
                                  output_kind=RequestOutputKind.DELTA, extra_args=extra,
                                  structured_outputs=structured)

        dec, pre = self.decode.llm_engine, self.prefill.llm_engine
        runs = {}
        for prompt, seed, decode_params, prefill_params in jobs:
            rid = f"{codec}-{next(self._ids)}"
            runs[f"d-{rid}"] = run = TransferRun(codec, [], [], [], None,
                                                 submitted_at=time.monotonic(),
                                                 link_gbps=self.link_gbps)
            runs[f"p-{rid}"] = run
            dec.add_request(f"d-{rid}", {"prompt_token_ids": list(prompt)},
                            params(max_tokens, decode_params, temperature, seed, json_schema))
            if prefill_params is not None:
                pre.add_request(f"p-{rid}", {"prompt_token_ids": list(prompt)},
                                params(1, prefill_params))
        # step() blocks until its engine has output: step the prefill instance only while it
        # has work (its output arrives when the prompt is computed and the KV handed off).
        while dec.has_unfinished_requests() or pre.has_unfinished_requests():
            if pre.has_unfinished_requests():
                for out in pre.step():
                    if out.finished:
                        runs[out.request_id].prefill_done_at = time.monotonic()
            if dec.has_unfinished_requests():
                for out in dec.step():
                    run, now = runs[out.request_id], time.monotonic()
                    new = list(out.outputs[0].token_ids)
                    if new:
                        run.deltas.append((now, new))
                        run.tokens += new
                        run.arrivals += [now] * len(new)
                    if out.finished:
                        run.finish_reason = out.outputs[0].finish_reason
                        run.stats = dict((out.kv_transfer_params or {}).get("lynx", {}))
        return [runs[rid] for rid in runs if rid.startswith("d-")]

    def close(self) -> None:
        # side by side: each engine's shutdown waits ~5 s for its processes
        stopping = [_Background(_shutdown, llm) for llm in
                    (getattr(self, "prefill", None), getattr(self, "decode", None))]
        for job in stopping:
            job.result()
        if getattr(self, "_tmp_dir", None) is not None:
            import shutil
            shutil.rmtree(self._tmp_dir, ignore_errors=True)
            self._tmp_dir = None


def _shutdown(llm) -> None:
    if llm is not None:
        llm.llm_engine.engine_core.shutdown()


class _Background:
    """``fn(*args)`` on a thread of its own; ``result()`` joins it and returns or raises."""

    def __init__(self, fn, *args):
        self.args, self._value, self._error = args, None, None
        self._thread = threading.Thread(target=self._run, args=(fn,), daemon=True,
                                        name="lynx-pair-start")
        self._thread.start()

    def _run(self, fn) -> None:
        try:
            self._value = fn(*self.args)
        except BaseException as e:  # noqa: BLE001 -- handed to result()'s caller
            self._error = e

    def result(self, raise_error: bool = True):
        self._thread.join()
        if self._error is not None and raise_error:
            raise self._error
        return self._value


# -- test hooks: run on an instance's workers with ``llm.collective_rpc(fn)`` (the worker
# processes must be started with VLLM_ALLOW_INSECURE_SERIALIZATION=1 to take a function) -------
def decode_worker_state(worker) -> dict:
    """What a decode worker holds for Lynx (ConsumerWorker.leak_state), its ``lynx*`` threads,
    the output tokens its model runner holds per request (drafts included), the cache's
    (block size, blocks) and the receiver-slot gauge its connector reports to vLLM's stats."""
    from vllm.distributed.kv_transfer import get_kv_transfer_group

    consumer = get_kv_transfer_group().worker
    state = consumer.leak_state()
    state["threads"] = lynx_threads(worker)
    state["gauge"] = get_kv_transfer_group().get_kv_connector_stats().data.get(
        "receiver_active_requests")
    state["runner"] = {rid: len(r.output_token_ids)
                       for rid, r in worker.model_runner.requests.items()}
    kv = consumer.kv
    state["cache"] = None if kv is None else (kv.block_size, kv.layer(0).num_blocks)
    return state


def lynx_threads(worker) -> list[str]:
    """The live ``lynx*`` threads of a worker process (either instance)."""
    import threading

    return sorted(t.name for t in threading.enumerate()
                  if t.name.startswith("lynx") and t.is_alive())


def restart_prefill_transport(worker) -> int:
    """Close a prefill worker's senders now (a transfer in flight fails on its side, the
    connection to the receiver drops), as its transport dying would; the next request opens
    a new sender, as a restarted prefill would. Returns how many senders were closed."""
    from vllm.distributed.kv_transfer import get_kv_transfer_group

    return get_kv_transfer_group().worker.restart_transport()
