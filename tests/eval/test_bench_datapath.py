"""``lynx bench datapath`` on the CPU, tiny: the JSON the issue specifies, through the CLI."""
import json

import pytest

from lynx_npu import cli
from lynx_npu.eval import bench_datapath
from lynx_npu.ops import list_backends

pytestmark = pytest.mark.skipif(list_backends()["cpu"] is not None,
                                reason=f"cpu backend unavailable: {list_backends()['cpu']}")


@pytest.mark.parametrize("layout,order", [("vllm_cpu", "random"),
                                          ("vllm_ascend", "sequential")])
def test_json_schema(tmp_path, layout, order):
    out = tmp_path / "datapath.json"
    assert cli.main(["bench", "datapath", "--device", "cpu", "--tokens", "300", "--layers", "2",
                     "--kv-heads", "2", "--head-dim", "32", "--layout", layout,
                     "--block-order", order, "--repeats", "1", "--connections", "2",
                     "--json", str(out)]) == 0
    got = json.loads(out.read_text())
    for key, kind in {"device": str, "copy_gbps": float, "tokens": int, "compress_gbps": float,
                      "decompress_gbps": float, "wire_gbps": float, "exact": bool}.items():
        assert isinstance(got[key], kind), key
    assert got["device"].startswith("cpu") and got["tokens"] == 300 and got["exact"] is True
    assert min(got["copy_gbps"], got["compress_gbps"], got["decompress_gbps"],
               got["wire_gbps"]) > 0
    assert (got["layout"], got["block_order"], got["compress_backend"]) == (layout, order, "cpu")
    assert got["wire_bytes"] < got["kv_bytes"] < got["frame_bytes"] * 2


def test_a_reference_backend_is_refused():
    with pytest.raises(ValueError, match="reference codec"):
        bench_datapath.main(["--device", "cpu", "--tokens", "64", "--layers", "1",
                             "--kv-heads", "1", "--head-dim", "16", "--backend", "torch"])
