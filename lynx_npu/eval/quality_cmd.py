"""``lynx eval quality``: perplexity, Needle-in-a-Haystack, QMSum and MMLU-Pro with the prompt's
KV cache replaced by each codec's reconstruction (issue 20's quality table).

    lynx eval quality [--model smollm2|gemma3] [--tasks ppl,needle,qmsum,mmlu] \\
        [--codecs bf16,int8,int4,kivi4,quantspec,cachegen,lynx-int4,lynx] \\
        [--ppl-samples 20] [--ppl-context 2048-7168] [--ppl-tokens 256] \\
        [--needle-samples 20] [--needle-lengths 1024,2048,4096] \\
        [--needle-depths 0,0.25,0.5,0.75,1] [--needle-new-tokens 32] \\
        [--qmsum-samples 20] [--qmsum-tokens 2048] [--qmsum-new-tokens 64] \\
        [--mmlu-samples 20] [--shots 5] [--data DIR] [--json OUT] [--plot PNG]

Prompts: quality_tasks.py; the measure: quality.py; intervals: bootstrap.py; Rouge-L:
rouge.py. Each codec counts as its last stage (``lynx`` = its full stage, whose output equals
``lynx-int8``'s; ``lynx-int4`` = the anchor alone). The table gives each metric with a 95%
bootstrap interval over the prompts and its paired difference from ``bf16``; a codec is
"outside the noise" on a task when that paired interval excludes 0.
"""
from __future__ import annotations

import argparse
import pathlib
import sys
import time

from lynx_npu.cli_types import MAX_TOKENS, existing_path, int_in, names, output_file

from .codec_specs import select_codecs
from .kv_source import KV_DTYPES
from .ops_codec import add_backend_argument, with_backend
from .progress import log, progress, set_enabled

TASKS = ("ppl", "needle", "qmsum", "mmlu")
DEFAULT_CODECS = "bf16,int8,int4,kivi4,quantspec,cachegen,lynx-int4,lynx"
DATA_FILES = {"ppl": "paul_graham_essays", "needle": "paul_graham_essays",
              "qmsum": "qmsum/val.jsonl", "mmlu": "mmlu_pro/mmlu_pro_dev3000.jsonl"}


def _span(text: str) -> tuple[int, int]:
    low, sep, high = text.partition("-")
    try:
        lo, hi = int(low), int(high if sep else low)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} must be MIN-MAX tokens, e.g. 2048-7168") \
            from None
    if not 2 <= lo <= hi <= MAX_TOKENS:
        raise argparse.ArgumentTypeError(f"{text!r} needs 2 <= MIN <= MAX <= {MAX_TOKENS}")
    return lo, hi


def _ints(text: str) -> list[int]:
    parse = int_in(32, MAX_TOKENS)
    return [parse(t) for t in text.split(",")]


def _depths(text: str) -> list[float]:
    try:
        out = [float(t) for t in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} must be comma-separated numbers") from None
    if not all(0 <= d <= 1 for d in out):
        raise argparse.ArgumentTypeError(f"needle depths {text!r} must be in [0, 1]")
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    count = int_in(1, 10_000)
    parser.add_argument("--model", default="smollm2", help="smollm2 (default) or gemma3")
    parser.add_argument("--tasks", type=names(TASKS, "task"), default=",".join(TASKS),
                        help="ppl, needle, qmsum, mmlu (default all)")
    parser.add_argument("--codecs", type=names(what="codec spec"), default=DEFAULT_CODECS,
                        help=f"codec specs (default {DEFAULT_CODECS}); bf16 is the baseline")
    parser.add_argument("--codec-arg", action="append", default=[], metavar="CODEC:KEY=VALUE",
                        help="override a codec parameter, e.g. lynx:alpha_k=3 (repeatable)")
    parser.add_argument("--kv-dtype", choices=list(KV_DTYPES), default="bfloat16",
                        help="dtype of the exact cache and of the codecs' input (default bfloat16)")
    parser.add_argument("--data", type=existing_path, default=None,
                        help="folder holding paul_graham_essays/, qmsum/, mmlu_pro/ (default "
                             "$LYNX_DATA or ../shared/data)")
    parser.add_argument("--ppl-samples", type=count, default=20, help="perplexity windows")
    parser.add_argument("--ppl-context", type=_span, default=(2048, 7168),
                        help="context lengths MIN-MAX, spread over the windows (default 2048-7168)")
    parser.add_argument("--ppl-tokens", type=int_in(1, MAX_TOKENS), default=256,
                        help="continuation tokens scored per window (default 256)")
    parser.add_argument("--needle-samples", type=count, default=20, help="needle prompts")
    parser.add_argument("--needle-lengths", type=_ints, default=[1024, 2048, 4096],
                        help="needle prompt lengths in tokens (default 1024,2048,4096)")
    parser.add_argument("--needle-depths", type=_depths, default=[0, 0.25, 0.5, 0.75, 1],
                        help="needle depths in [0, 1] (default 0,0.25,0.5,0.75,1)")
    parser.add_argument("--needle-new-tokens", type=int_in(1, 4096), default=32,
                        help="tokens generated per needle answer (default 32)")
    parser.add_argument("--qmsum-samples", type=count, default=20, help="QMSum meetings")
    parser.add_argument("--qmsum-tokens", type=int_in(64, MAX_TOKENS), default=2048,
                        help="QMSum prompt budget in tokens (default 2048)")
    parser.add_argument("--qmsum-new-tokens", type=int_in(1, 4096), default=64,
                        help="tokens generated per QMSum answer (default 64)")
    parser.add_argument("--mmlu-samples", type=count, default=20, help="MMLU-Pro questions")
    parser.add_argument("--shots", type=int_in(0, 20), default=5,
                        help="MMLU-Pro worked examples per question (default 5)")
    parser.add_argument("--resamples", type=int_in(10, 1_000_000), default=2000,
                        help="bootstrap resamples (default 2000)")
    parser.add_argument("--seed", type=int_in(0, 2**31 - 1), default=0, help="bootstrap seed")
    parser.add_argument("--threads", type=int_in(1, 1024), default=None,
                        help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--json", dest="json_path", type=output_file, default=None,
                        help="write the results here")
    parser.add_argument("--plot", type=output_file, default=None, help="write the PNG here")
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")
    parser.add_argument("--from-json", type=existing_path, action="append", default=None,
                        metavar="IN.json",
                        help="measure nothing: re-summarize the per-prompt scores of an earlier "
                             "--json (intervals with --resamples/--seed), print, --json, --plot; "
                             "repeated, the reports' tasks are merged (same model and codecs)")
    add_backend_argument(parser)


def data_paths(args: argparse.Namespace) -> dict[str, pathlib.Path]:
    """task -> its data (folder or file), each checked to exist."""
    if args.data:
        root = pathlib.Path(args.data)
    else:
        from lynx_npu.integration.vllm_ascend.tools.demo_data import default_data
        root = default_data().parents[1]
    out = {}
    for task in args.tasks.split(","):
        path = root / DATA_FILES[task]
        if not path.exists():
            raise ValueError(f"{task} data {str(path)!r} not found (pass --data DIR, the folder "
                             f"holding {DATA_FILES[task]}, or set LYNX_DATA)")
        out[task] = path
    return out


def build_codecs(args: argparse.Namespace) -> list[tuple[str, object]]:
    import lynx_npu

    specs = select_codecs(args.codecs, args.codec_arg, lynx_npu.list_codecs())
    labels = [s.label for s in specs]
    if len(set(labels)) != len(labels):
        raise ValueError(f"--codecs {args.codecs!r} names a codec twice")
    return [(s.label, with_backend(s.build(), args.lynx_backend)) for s in specs]


def run(args: argparse.Namespace) -> int:
    from .model import load_model

    set_enabled(not args.quiet)
    if args.from_json:
        return resummarize(args)
    build_codecs(args)
    data_paths(args)  # bad flags and missing data fail before the model loads
    log(f"loading model {args.model!r} ...")
    return execute(args, load_model(args.model))


def execute(args: argparse.Namespace, loaded) -> int:
    """Measure every task on ``loaded`` (a model.LoadedModel), print the table, write the
    JSON and the plot."""
    import torch

    from .bootstrap import BootstrapConfig
    from .quality_report import METRICS, format_table, outside_noise, plot, summarize
    from .accept_cmd import to_json

    t_start = time.perf_counter()
    set_enabled(not args.quiet)
    codecs = build_codecs(args)
    paths = data_paths(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    config = BootstrapConfig(args.resamples, 0.95, args.seed)
    labels = [label for label, _ in codecs]
    command = sys.argv[1:3] == ["eval", "quality"]
    report = {"command": "lynx " + " ".join(sys.argv[1:]) if command else None,
              "model": loaded.name, "kv_dtype": args.kv_dtype, "lynx_backend": args.lynx_backend,
              "threads": torch.get_num_threads(),
              "codecs": {label: (c.params() if hasattr(c, "params") else {})
                         for label, c in codecs},
              "bootstrap": {"resamples": config.resamples, "level": config.level,
                            "seed": config.seed, "kind": "percentile, prompts resampled"},
              "tasks": {}}
    for task, path in paths.items():
        samples = build_samples(task, path, loaded, args)
        records = measure_task(task, samples, loaded, codecs, args)
        metric, higher, _ = METRICS[task]
        tokens = [r["tokens"] for r in records]
        info = {"metric": metric, "higher_is_better": higher, "data": str(path),
                "num_samples": len(records), "tokens_min": min(tokens), "tokens_max": max(tokens),
                "settings": task_settings(task, args)}
        if task == "mmlu":
            info["chance"] = sum(1 / r["num_options"] for r in records) / len(records)
        info["results"] = summarize(task, records, labels, config)
        info["samples"] = records
        report["tasks"][task] = info
        report["outside_noise"] = outside_noise(report)
        report["complete"] = len(report["tasks"]) == len(paths)
        report["total_s"] = time.perf_counter() - t_start
        # written after every task, so a long run stopped early keeps the tasks it finished
        if args.json_path:
            pathlib.Path(args.json_path).write_text(to_json(report))
            log(f"wrote {args.json_path} ({len(report['tasks'])} of {len(paths)} tasks)")
        if args.plot:
            plot(report, pathlib.Path(args.plot))
            log(f"wrote {args.plot}")
    print(format_table(report))
    log(f"done in {report['total_s']:.0f} s")
    return 0


def resummarize(args: argparse.Namespace) -> int:
    """``--from-json``: the intervals and the table again from a report's per-prompt scores."""
    import json

    from .accept_cmd import to_json
    from .bootstrap import BootstrapConfig
    from .quality_report import format_table, outside_noise, plot, summarize

    report = None
    for path in args.from_json:
        try:
            part = json.loads(pathlib.Path(path).read_text())
            for task, info in part["tasks"].items():
                info["results"] = summarize(task, info["samples"], list(info["results"]),
                                            BootstrapConfig(args.resamples, 0.95, args.seed))
        except (KeyError, TypeError, AttributeError, json.JSONDecodeError) as e:
            raise ValueError(f"{path!r} is not a lynx eval quality report: {e!r}") from None
        if report is None:
            report = part
            report["sources"] = [{"json": path, "command": part.get("command")}]
            continue
        if (part["model"], list(part["codecs"])) != (report["model"], list(report["codecs"])):
            raise ValueError(f"{path!r} measured {part['model']} with {list(part['codecs'])}, "
                             f"not {report['model']} with {list(report['codecs'])}")
        both = set(part["tasks"]) & set(report["tasks"])
        if both:
            raise ValueError(f"{path!r} repeats task(s) {sorted(both)} of an earlier --from-json")
        report["tasks"].update(part["tasks"])
        report["sources"].append({"json": path, "command": part.get("command")})
        report["total_s"] = report.get("total_s", 0) + part.get("total_s", 0)
    report["bootstrap"].update(resamples=args.resamples, seed=args.seed)
    report["outside_noise"] = outside_noise(report)
    print(format_table(report))
    if args.json_path:
        pathlib.Path(args.json_path).write_text(to_json(report))
    if args.plot:
        plot(report, pathlib.Path(args.plot))
    return 0


def task_settings(task: str, args: argparse.Namespace) -> dict:
    return {"ppl": {"context": list(args.ppl_context), "scored_tokens": args.ppl_tokens},
            "needle": {"lengths": args.needle_lengths, "depths": args.needle_depths,
                       "new_tokens": args.needle_new_tokens},
            "qmsum": {"prompt_budget": args.qmsum_tokens, "new_tokens": args.qmsum_new_tokens},
            "mmlu": {"shots": args.shots}}[task]


def build_samples(task: str, path: pathlib.Path, loaded, args: argparse.Namespace) -> list:
    from . import quality_tasks as qt

    tok = loaded.tokenizer
    log(f"{task}: building prompts from {path}")
    if task == "ppl":
        samples = qt.ppl_samples(path, tok, args.ppl_samples, args.ppl_context, args.ppl_tokens)
        longest = max(len(s.context) + len(s.continuation) for s in samples)
    elif task == "needle":
        samples = qt.needle_samples(path, tok, args.needle_samples, args.needle_lengths,
                                    args.needle_depths)
        longest = max(len(s.prompt) for s in samples) + args.needle_new_tokens
    elif task == "qmsum":
        samples = qt.qmsum_samples(path, tok, args.qmsum_samples, args.qmsum_tokens)
        longest = max(len(s.prompt) for s in samples) + args.qmsum_new_tokens
    else:
        samples = qt.mmlu_samples(path, tok, args.mmlu_samples, args.shots)
        longest = max(len(s.prompt) for s in samples)
    max_len = getattr(loaded.model.config, "max_position_embeddings", None)
    if max_len and longest > max_len:
        raise ValueError(f"a {task} sample needs {longest} positions; the model has {max_len}")
    return samples


def _eta(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds >= 90 else f"{seconds:.0f} s"


def measure_task(task: str, samples: list, loaded, codecs, args) -> list[dict]:
    import torch

    from . import quality as q
    from .rouge import rouge_l_f

    model, tok = loaded.model, loaded.tokenizer
    kv_dtype = KV_DTYPES[args.kv_dtype]
    stops = q.stop_ids(model, tok)
    records, t_task = [], time.perf_counter()
    for n, s in enumerate(samples, 1):
        t0 = time.perf_counter()
        where = f"{task} {n}/{len(samples)} ({s.id})"
        stage = lambda name: log(f"{where}: {name}")  # noqa: E731
        if task == "ppl":
            ids = torch.tensor(s.context[:-1], dtype=torch.int64)
            _, caches = q.codec_caches(model, ids, codecs, kv_dtype, stage)
            scores = {}
            with progress(len(caches), f"{where}: teacher-forced codec") as bar:
                for label, layers in caches.items():
                    scores[label] = q.continuation_nll(model, layers, s.context[-1],
                                                       s.continuation)
                    bar.update()
            rec = {"id": s.id, "tokens": len(s.context), "scores": scores}
        elif task in ("needle", "qmsum"):
            new = args.needle_new_tokens if task == "needle" else args.qmsum_new_tokens
            first, caches = q.codec_caches(model, torch.tensor(s.prompt, dtype=torch.int64),
                                           codecs, kv_dtype, stage)
            with progress(new - 1, f"{where}: decode step") as bar:
                tokens = q.generate(model, caches, first, new, bar.update)
            answers = {label: q.answer_text(tok, t, stops) for label, t in tokens.items()}
            rec = {"id": s.id, "tokens": len(s.prompt),
                   "scores": {label: rouge_l_f(a, s.reference) for label, a in answers.items()},
                   "reference": s.reference, "answers": answers}
        else:
            _, caches = q.codec_caches(model, torch.tensor(s.prompt[:-1], dtype=torch.int64),
                                       codecs, kv_dtype, stage)
            picks = q.choose(model, list(caches.values()), s.prompt[-1], s.option_tokens)
            rec = {"id": s.id, "tokens": len(s.prompt), "num_options": len(s.option_tokens),
                   "answer": s.answer, "picked": dict(zip(caches, picks)),
                   "scores": {label: float(p == s.answer) for label, p in zip(caches, picks)}}
        records.append(rec)
        done = time.perf_counter() - t_task
        log(f"{where}: " + ", ".join(f"{k} {v:.3f}" for k, v in rec["scores"].items())
            + f" ({time.perf_counter() - t0:.0f} s; {task} ETA "
            f"{_eta(done / n * (len(samples) - n))})")
    return records
