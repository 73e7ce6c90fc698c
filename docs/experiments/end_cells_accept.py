"""`lynx eval accept` (MMLU-Pro, 20 prompts, the default `lynx` codec) with the end cells of
end_cells_probe.py patched into the reference quantizer, or without (docs/codec.md "The full
stage's end cells"):

    python docs/experiments/end_cells_accept.py codec OUT.json
    python docs/experiments/end_cells_accept.py end_cells OUT.json
"""
import sys
sys.path.insert(0, "docs/experiments")
import end_cells_probe as ec
from lynx_npu.cli import main

mode, out = sys.argv[1], sys.argv[2]
sys.argv = ["lynx", "eval", "accept", "--workloads", "mmlu_pro", "--prompts", "20", "--codecs",
            "lynx", "--threads", "2", "--quiet", "--json", out]
if mode == "end_cells":
    with ec.end_cells():
        main()
else:
    main()
