"""Timeline plot of ``lynx bench transfer``: bytes received over time per codec (top), and
when each layer's anchor and residual frames of the progressive codecs landed (bottom)."""
from __future__ import annotations

from ..wire import Kind


def plot_timeline(report: dict, timelines: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    gbps = report["gbps"]
    progressive = [r["codec"] for r in report["results"] if r["anchor_bytes"] < r["total_bytes"]]
    rows = 1 + len(progressive)
    fig, axes = plt.subplots(rows, 1, figsize=(9, 3.6 + 2.6 * len(progressive)),
                             gridspec_kw={"height_ratios": [1.4] + [1] * len(progressive)},
                             squeeze=False)
    ax = axes[0][0]
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    t_max = max(r["complete_s"] for r in report["results"])
    ax.plot([0, t_max], [0, t_max * gbps * 1e9 / 8 / 1e6], color="0.7", ls=":",
            label=f"link limit {gbps:g} Gbps")
    for i, r in enumerate(report["results"]):
        color = colors[i % len(colors)]
        pts = sorted(timelines[r["codec"]])
        t, total = [0.0], [0.0]
        for when, _, _, n in pts:
            t.append(when)
            total.append(total[-1] + n / 1e6)
        ax.step(t, total, where="post", color=color, label=f"{r['codec']} "
                f"({r['total_bytes'] / 1e6:.0f} MB)")
        ax.axvline(r["anchor_ready_s"], color=color, ls="--", lw=1)
        ax.annotate(f"{r['codec']} {'anchor' if r['codec'] in progressive else 'ready'} "
                    f"{r['anchor_ready_s']:.3f}s", (r["anchor_ready_s"], 0.04 + 0.07 * i),
                    xycoords=ax.get_xaxis_transform(), xytext=(3, 0),
                    textcoords="offset points", fontsize=8, color=color)
    ax.set_xlabel("seconds since the first send")
    ax.set_ylabel("MB received")
    ax.set_title(f"lynx bench transfer: {report['tokens']} tokens, {gbps:g} Gbps link "
                 f"(dashed: anchor_ready / ready)")
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(alpha=0.3)
    for j, name in enumerate(progressive, start=1):
        ax = axes[j][0]
        for kind, label, color in ((Kind.ANCHOR, "anchor frame", "tab:blue"),
                                   (Kind.RESIDUAL, "residual frame", "tab:orange")):
            pts = [(t, layer) for t, k, layer, _ in timelines[name] if k == kind]
            ax.scatter([p[0] for p in pts], [p[1] for p in pts], s=4, color=color, label=label)
        r = next(r for r in report["results"] if r["codec"] == name)
        ax.axvline(r["anchor_ready_s"], color="tab:blue", ls="--", lw=1, label="anchor_ready")
        ax.axvline(r["complete_s"], color="tab:orange", ls="--", lw=1, label="residual_ready")
        ax.set_xlim(axes[0][0].get_xlim())
        ax.set_ylabel(f"{name}: layer")
        ax.set_xlabel("seconds since the first send")
        ax.legend(fontsize=8, loc="lower right", markerscale=3)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
