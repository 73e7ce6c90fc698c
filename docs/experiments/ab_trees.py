"""A/B of two source trees on one machine: a ``lynx`` CLI command run from each tree in turn,
alternated for several rounds, so that both sides see the same device and the same drift.

    git archive <commit> lynx_npu gpu integration | tar -x -C OLD      # the baseline tree
    python docs/experiments/ab_trees.py --trees old=OLD,new=. --rounds 3 --out OUT_DIR -- \\
        bench datapath --device cuda --tokens 16384 ...                # "--json" is added

Each run writes OUT_DIR/<name>_<round>.json; a table of the JSON's numeric fields (median over
rounds) is printed at the end. A tree needs ``lynx_npu/gpu`` and ``lynx_npu/integration``
reachable as in an installed wheel: the script links them (``gpu/``, ``integration/``) when a
tree lacks them.
"""
import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys


def _link(tree: pathlib.Path) -> None:
    for name in ("gpu", "integration"):
        link = tree / "lynx_npu" / name
        if not link.exists():
            link.symlink_to((tree / name).resolve(), target_is_directory=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trees", required=True, help="name=path,name=path")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", required=True)
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- then the lynx CLI arguments")
    args = ap.parse_args()
    cmd = [a for a in args.command if a != "--"]
    trees = dict(item.split("=", 1) for item in args.trees.split(","))
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, list[dict]] = {name: [] for name in trees}
    for r in range(args.rounds):
        for name, path in trees.items():
            tree = pathlib.Path(path).resolve()
            _link(tree)
            path_json = out / f"{name}_{r}.json"
            env = {**os.environ, "PYTHONPATH": str(tree)}
            run = subprocess.run([sys.executable, "-m", "lynx_npu.cli", *cmd, "--json",
                                  str(path_json)], env=env, cwd=tree, capture_output=True,
                                 text=True)
            if run.returncode:
                print(run.stderr[-3000:], file=sys.stderr)
                raise SystemExit(f"{name} round {r} failed ({run.returncode})")
            results[name].append(json.loads(path_json.read_text()))
            print(f"round {r} {name}: done", flush=True)
    keys = [k for k, v in results[next(iter(trees))][0].items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)]
    print("field," + ",".join(trees))
    for k in keys:
        meds = [statistics.median(res[k] for res in results[n] if k in res) for n in trees]
        print(f"{k}," + ",".join(f"{m:.6g}" for m in meds))


if __name__ == "__main__":
    main()
