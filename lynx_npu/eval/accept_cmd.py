"""``lynx eval accept``: how many drafts decoded on each codec's reconstruction of a real prompt's
KV cache survive greedy verification (the Lynx paper's Fig. 10(a)); the computation is in
accept.py.

    lynx eval accept [--workloads qmsum,mmlu_pro] [--prompts 20] [--new-tokens 64] \\
        [--codecs lynx,kivi4,quantspec,int4,int8] [--qmsum-tokens 3072] [--shots 5] \\
        [--mmlu-pro-form plain|chat] [--threads 1] --json OUT.json --png OUT.png

Workloads (data under ``$LYNX_DATA``, else ``../shared/data``, as integration's demo_data finds
it; or ``--qmsum`` / ``--mmlu-pro`` paths):

- ``qmsum``: ``qmsum/val.jsonl`` meetings in file order, each transcript cut at a turn boundary
  so that transcript + first general query fit ``--qmsum-tokens`` in the model's chat template
  (meetings shorter than half of that are skipped): demo_data.load_prompts, what ``lynx demo``
  sends.
- ``mmlu_pro``: ``mmlu_pro/mmlu_pro_dev3000.jsonl``; ``--prompts`` questions evenly spaced over
  the file (it is grouped by category), each after ``--shots`` worked examples of its category
  (the category's first questions not among the tested ones), in MMLU-Pro's chain-of-thought
  few-shot format ending in "Answer: Let's think step by step.": plain text (``--mmlu-pro-form
  plain``, the default; MMLU-Pro's evaluation of local models) or that text as one user message
  in the model's chat template, the assistant's turn opened (``chat``: MMLU-Pro's evaluation
  through a chat API, and what an OpenAI chat request to ``vllm serve`` prefills).

Prints a summary table (bits per value, KL(exact || drafts) along the exact continuation (the
low-variance companion of the lengths, accept.py), mean, P(accepted >= 10), P(>= 20)) and the
full curve P(accepted >= k), k = 1..N; writes JSON and a PNG; progress on stderr.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import re
import sys
import time

from lynx_npu.cli_types import MAX_TOKENS, existing_path, int_in, names, output_file

from .codec_specs import select_codecs
from .kv_source import KV_DTYPES
from .ops_codec import add_backend_argument, with_backend
from .progress import log, progress, set_enabled

WORKLOADS = ("qmsum", "mmlu_pro")
MMLU_PRO_FORMS = ("plain", "chat")
DEFAULT_CODECS = "lynx,kivi4,quantspec,int4,int8"
MMLU_PRO_FILE = pathlib.Path("mmlu_pro") / "mmlu_pro_dev3000.jsonl"
MMLU_PRO_HEAD = ("The following are multiple choice questions (with answers) about {}. Think step "
                 "by step and then finish your answer with \"the answer is (X)\" where X is the "
                 "correct letter choice.\n\n")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="smollm2",
                        help="a bundled model (smollm2, the default; gemma3) or a Hugging Face "
                             "model directory (the one vllm serve is given)")
    parser.add_argument("--workloads", type=names(WORKLOADS, "workload"),
                        default=",".join(WORKLOADS), help="qmsum, mmlu_pro or both (default)")
    parser.add_argument("--prompts", type=int_in(1, 10_000), default=20,
                        help="prompts per workload (default 20)")
    parser.add_argument("--new-tokens", type=int_in(1, 4096), default=64,
                        help="drafts per prompt, N (default 64)")
    parser.add_argument("--codecs", type=names(what="codec spec"), default=DEFAULT_CODECS,
                        help=f"codec specs, name or name:key=value:... (default {DEFAULT_CODECS})")
    parser.add_argument("--codec-arg", action="append", default=[], metavar="CODEC:KEY=VALUE",
                        help="override a codec parameter, e.g. lynx:alpha_k=3 (repeatable)")
    parser.add_argument("--kv-dtype", choices=list(KV_DTYPES), default="bfloat16",
                        help="dtype of the exact cache and of the codecs' input (default bfloat16)")
    parser.add_argument("--qmsum", type=existing_path, default=None,
                        help="QMSum jsonl (default $LYNX_DATA/qmsum/val.jsonl or ../shared/data/...)")
    parser.add_argument("--qmsum-tokens", type=int_in(64, MAX_TOKENS), default=3072,
                        help="QMSum prompt length budget in tokens (default 3072)")
    parser.add_argument("--mmlu-pro", type=existing_path, default=None,
                        help=f"MMLU-Pro jsonl (default $LYNX_DATA/{MMLU_PRO_FILE} or ../shared/data/...)")
    parser.add_argument("--shots", type=int_in(0, 20), default=5,
                        help="MMLU-Pro worked examples before each question (default 5)")
    parser.add_argument("--mmlu-pro-form", choices=MMLU_PRO_FORMS, default="plain",
                        help="MMLU-Pro prompts as plain text (default) or as a chat request")
    parser.add_argument("--threads", type=int_in(1, 1024), default=None,
                        help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--json", dest="json_path", type=output_file, default=None,
                        help="write the results here")
    parser.add_argument("--png", type=output_file, default=None,
                        help="plot P(accepted >= k) against k here")
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")
    add_backend_argument(parser)


def data_paths(args: argparse.Namespace) -> dict[str, pathlib.Path]:
    """workload -> its data file, each checked to exist."""
    from lynx_npu.integration.vllm_ascend.tools.demo_data import default_data

    qmsum = pathlib.Path(args.qmsum) if args.qmsum else default_data()
    mmlu = pathlib.Path(args.mmlu_pro) if args.mmlu_pro else qmsum.parents[1] / MMLU_PRO_FILE
    paths = {"qmsum": qmsum, "mmlu_pro": mmlu}
    out = {}
    for name in args.workloads.split(","):
        if not paths[name].is_file():
            flag = "--qmsum" if name == "qmsum" else "--mmlu-pro"
            raise ValueError(f"{name} data {str(paths[name])!r} is not a file (set LYNX_DATA to "
                             f"the folder holding qmsum/ and mmlu_pro/, or pass {flag} PATH)")
        out[name] = paths[name]
    return out


def qmsum_prompts(path: pathlib.Path, tokenizer, num_prompts: int, num_tokens: int):
    """-> [(prompt id, token ids)] through demo_data.load_prompts."""
    from lynx_npu.integration.vllm_ascend.tools.demo_data import load_prompts

    try:
        prompts = load_prompts(tokenizer, num_prompts, num_tokens, path)
    except (KeyError, IndexError, TypeError, json.JSONDecodeError) as e:
        raise ValueError(f"{str(path)!r} is not a QMSum jsonl file: {e!r}") from None
    return [(f"meeting {p.meeting}", p.token_ids) for p in prompts]


def read_mmlu_pro(path: pathlib.Path) -> list[dict]:
    rows = []
    with path.open(encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                ok = (isinstance(row["question"], str) and isinstance(row["category"], str)
                      and isinstance(row["options"], list) and 1 <= len(row["options"]) <= 26
                      and isinstance(row["answer"], str))
            except (KeyError, TypeError, json.JSONDecodeError) as e:
                raise ValueError(f"{str(path)!r} line {line_no} is not an MMLU-Pro record: "
                                 f"{e!r}") from None
            if not ok:
                raise ValueError(f"{str(path)!r} line {line_no}: an MMLU-Pro record needs a "
                                 f"question, category and answer (text) and 1-26 options")
            rows.append(row)
    return rows


def mmlu_pro_question(row: dict, answer: bool) -> str:
    options = "".join(f"{chr(65 + i)}. {o}\n" for i, o in enumerate(row["options"]))
    text = f"Question:\n{row['question'].strip()}\nOptions:\n{options}Answer: Let's think step by step."
    return text + (f" The answer is ({row['answer']}).\n\n" if answer else "")


def mmlu_pro_prompts(path: pathlib.Path, tokenizer, num_prompts: int, shots: int,
                     form: str = "plain"):
    """-> [(prompt id, token ids)]: the module docstring's few-shot prompts, in ``form``."""
    from .quality_tasks import chat_ids

    if form not in MMLU_PRO_FORMS:
        raise ValueError(f"MMLU-Pro prompt form {form!r} must be one of {MMLU_PRO_FORMS}")
    rows = read_mmlu_pro(path)
    if len(rows) < num_prompts:
        raise ValueError(f"{str(path)!r} has {len(rows)} questions; {num_prompts} requested")
    tested = [i * len(rows) // num_prompts for i in range(num_prompts)]
    taken = set(tested)
    out = []
    for i in tested:
        category = rows[i]["category"]
        examples = [r for j, r in enumerate(rows) if r["category"] == category and j not in taken]
        if len(examples) < shots:
            raise ValueError(f"category {category!r} of {str(path)!r} has {len(examples)} "
                             f"untested questions; --shots {shots} needs that many")
        text = (MMLU_PRO_HEAD.format(category)
                + "".join(mmlu_pro_question(r, True) for r in examples[:shots])
                + mmlu_pro_question(rows[i], False))
        out.append((f"question {rows[i].get('question_id', i)} ({category})",
                    chat_ids(tokenizer, text) if form == "chat" else tokenizer(text)["input_ids"]))
    return out


def run(args: argparse.Namespace) -> int:
    import lynx_npu
    import torch

    from .accept import EXACT, prepare, rows_of, summarize, verify
    from .model import load_model

    t_start = time.perf_counter()
    set_enabled(not args.quiet)
    specs = select_codecs(args.codecs, args.codec_arg, lynx_npu.list_codecs())
    codecs = [(s.label, with_backend(s.build(), args.lynx_backend)) for s in specs]
    paths = data_paths(args)  # bad parameters and missing data fail before the model loads
    if args.threads:
        torch.set_num_threads(args.threads)
    log(f"loading model {args.model!r} ...")
    loaded = load_model(args.model)
    max_len = getattr(loaded.model.config, "max_position_embeddings", None)
    rows = [r for label, codec in codecs for r in rows_of(label, codec)]
    command = sys.argv[1:3] == ["eval", "accept"]  # else called as a function (tests)
    report = {"command": "lynx " + " ".join(sys.argv[1:]) if command else None,
              "model": args.model, "kv_dtype": args.kv_dtype, "new_tokens": args.new_tokens,
              "threads": torch.get_num_threads(), "lynx_backend": args.lynx_backend,
              "codecs": {label: (codec.params() if hasattr(codec, "params") else {})
                         for label, codec in codecs},
              "workloads": {}, "results": [], "prompts": []}
    for workload, path in paths.items():
        log(f"{workload}: building {args.prompts} prompts from {path}")
        prompts = (qmsum_prompts(path, loaded.tokenizer, args.prompts, args.qmsum_tokens)
                   if workload == "qmsum" else
                   mmlu_pro_prompts(path, loaded.tokenizer, args.prompts, args.shots,
                                    args.mmlu_pro_form))
        longest = max(len(ids) for _, ids in prompts)
        if max_len and longest + args.new_tokens + 1 > max_len:
            raise ValueError(f"a {workload} prompt of {longest} tokens + {args.new_tokens + 1} "
                             f"decoded exceeds the model's {max_len} positions")
        per_prompt = []
        for n, (prompt_id, ids) in enumerate(prompts, 1):
            t0 = time.perf_counter()
            where = f"{workload} {n}/{len(prompts)} ({prompt_id}, {len(ids)} tokens)"
            prepared = prepare(loaded.model, torch.tensor(ids, dtype=torch.int64), codecs,
                               KV_DTYPES[args.kv_dtype], on_stage=lambda s: log(f"{where}: {s}"))
            with progress(args.new_tokens + 1, f"{where}: decode step") as bar:
                res = verify(loaded.model, prepared, args.new_tokens, on_step=bar.update)
            per_prompt.append(res)
            report["prompts"].append({"workload": workload, "id": prompt_id, **res})
            log(f"{where}: accepted " + ", ".join(f"{k} {v}" for k, v in res["accepted"].items())
                + f" ({time.perf_counter() - t0:.0f} s)")
        lengths = [len(ids) for _, ids in prompts]
        report["workloads"][workload] = {
            "data": str(path), "num_prompts": len(prompts), "prompt_tokens_min": min(lengths),
            "prompt_tokens_mean": sum(lengths) / len(lengths), "prompt_tokens_max": max(lengths),
            **({"qmsum_tokens": args.qmsum_tokens} if workload == "qmsum" else {"shots": args.shots, "form": args.mmlu_pro_form})}
        for r in rows:
            bits = [p["bits"][r.codec] for p in per_prompt]
            weights = [p["tokens"] for p in per_prompt]
            report["results"].append({
                "workload": workload, "row": r.label, "codec": r.codec,
                "draft_stage": r.draft_stage, "target": r.target,
                "draft_bits_per_value": _weighted([b[r.draft_stage] for b in bits], weights),
                "target_bits_per_value": float(torch.finfo(KV_DTYPES[args.kv_dtype]).bits)
                if r.target == EXACT else _weighted([b[r.target] for b in bits], weights),
                "mean_kl": sum(p["kl"][f"{r.codec} {r.draft_stage}"] for p in per_prompt)
                / len(per_prompt),
                **summarize([p["accepted"][r.label] for p in per_prompt], args.new_tokens)})
    report["total_s"] = time.perf_counter() - t_start
    print(format_tables(report))
    if args.json_path:
        pathlib.Path(args.json_path).write_text(to_json(report))
        log(f"wrote {args.json_path}")
    if args.png:
        plot_accept(report, pathlib.Path(args.png))
        log(f"wrote {args.png}")
    log(f"done in {report['total_s']:.0f} s")
    return 0


def to_json(report: dict) -> str:
    """Indented JSON with every list of numbers (curves, lengths, token ids) on one line."""
    text = json.dumps(report, indent=1)
    return re.sub(r"\[\s*([-+\d.eE,\s]+?)\s*\]",
                  lambda m: "[" + " ".join(m.group(1).split()) + "]", text) + "\n"


def _weighted(values: list[float], weights: list[int]) -> float:
    return sum(v * w for v, w in zip(values, weights)) / sum(weights)


def _short(result: dict) -> str:
    return f"{result['codec']}>{result['target']}"


def format_tables(report: dict) -> str:
    n = report["new_tokens"]
    lines = []
    for workload, info in report["workloads"].items():
        results = [r for r in report["results"] if r["workload"] == workload]
        lines.append(f"{workload}: {info['num_prompts']} prompts of {info['prompt_tokens_min']}-"
                     f"{info['prompt_tokens_max']} tokens, {report['model']}, {n} greedy drafts, "
                     f"KV {report['kv_dtype']}")
        width = max(len(r["row"]) for r in results)
        lines.append(f"{'drafts -> target':<{width}}  {'draft b/v':>9}  {'KL':>9}  {'mean':>6}  "
                     f"{'P(>=10)':>7}  {'P(>=20)':>7}  {f'P(>={n})':>8}")
        for r in results:
            p = r["p_at_least"]
            kl = f"{r['mean_kl']:.2e}" if "mean_kl" in r else "-"  # reports before 2026-11-27
            lines.append(f"{r['row']:<{width}}  {r['draft_bits_per_value']:>9.3f}  {kl:>9}  "
                         f"{r['mean']:>6.2f}  {_p(p, 10):>7}  {_p(p, 20):>7}  {p[-1]:>8.2f}")
        spans = [(r["row"], r["intervals"]) for r in results if "intervals" in r]  # 2026-11-30 on
        if spans:
            lines.append("")
            lines.append(f"{workload}: 95% bootstrap intervals over the prompts")
            for row, iv in spans:
                lines.append(f"{row:<{width}}  " + "  ".join(
                    f"{_interval_label(name)} [{lo:.2f}, {hi:.2f}]" for name, (lo, hi) in iv.items()))
        lines.append("")
        heads = [_short(r) for r in results]
        widths = [max(6, len(h)) for h in heads]
        lines.append(f"{workload}: P(accepted >= k)")
        lines.append("   k  " + "  ".join(f"{h:>{w}}" for h, w in zip(heads, widths)))
        for k in range(1, n + 1):
            lines.append(f"{k:>4}  " + "  ".join(f"{r['p_at_least'][k - 1]:>{w}.2f}"
                                                for r, w in zip(results, widths)))
        lines.append("")
    return "\n".join(lines).rstrip()


def _interval_label(name: str) -> str:
    """"mean" or "P(>=k)" for summarize's "p_at_least_k"."""
    return name if name == "mean" else f"P(>={name.rsplit('_', 1)[1]})"


def _p(p: list[float], k: int) -> str:
    return f"{p[k - 1]:.2f}" if k <= len(p) else "-"


def plot_accept(report: dict, path: pathlib.Path) -> None:
    """One panel per workload: P(accepted >= k) against k, a colour per codec, solid against
    the codec's own last stage, dashed against the exact cache."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = list(report["workloads"])
    codecs = list(dict.fromkeys(r["codec"] for r in report["results"]))
    colors = {c: f"C{i}" for i, c in enumerate(codecs)}
    fig, axes = plt.subplots(1, len(workloads), figsize=(5.5 * len(workloads), 4.2),
                             squeeze=False, sharey=True)
    ks = list(range(1, report["new_tokens"] + 1))
    for ax, workload in zip(axes[0], workloads):
        for r in (r for r in report["results"] if r["workload"] == workload):
            ax.plot(ks, r["p_at_least"], color=colors[r["codec"]],
                    linestyle="--" if r["target"] == "exact" else "-",
                    label=f"{r['row']} ({r['draft_bits_per_value']:.2f} b/v, mean {r['mean']:.1f})")
        for k in (k for k in (10, 20) if k <= report["new_tokens"]):
            ax.axvline(k, color="gray", linewidth=0.6, alpha=0.5)
        info = report["workloads"][workload]
        ax.set_title(f"{workload}: {info['num_prompts']} prompts, {info['prompt_tokens_min']}-"
                     f"{info['prompt_tokens_max']} tokens", fontsize=10)
        ax.set_xlabel("k (drafts)")
        ax.set_xlim(1, max(2, report["new_tokens"]))
        ax.set_ylim(0, 1.02)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=6.5, loc="center right", framealpha=0.85)
    axes[0][0].set_ylabel("P(accepted >= k)")
    fig.suptitle(f"{report['model']}: {report['new_tokens']} greedy drafts on each codec's "
                 f"prompt KV, verified greedily", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
