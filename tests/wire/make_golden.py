"""Write the golden fixtures: tests/wire/golden/<name>.bin for every frame in
golden_frames.FRAMES (frame format), and tests/wire/golden/payload/<case>.frames.bin and
<case>.expect.bin for every case in golden_payloads.CASES (real codec output).

Run by hand only, once per frame or payload format version: ``python tests/wire/make_golden.py``
refuses to overwrite an existing fixture unless --force (changing a fixture of a released
format means breaking every peer that speaks it; bump the version instead).
"""
from __future__ import annotations

import argparse
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from golden_frames import FRAMES  # noqa: E402
from golden_payloads import CASES, decode_frames, encode_case, expectation_bytes  # noqa: E402

from lynx_npu.wire import encode_frame  # noqa: E402

GOLDEN = pathlib.Path(__file__).resolve().parent / "golden"
PAYLOAD = GOLDEN / "payload"


def fixtures():
    """(path, bytes) of every fixture."""
    for name, frame in FRAMES.items():
        yield GOLDEN / f"{name}.bin", encode_frame(frame)
    for name, case in CASES.items():
        frames = encode_case(case)
        yield PAYLOAD / f"{name}.frames.bin", frames
        yield PAYLOAD / f"{name}.expect.bin", expectation_bytes(decode_frames(frames))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--force", action="store_true", help="overwrite existing fixtures")
    args = parser.parse_args()
    PAYLOAD.mkdir(parents=True, exist_ok=True)
    for path, data in fixtures():
        if path.exists() and not args.force:
            print(f"keep {path} (exists)")
            continue
        path.write_bytes(data)
        print(f"wrote {path} ({len(data)} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
