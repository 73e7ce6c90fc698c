"""Numbers, table, JSON and plot of ``lynx bench ttkt`` (the scaling sweep of docs/demo.md).

Pure functions over measured runs; nothing here starts an engine. A *record* is one transfer
of one prompt at one link rate with one codec (:func:`record`); a *cell* is the medians of the
records of one (length, rate, mode) (:func:`cells`). Lynx's gain over int8 is int8's time
minus lynx's (positive: lynx is faster), as in the paper's Fig. 11. Where the gain changes
sign between two link rates the crossing is interpolated linearly in log10(rate), since the
rates are spaced geometrically.
"""
from __future__ import annotations

import json
import math
import statistics

# Stage times of a run, seconds from the start of decoding (first KV frame at the decode
# instance); the stats keys are the decode connector's (decode_state.LynxDecodeRequest.stats).
STAGES = (("anchor_s", "anchor_ready_at"), ("loaded_s", "loaded_at"),
          ("residual_s", "residual_ready_at"), ("refined_s", "refined_at"),
          ("verified_s", "verified_at"))
TIMES = ("ttft_s", "tt32_s", "tt64_s", "client_ttft_s", "client_tt32_s", "client_tt64_s")
GAIN_METRICS = ("ttft", "tt32", "tt64", "client_tt64")
BASELINE, LYNX = "int8", "lynx"


def record(run, *, length: int, gbps: float, prompt: int, prompt_tokens: int,
           prefill_s: float | None = None) -> dict:
    """One TransferRun (local_pair) as a flat dict of times from the start of decoding."""
    n = len(run.tokens)
    if n == 0:
        raise ValueError(f"{run.codec} run of prompt {prompt} ({length} tokens, {gbps} Gbps) "
                         f"produced no tokens")
    k32, k64 = min(32, n), min(64, n)
    out = {"length": int(length), "gbps": float(gbps), "mode": run.codec, "prompt": int(prompt),
           "prompt_tokens": int(prompt_tokens), "tokens": n, "ttft_s": run.time_to_token(1), "tt32_s": run.time_to_token(k32),
           "tt64_s": run.time_to_token(k64), "client_ttft_s": run.client_time_to_token(1),
           "client_tt32_s": run.client_time_to_token(k32),
           "client_tt64_s": run.client_time_to_token(k64),
           "wait_s": run.start - run.submitted_at,  # submission to the KV's send (not in TTKT)
           # mean decode step after the first token (drafts and verification included)
           "step_s": ((run.time_to_token(k64) - run.time_to_token(1)) / (k64 - 1)
                      if k64 > 1 else None),
           "drafts_proposed": int(run.stats.get("drafts_proposed", 0)),
           "drafts_accepted": int(run.stats.get("drafts_accepted", 0)),
           "prefill_s": prefill_s}
    for name, key in STAGES:
        at = run.stats.get(key)
        out[name] = None if at is None else at - run.start
    return out


def cells(records: list[dict]) -> list[dict]:
    """Medians over prompts per (length, rate, mode), in first-seen order."""
    groups: dict[tuple, list[dict]] = {}
    for r in records:
        groups.setdefault((r["length"], r["gbps"], r["mode"]), []).append(r)
    out = []
    for (length, gbps, mode), rs in groups.items():
        cell = {"length": length, "gbps": gbps, "mode": mode, "prompts": len(rs),
                "prompt_tokens": _median(r.get("prompt_tokens") for r in rs)}
        for name in TIMES + ("wait_s", "step_s") + tuple(s for s, _ in STAGES):
            cell[name] = _median(r[name] for r in rs)
        cell["drafts_accepted"] = _median(r["drafts_accepted"] for r in rs)
        cell["drafts_proposed"] = _median(r["drafts_proposed"] for r in rs)
        out.append(cell)
    return out


def gains(cell_list: list[dict]) -> list[dict]:
    """Lynx's gain over int8 per (length, rate): int8 time - lynx time, and lynx / int8."""
    by = {(c["length"], c["gbps"], c["mode"]): c for c in cell_list}
    out = []
    for (length, gbps, mode), base in by.items():
        lynx = by.get((length, gbps, LYNX))
        if mode != BASELINE or lynx is None:
            continue
        row = {"length": length, "gbps": gbps}
        for m in GAIN_METRICS:
            row[f"{m}_gain_s"] = base[f"{m}_s"] - lynx[f"{m}_s"]
            row[f"{m}_ratio"] = lynx[f"{m}_s"] / base[f"{m}_s"] if base[f"{m}_s"] > 0 \
                else float("nan")
        out.append(row)
    return sorted(out, key=lambda r: (r["length"], r["gbps"]))


def crossings(gain_rows: list[dict], metric: str = "tt64") -> list[dict]:
    """Per length, the link rates (Gbps) where the ``metric`` gain crosses zero, interpolated
    in log10(rate) between the two measured rates around each sign change."""
    if metric not in GAIN_METRICS:
        raise ValueError(f"{metric=} must be one of {GAIN_METRICS}")
    out = []
    for length in sorted({r["length"] for r in gain_rows}):
        pts = sorted((r["gbps"], r[f"{metric}_gain_s"]) for r in gain_rows
                     if r["length"] == length)
        at = []
        for (r0, g0), (r1, g1) in zip(pts, pts[1:]):
            if g0 == 0:
                at.append(r0)
            elif g0 * g1 < 0:
                x0, x1 = math.log10(r0), math.log10(r1)
                at.append(10 ** (x0 + (x1 - x0) * g0 / (g0 - g1)))
        if pts and pts[-1][1] == 0:
            at.append(pts[-1][0])
        signs = {math.copysign(1, g) for _, g in pts if g != 0}
        if at:
            where = "crosses zero"
        elif signs == {1.0}:
            where = "positive at every rate"
        elif signs == {-1.0}:
            where = "negative at every rate"
        else:
            where = "zero at every rate"
        out.append({"length": length, "metric": metric, "crossing_gbps": at, "where": where})
    return out


def fig11_check(gain_rows: list[dict]) -> dict:
    """The paper's Fig. 11 claim on this sweep: Lynx's TT64 gain at the longest context and
    the slowest link against the gain at the shortest context and the fastest link."""
    if not gain_rows:
        raise ValueError("no (length, rate) has both an int8 and a lynx cell")
    lengths = [r["length"] for r in gain_rows]
    rates = [r["gbps"] for r in gain_rows]
    by = {(r["length"], r["gbps"]): r for r in gain_rows}
    long_slow = by.get((max(lengths), min(rates)))
    short_fast = by.get((min(lengths), max(rates)))
    if long_slow is None or short_fast is None:
        raise ValueError("the corner cells (longest/slowest, shortest/fastest) are missing")
    a, b = long_slow["tt64_gain_s"], short_fast["tt64_gain_s"]
    return {"long_slow": {"length": max(lengths), "gbps": min(rates), "tt64_gain_s": a},
            "short_fast": {"length": min(lengths), "gbps": max(rates), "tt64_gain_s": b},
            "larger_at_long_slow": bool(a > b)}


def summarize(records: list[dict], meta: dict) -> dict:
    """The JSON document: ``meta`` (command settings, start-up time), every record, the cells,
    the gains, the zero crossings of the TT64 and TTFT gains, and the Fig. 11 check."""
    cell_list = cells(records)
    gain_rows = gains(cell_list)
    return {**meta, "records": records, "cells": cell_list, "gains": gain_rows,
            "crossings": crossings(gain_rows, "tt64") + crossings(gain_rows, "ttft"),
            "fig11": fig11_check(gain_rows) if gain_rows else None}


def write_json(path, doc: dict) -> None:
    with open(path, "w") as f:
        json.dump(doc, f, indent=1, allow_nan=True)
        f.write("\n")


def table(doc: dict) -> str:
    """Per (length, rate): every mode's TTFT / TT64 (client TT64), then lynx's gain."""
    modes = list(dict.fromkeys(c["mode"] for c in doc["cells"]))
    by = {(c["length"], c["gbps"], c["mode"]): c for c in doc["cells"]}
    gain = {(g["length"], g["gbps"]): g for g in doc["gains"]}
    head = (f"{'tokens':>6} {'Gbps':>6} " + " ".join(f"{m + ' TTFT/TT64':>20}" for m in modes)
            + f" {'gain TTFT':>9} {'gain TT64':>9} {'TT64 ratio':>10}")
    lines = [head, "-" * len(head)]
    for length, gbps in dict.fromkeys((c["length"], c["gbps"]) for c in doc["cells"]):
        cols = []
        for m in modes:
            c = by.get((length, gbps, m))
            cols.append(f"{c['ttft_s']:9.2f}/{c['tt64_s']:<10.2f}" if c else f"{'-':>20}")
        g = gain.get((length, gbps))
        tail = (f" {g['ttft_gain_s']:+9.2f} {g['tt64_gain_s']:+9.2f} {g['tt64_ratio']:10.2f}"
                if g else "")
        lines.append(f"{length:>6} {gbps:>6g} " + " ".join(cols) + tail)
    return "\n".join(lines)


def crossing_lines(doc: dict) -> list[str]:
    lines = []
    for c in doc["crossings"]:
        at = ", ".join(f"{x:.3g} Gbps" for x in c["crossing_gbps"])
        lines.append(f"{c['metric'].upper()} gain at {c['length']} tokens: {c['where']}"
                     + (f" at {at}" if at else ""))
    f = doc.get("fig11")
    if f:
        ls, sf = f["long_slow"], f["short_fast"]
        lines.append(f"Fig. 11 check: TT64 gain {ls['tt64_gain_s']:+.2f} s at {ls['length']} "
                     f"tokens / {ls['gbps']:g} Gbps vs {sf['tt64_gain_s']:+.2f} s at "
                     f"{sf['length']} tokens / {sf['gbps']:g} Gbps: "
                     f"{'larger' if f['larger_at_long_slow'] else 'NOT larger'} at the long, "
                     f"slow corner")
    return lines


def plot(path, doc: dict, title: str = "") -> None:
    """Fig. 11's two panels, for the TT64 gain (top) and the TTFT gain (bottom): gain vs
    context length (a line per rate) and vs link rate (a line per length, log axis)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = doc["gains"]
    lengths = sorted({r["length"] for r in rows})
    rates = sorted({r["gbps"] for r in rows})
    fig, axes = plt.subplots(2, 2, figsize=(10, 7.6))
    for (left, right), metric in zip(axes, ("tt64", "ttft")):
        by = {(r["length"], r["gbps"]): r[f"{metric}_gain_s"] for r in rows}
        for gbps in rates:
            xs = [n for n in lengths if (n, gbps) in by]
            left.plot(xs, [by[(n, gbps)] for n in xs], marker="o", label=f"{gbps:g} Gbps")
        for n in lengths:
            xs = [g for g in rates if (n, g) in by]
            right.plot(xs, [by[(n, g)] for g in xs], marker="o", label=f"{n} tokens")
        right.set_xscale("log")
        left.set_xlabel("context length (prompt tokens)")
        right.set_xlabel("link rate (Gbit/s)")
        for ax in (left, right):
            ax.axhline(0, color="0.5", lw=0.8)
            ax.set_ylabel(f"{metric.upper()} gain over int8 (s)")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _median(values) -> float | None:
    vals = [v for v in values if v is not None]
    return float(statistics.median(vals)) if vals else None
