"""The PNG of ``lynx eval sweep``: one panel per swept parameter, attention vNMSE (log scale)
of the anchor and full stages against the parameter's values, the stage's bits per value on a
second axis, and the one-sided error (K-only for alpha_k, V-only for alpha_v and v_axis and
sinks) as a dotted line so a parameter's own effect is visible under the other side's error."""
from __future__ import annotations

import pathlib

# which one-sided anchor error a parameter acts on
_ONE_SIDED = {"alpha_k": ("attn_vnmse_k_only", "anchor, K error only"),
              "alpha_v": ("attn_vnmse_v_only", "anchor, V error only"),
              "v_axis": ("attn_vnmse_v_only", "anchor, V error only"),
              "num_sink_tokens": ("attn_vnmse_v_only", "anchor, V error only")}


def plot_sweep(report: dict, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    params = list(dict.fromkeys(p["param"] for p in report["points"]))
    fig, axes = plt.subplots(1, len(params), figsize=(4.6 * len(params), 4.0), squeeze=False)
    for ax, param in zip(axes[0], params):
        pts = [p for p in report["points"] if p["param"] == param]
        numeric = all(isinstance(p["value"], (int, float)) for p in pts)
        xs = [p["value"] for p in pts] if numeric else list(range(len(pts)))
        bits_ax = ax.twinx()
        for stage, color in (("anchor", "tab:orange"), ("full", "tab:blue")):
            ys = [p[stage]["attn_vnmse"] if stage in p else None for p in pts]
            if any(y is not None for y in ys):
                ax.plot(xs, ys, "o-", color=color, label=f"{stage} attn vNMSE")
                bits_ax.plot(xs, [p[stage]["bits_per_value"] if stage in p else None for p in pts],
                             "s--", color=color, alpha=0.4, markersize=3,
                             label=f"{stage} bits/value")
        if param in _ONE_SIDED:
            key, name = _ONE_SIDED[param]
            ys = [p.get("anchor", {}).get(key) for p in pts]
            if any(y is not None for y in ys):
                ax.plot(xs, ys, "o:", color="tab:red", label=name)
        ax.set_yscale("log")
        if numeric and param.startswith("alpha"):
            ax.set_xscale("log")
        if not numeric:
            ax.set_xticks(xs, [str(p["value"]) for p in pts])
        ax.set_xlabel(param)
        ax.set_ylabel("attention vNMSE")
        bits_ax.set_ylabel("bits per value (dashed)")
        ax.grid(True, which="both", alpha=0.3)
        ax.set_title(f"lynx: {param}")
        if ax is axes[0][0]:
            h1, l1 = ax.get_legend_handles_labels()
            h2, l2 = bits_ax.get_legend_handles_labels()
            ax.legend(h1 + h2, l1 + l2, fontsize=7, loc="best")
    fig.suptitle(f"{report['model']}, {report['tokens']} tokens, last {report['queries']} "
                 f"queries, {len(report['layers'])} layers", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
