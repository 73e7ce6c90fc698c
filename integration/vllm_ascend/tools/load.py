"""A serving load test of a Lynx deployment, through its proxy, as clients see it.

    python -m lynx_npu.integration.vllm_ascend.tools.load --proxy http://127.0.0.1:8000 \\
        --decode http://127.0.0.1:8200 --model DIR --requests 16 --abort-fraction 0.25 --json OUT

For each mode (``--modes``, default ``int8,lynx``): every prompt is first answered alone, one
request at a time, with the mode's full-cache reference codec (``lynx`` -> ``lynx-int8``, which
decodes the same 8-bit KV without drafting; a one-stream codec -> itself); then all
``--requests`` are sent at once as streaming chat requests (mixed prompt lengths: QMSum meetings
cut to each of ``--prompt-tokens`` in turn) and a share of them, ``--abort-fraction``, is
abandoned by its client after a random delay (the proxy aborts the upstream requests), so
requests arrive while others wait for their KV, draft or verify, and are aborted in each of
those phases. Checked and reported per mode:

* every completed answer equals its reference (greedy, ``ignore_eos``, ``--max-tokens``);
* afterwards both servers hold nothing: ``vllm:num_requests_running`` and ``_waiting`` are 0,
  ``vllm:kv_cache_usage_perc`` is 0 and, where the server exports it (a Lynx decode server),
  ``vllm:lynx_receiver_active_requests`` is 0 on their ``/metrics`` (polled up to
  ``--settle-s``), and they are healthy;
* requests, completed / aborted, output tokens per second, client-visible TTFT and TT32 (the
  32nd token; chunks carry ``usage`` with ``continuous_usage_stats``) p50 / p95.

Exit status 1 if any check fails. The JSON is ``{"modes": [{"mode", "requests", "completed",
"aborted", "mismatches", "tokens_per_s", "ttft_p50_s", "ttft_p95_s", "tt32_p50_s", "tt32_p95_s",
"released", "wall_s"}], ...}``.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import sys
import time
from dataclasses import asdict, dataclass

from lynx_npu.cli_types import int_in, names, number_in, optional_output_file

REFERENCE = {"lynx": "lynx-int8"}   # a mode's full-cache reference codec (others: itself)
GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")
# Exported by a Lynx decode server once its workers have reported (integration stats.GAUGES)
OPTIONAL_GAUGES = ("vllm:lynx_receiver_active_requests",)


@dataclass
class Outcome:
    index: int
    aborted: bool = False
    text: str = ""
    tokens: int = 0
    ttft_s: float | None = None
    tt32_s: float | None = None
    error: str = ""


@dataclass
class ModeReport:
    mode: str
    requests: int
    completed: int
    aborted: int
    errors: list[str]
    mismatches: list[int]          # indices of completed answers unequal to their reference
    tokens_per_s: float
    ttft_p50_s: float | None
    ttft_p95_s: float | None
    tt32_p50_s: float | None
    tt32_p95_s: float | None
    released: bool                 # both servers back to no requests and no cache blocks
    servers_after: dict
    wall_s: float

    @property
    def ok(self) -> bool:
        return not self.errors and not self.mismatches and self.released


def _say(message: str) -> None:
    print(f"[lynx load] {message}", file=sys.stderr, flush=True)


def percentile(values: list[float], q: float) -> float | None:
    """The q-quantile (0..1) by linear interpolation; None for no values."""
    if not values:
        return None
    xs = sorted(values)
    pos = q * (len(xs) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def parse_gauges(metrics: str) -> dict[str, float]:
    """The sum over label sets of each of :data:`GAUGES` (and of :data:`OPTIONAL_GAUGES`
    present) in a Prometheus text page."""
    out = {}
    for name in GAUGES + OPTIONAL_GAUGES:
        values = re.findall(rf"^{re.escape(name)}(?:{{[^}}]*}})? ([0-9.eE+-]+)$", metrics, re.M)
        if not values:
            if name in OPTIONAL_GAUGES:
                continue
            raise ValueError(f"{name} is missing from /metrics")
        out[name] = sum(float(v) for v in values)
    return out


class Client:
    def __init__(self, session, proxy: str, model: str, max_tokens: int):
        self.session, self.proxy, self.model, self.max_tokens = session, proxy, model, max_tokens

    def body(self, content: str, codec: str, stream: bool) -> dict:
        body = {"model": self.model, "max_tokens": self.max_tokens, "temperature": 0.0,
                "ignore_eos": True, "messages": [{"role": "user", "content": content}],
                "kv_transfer_params": {"lynx": {"codec": codec}}}
        if stream:
            body.update(stream=True, stream_options={"include_usage": True,
                                                     "continuous_usage_stats": True})
        return body

    async def answer(self, content: str, codec: str) -> str:
        async with self.session.post(f"{self.proxy}/v1/chat/completions",
                                     json=self.body(content, codec, False)) as r:
            data = await r.json()
            if r.status != 200:
                raise RuntimeError(f"reference request failed ({r.status}): {data}")
            return data["choices"][0]["message"]["content"]

    async def stream(self, out: Outcome, content: str, codec: str, t0: float) -> None:
        """One streaming request; fills ``out`` as chunks arrive (cancelled = aborted)."""
        async with self.session.post(f"{self.proxy}/v1/chat/completions",
                                     json=self.body(content, codec, True)) as r:
            if r.status != 200:
                out.error = f"request {out.index}: HTTP {r.status}: {(await r.text())[:300]}"
                return
            async for raw in r.content:
                line = raw.decode().strip()
                if not line.startswith("data:") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[len("data:"):])
                now = time.monotonic() - t0
                for choice in chunk.get("choices") or ():
                    text = (choice.get("delta") or {}).get("content") or ""
                    if text and out.ttft_s is None:
                        out.ttft_s = now
                    out.text += text
                usage = chunk.get("usage")
                if usage:
                    out.tokens = usage["completion_tokens"]
                    if out.tt32_s is None and out.tokens >= 32:
                        out.tt32_s = now


async def _gauges(session, url: str) -> dict[str, float]:
    async with session.get(f"{url}/metrics") as r:
        return parse_gauges(await r.text())


async def _settled(session, servers: list[str], settle_s: float) -> tuple[bool, dict]:
    """Poll until every server holds no request and no block, or ``settle_s`` passes."""
    deadline = time.monotonic() + settle_s
    while True:
        after = {url: await _gauges(session, url) for url in servers}
        if all(not any(g.values()) for g in after.values()):
            return True, after
        if time.monotonic() > deadline:
            return False, after
        await asyncio.sleep(0.5)


async def run_mode(client: Client, mode: str, prompts: list[str], args, rng) -> ModeReport:
    session = client.session
    reference_codec = REFERENCE.get(mode, mode)
    unique = list(dict.fromkeys(prompts))
    _say(f"{mode}: {len(unique)} references with {reference_codec}, one at a time ...")
    references = {}
    for i, content in enumerate(unique):
        references[content] = await client.answer(content, reference_codec)
        _say(f"{mode}: reference {i + 1}/{len(unique)}")
    outcomes = [Outcome(i) for i in range(len(prompts))]
    aborting = set(rng.sample(range(len(prompts)), round(args.abort_fraction * len(prompts))))
    _say(f"{mode}: {len(prompts)} concurrent streaming requests, {len(aborting)} to abort ...")
    t0 = time.monotonic()

    async def one(out: Outcome, content: str) -> None:
        task = asyncio.ensure_future(client.stream(out, content, mode, t0))
        if out.index in aborting:
            done, _ = await asyncio.wait({task}, timeout=rng.uniform(0.0, args.abort_within_s))
            if not done:
                task.cancel()      # the client leaves: its connection to the proxy closes
                out.aborted = True
        try:
            await task
        except asyncio.CancelledError:
            pass
        except Exception as e:  # noqa: BLE001 - reported, not raised: the others go on
            out.error = f"request {out.index}: {type(e).__name__}: {e}"

    await asyncio.gather(*(one(o, c) for o, c in zip(outcomes, prompts)))
    wall = time.monotonic() - t0
    released, after = await _settled(session, [args.decode, args.prefill], args.settle_s)
    done = [o for o in outcomes if not o.aborted and not o.error]
    report = ModeReport(
        mode=mode, requests=len(prompts), completed=len(done),
        aborted=sum(o.aborted for o in outcomes),
        errors=[o.error for o in outcomes if o.error],
        mismatches=[o.index for o in done if o.text != references[prompts[o.index]]],
        tokens_per_s=sum(o.tokens for o in done) / wall,
        ttft_p50_s=percentile([o.ttft_s for o in done if o.ttft_s is not None], 0.5),
        ttft_p95_s=percentile([o.ttft_s for o in done if o.ttft_s is not None], 0.95),
        tt32_p50_s=percentile([o.tt32_s for o in done if o.tt32_s is not None], 0.5),
        tt32_p95_s=percentile([o.tt32_s for o in done if o.tt32_s is not None], 0.95),
        released=released, servers_after=after, wall_s=wall)
    _say(f"{mode}: {report.completed} completed, {report.aborted} aborted, "
         f"{len(report.mismatches)} unequal to the reference, {len(report.errors)} errors, "
         f"{report.tokens_per_s:.1f} tokens/s, released={released}")
    return report


def load_contents(model: str, num: int, distinct: int, lengths: list[int],
                  data: str | None) -> list[str]:
    """``num`` chat prompts, ``distinct`` of them different (repeated in turn): QMSum meetings
    cut to each of ``lengths`` tokens in turn."""
    from transformers import AutoTokenizer

    from .demo_data import load_prompts
    tokenizer = AutoTokenizer.from_pretrained(model)
    distinct = min(distinct, num)
    per_length = {n: load_prompts(tokenizer, -(-distinct // len(lengths)), n, data)
                  for n in lengths}
    unique = [per_length[lengths[i % len(lengths)]][i // len(lengths)].content
              for i in range(distinct)]
    return [unique[i % distinct] for i in range(num)]


async def _main(args) -> list[ModeReport]:
    from aiohttp import ClientSession, ClientTimeout

    lengths = [int(x) for x in args.prompt_tokens.split(",")]
    contents = load_contents(args.model, args.requests, args.distinct_prompts or args.requests,
                             lengths, args.data)
    rng = random.Random(args.seed)
    async with ClientSession(timeout=ClientTimeout(total=args.timeout_s)) as session:
        client = Client(session, args.proxy, args.model, args.max_tokens)
        return [await run_mode(client, mode.strip(), contents, args, rng)
                for mode in args.modes.split(",")]


def _codecs() -> list[str]:
    import lynx_npu
    return lynx_npu.list_codecs()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--proxy", default="http://127.0.0.1:8000")
    parser.add_argument("--prefill", default="http://127.0.0.1:8100")
    parser.add_argument("--decode", default="http://127.0.0.1:8200")
    parser.add_argument("--model", required=True, help="the served model (its directory)")
    parser.add_argument("--modes", type=names(_codecs, "codec"), default="int8,lynx",
                        help="codecs, comma-separated (default int8,lynx)")
    parser.add_argument("--requests", type=int_in(1, 1024), default=16)
    parser.add_argument("--distinct-prompts", type=int_in(1, 1024), default=None,
                        help="different prompts among the requests (default: all)")
    parser.add_argument("--prompt-tokens", default="300,800,1400",
                        help="prompt lengths used in turn (comma-separated)")
    parser.add_argument("--max-tokens", type=int_in(1, 4096), default=32)
    parser.add_argument("--abort-fraction", type=number_in(0.0, 1.0), default=0.25)
    parser.add_argument("--abort-within-s", type=number_in(0.0, 600.0), default=8.0,
                        help="an abandoned request is dropped at a random time in [0, this]")
    parser.add_argument("--settle-s", type=number_in(0.0, 600.0), default=30.0)
    parser.add_argument("--timeout-s", type=number_in(1.0, 86400.0), default=1800.0)
    parser.add_argument("--seed", type=int_in(0, 2**32 - 1), default=0)
    parser.add_argument("--data", default=None, help="QMSum val.jsonl (default: demo_data's)")
    parser.add_argument("--json", type=optional_output_file, default=None)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    for n in args.prompt_tokens.split(","):
        if not n.strip().isdigit() or not 64 <= int(n) <= 32768:
            parser.error(f"--prompt-tokens {args.prompt_tokens!r}: each a length in [64, 32768]")
    reports = asyncio.run(_main(args))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"modes": [asdict(r) for r in reports], "requests": args.requests,
                       "max_tokens": args.max_tokens, "prompt_tokens": args.prompt_tokens,
                       "abort_fraction": args.abort_fraction}, f, indent=1)
    for r in reports:
        print(f"{r.mode:10s} completed {r.completed}/{r.requests} aborted {r.aborted} "
              f"unequal {len(r.mismatches)} errors {len(r.errors)} {r.tokens_per_s:.1f} tok/s "
              f"TTFT p50/p95 {r.ttft_p50_s} / {r.ttft_p95_s} s, TT32 p50/p95 {r.tt32_p50_s} / "
              f"{r.tt32_p95_s} s, released {r.released}")
    return 0 if all(r.ok for r in reports) else 1


if __name__ == "__main__":
    sys.exit(main())
