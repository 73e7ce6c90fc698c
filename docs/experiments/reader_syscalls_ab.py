"""Does a reader with fewer system calls per frame disturb a decode step less?  (Answer,
2026-11-27: no measurable difference; docs/benchmarks.md "A residual beside a decode step".)

The candidate (``reader_waitall.patch``, not adopted) drops the buffered file under
``SocketReader``: small reads come from a 64 KiB read-ahead filled by one recv, the rest of a
large payload is read with ``MSG_WAITALL``, and the receiver's sockets block with the kernel's
SO_RCVTIMEO / SO_SNDTIMEO instead of Python's timeout (which polls before every recv). So a
frame costs ~3 system calls, each releasing the GIL once, instead of ~6-8.

    git apply docs/experiments/reader_waitall.patch
    python docs/experiments/reader_syscalls_ab.py --runs 20 --json OUT.json
    git checkout lynx_npu/transport

Compares, alternating within each run in one process, the working tree's reader ("new")
against the committed one (``git show HEAD:lynx_npu/transport/connection.py``, "old"), with
receiver_interference.py's measure() (0.2 Gbps, frame_s 5 ms, ack_delay_s 20 ms).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import pathlib
import statistics
import subprocess
import sys
import tempfile

import torch

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import receiver_interference as ri  # noqa: E402

import lynx_npu.transport.connection as conn  # noqa: E402


def _committed_reader():
    source = subprocess.run(["git", "show", "HEAD:lynx_npu/transport/connection.py"],
                            cwd=HERE.parents[1], check=True, capture_output=True,
                            text=True).stdout
    path = pathlib.Path(tempfile.mkdtemp()) / "old_connection.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("lynx_npu.transport._old_connection", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.SocketReader


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    old_reader, new_reader = _committed_reader(), conn.SocketReader
    new_idle = getattr(conn.FrameSocket, "idle_timeout", None)
    if new_idle is None:
        raise SystemExit("apply docs/experiments/reader_waitall.patch first")

    def use(new: bool) -> None:
        conn.SocketReader = new_reader if new else old_reader
        conn.FrameSocket.idle_timeout = new_idle if new else (
            lambda self, seconds: self.sock.settimeout(seconds))

    rows = []
    for run in range(args.runs):
        for new in ((False, True) if run % 2 == 0 else (True, False)):
            use(new)
            r = ri.measure(0.2, 0.005, 0.02, 3)
            r.update(run=run, reader="new" if new else "old")
            rows.append(r)
            print(f"run {run} {r['reader']}: step {r['idle_step_ms']:.2f} ms idle, "
                  f"{r['residual_step_ms']:.2f} ms during the residual "
                  f"({100 * r['slowdown']:+.1f}%)", flush=True)
    for name in ("old", "new"):
        mine = [r for r in rows if r["reader"] == name]
        print(f"{name}: median slowdown {100 * statistics.median(r['slowdown'] for r in mine):+.1f}%, "
              f"median extra {statistics.median(r['residual_step_ms'] - r['idle_step_ms'] for r in mine):.2f} ms")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"gbps": 0.2, "frame_s": 0.005, "ack_delay_s": 0.02, "rows": rows}, f,
                      indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
