"""Write tests/wire/golden/<name>.bin for every frame in golden_frames.FRAMES.

Run once per format version: ``python tests/wire/make_golden.py`` (refuses to overwrite an
existing fixture unless --force: changing a v1 fixture means breaking every v1 peer).
"""
from __future__ import annotations

import argparse
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from golden_frames import FRAMES  # noqa: E402

from lynx_npu.wire import encode_frame  # noqa: E402

GOLDEN = pathlib.Path(__file__).resolve().parent / "golden"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--force", action="store_true", help="overwrite existing fixtures")
    args = parser.parse_args()
    GOLDEN.mkdir(exist_ok=True)
    for name, frame in FRAMES.items():
        path = GOLDEN / f"{name}.bin"
        if path.exists() and not args.force:
            print(f"keep {path} (exists)")
            continue
        path.write_bytes(encode_frame(frame))
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
