"""`lynx eval accept` with SmolLM2's plan (what `lynx demo` deploys) and the page range rounded
outward onto gamma_byte_probe.py's e3m4 grid, one exponent per 8 channels, patched into the
reference quantizer (docs/codec.md "The page range in one byte"):

    python docs/experiments/gamma_byte_accept.py qmsum 35 OUT.json
    python docs/experiments/gamma_byte_accept.py mmlu_pro 40 OUT.json
    python docs/experiments/gamma_byte_accept.py qmsum 35 OUT.json 17,18,20,23   # those keep it

An optional fourth argument names layers that keep the exact range (the KV dtype's), as
gamma_byte_kl_probe.py's ``--keep-exact`` does: the accept harness encodes one layer at a time
through ``codec.for_layer``, which records the layer the patched ``page_range`` then reads.

The same prompts and settings as docs/results/eval_accept_format9_plan_page256_512_*.json, whose
pages-of-256 rows are the exact page range's.
"""
import sys

sys.path.insert(0, "docs/experiments")
import gamma_byte_probe as gb  # noqa: E402
from lynx_npu.cli import main  # noqa: E402
from lynx_npu.codec import lynx_ref  # noqa: E402
from lynx_npu.codec.lynx import LynxCodec  # noqa: E402

workload, prompts, out = sys.argv[1], sys.argv[2], sys.argv[3]
keep = {int(x) for x in sys.argv[4].split(",") if x} if len(sys.argv) > 4 else set()
sys.argv = ["lynx", "eval", "accept", "--workloads", workload, "--prompts", prompts,
            "--new-tokens", "64", "--threads", "1", "--quiet", "--codecs", "lynx",
            "--codec-arg", "lynx:layer_anchor_bits=[[18,5,4],[23,5,4]]",
            "--codec-arg", "lynx:v_chunk_size=64",
            "--codec-arg", "lynx:layer_v_chunk_size=[[3,32],[4,32],[5,32],[6,32],[7,32],[8,32],[9,32]]",
            "--json", out] + (["--qmsum-tokens", "3072"] if workload == "qmsum" else [])
levels = gb.fp_levels(3, 4)
exact_range = lynx_ref.page_range
layer = [-1]  # the layer being encoded (accept.reconstruct: for_layer, then encode)
for_layer = LynxCodec.for_layer


def recording_for_layer(self, i, num_layers):
    layer[0] = i
    return for_layer(self, i, num_layers)


LynxCodec.for_layer = recording_for_layer
lynx_ref.page_range = lambda x: (exact_range(x) if layer[0] in keep
                                 else gb.outward(*gb.exact_range(x), levels, 8))
main()
