"""Summaries of ``lynx eval quality``: each codec's metric with its bootstrap interval, its
paired difference from the ``bf16`` baseline, the table on stdout and the plot."""
from __future__ import annotations

import pathlib

from .bootstrap import BootstrapConfig, interval, paired_difference, perplexity

BASELINE = "bf16"
# task -> (metric name, higher is better, transform of the mean per-sample score)
METRICS = {"ppl": ("perplexity", False, perplexity), "needle": ("rouge_l_f", True, None),
           "qmsum": ("rouge_l_f", True, None), "mmlu": ("accuracy", True, None)}


def summarize(task: str, samples: list[dict], labels: list[str],
              config: BootstrapConfig) -> dict:
    """{label: {value, low, high, diff_vs_bf16: {value, low, high} | None, within_noise,
    in_bf16_interval}}; the last three None without a bf16 baseline."""
    _, _, transform = METRICS[task]
    scores = {label: [s["scores"][label] for s in samples] for label in labels}
    out = {}
    for label in labels:
        iv = interval(scores[label], transform, config)
        row = {"value": iv.value, "low": iv.low, "high": iv.high,
               "diff_vs_bf16": None, "within_noise": None, "in_bf16_interval": None}
        if BASELINE in scores:
            d = paired_difference(scores[label], scores[BASELINE], transform, config)
            base = interval(scores[BASELINE], transform, config)
            row["diff_vs_bf16"] = {"value": d.value, "low": d.low, "high": d.high}
            row["within_noise"] = d.contains(0.0)  # the paired test: "within noise"
            row["in_bf16_interval"] = base.contains(iv.value)  # the looser reading
        out[label] = row
    return out


def outside_noise(report: dict) -> dict[str, list[str]]:
    """{codec: [tasks where its paired difference from bf16 excludes 0]}."""
    out: dict[str, list[str]] = {}
    for task, info in report["tasks"].items():
        for label, row in info["results"].items():
            if row["within_noise"] is False:
                out.setdefault(label, []).append(task)
    return out


def _fmt(x: float) -> str:
    return f"{x:.4g}" if abs(x) >= 1000 else f"{x:.3f}"


def _columns(rows: list[list[str]]) -> list[str]:
    """Left-aligned first column, the rest right-aligned, two spaces apart."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                      for i, (c, w) in enumerate(zip(r, widths))).rstrip() for r in rows]


def format_table(report: dict) -> str:
    lines = []
    for task, info in report["tasks"].items():
        metric = info["metric"]
        head = (f"{task}: {metric} ({'higher' if info['higher_is_better'] else 'lower'} is "
                f"better), {info['num_samples']} samples of {info['tokens_min']}-"
                f"{info['tokens_max']} tokens, {report['model']}, 95% bootstrap intervals")
        if "chance" in info:
            head += f"; chance {info['chance']:.3f}"
        rows = [["codec", metric, "interval", "- bf16", "paired interval", "in bf16 CI",
                 "paired diff"]]
        for label, r in info["results"].items():
            d = r["diff_vs_bf16"]
            rows.append([label, _fmt(r["value"]), f"[{_fmt(r['low'])}, {_fmt(r['high'])}]",
                         f"{d['value']:+.3f}" if d else "",
                         f"[{d['low']:+.3f}, {d['high']:+.3f}]" if d else "",
                         "" if r["in_bf16_interval"] is None
                         else ("yes" if r["in_bf16_interval"] else "no"),
                         "" if r["within_noise"] is None
                         else ("within noise" if r["within_noise"] else "OUTSIDE")])
        lines += [head] + _columns(rows)
        if "chance" in info and BASELINE in info["results"]:
            low = info["results"][BASELINE]["low"]
            verdict = "above" if low > info["chance"] else "NOT above"
            lines.append(f"bf16 is {verdict} chance (its interval's low end {low:.3f} vs "
                         f"{info['chance']:.3f})")
        lines.append("")
    outside = report["outside_noise"]
    lines.append("paired difference from bf16 outside the noise: " + ("; ".join(
        f"{label} ({', '.join(tasks)})" for label, tasks in outside.items()) or "none"))
    return "\n".join(lines)


def plot(report: dict, path: pathlib.Path) -> None:
    """One panel per task: each codec's metric with its interval; bf16's interval shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = list(report["tasks"])
    fig, axes = plt.subplots(1, len(tasks), figsize=(4.2 * len(tasks), 4.0), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        info = report["tasks"][task]
        labels = list(info["results"])
        rows = [info["results"][label] for label in labels]
        xs = range(len(labels))
        colors = ["C3" if r["within_noise"] is False else "C0" for r in rows]
        for x, r, c in zip(xs, rows, colors):
            ax.errorbar([x], [r["value"]], yerr=[[r["value"] - r["low"]], [r["high"] - r["value"]]],
                        fmt="o", color=c, capsize=3)
        base = info["results"].get(BASELINE)
        if base:
            ax.axhspan(base["low"], base["high"], color="gray", alpha=0.2, label="bf16 interval")
        if "chance" in info:
            ax.axhline(info["chance"], color="k", linestyle="--", linewidth=0.8, label="chance")
        ax.set_xticks(list(xs))
        ax.set_xticklabels(labels, rotation=45, ha="right", fontsize=8)
        ax.set_title(f"{task}: {info['metric']}, {info['num_samples']} samples", fontsize=9)
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"{report['model']}: quality with the prompt KV replaced by each codec "
                 f"(95% bootstrap; red: paired difference from bf16 excludes 0)", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
