"""``lynx bench datapath`` on the CPU, tiny: the JSON the issue specifies, through the CLI."""
import json
import socket

import pytest
import torch

from lynx_npu import cli
from lynx_npu.eval import bench_datapath
from lynx_npu.ops import WirePage, list_backends
from lynx_npu.ops.page_serde import EncodedLayer

pytestmark = pytest.mark.skipif(list_backends()["cpu"] is not None,
                                reason=f"cpu backend unavailable: {list_backends()['cpu']}")


@pytest.mark.parametrize("layout,order,peer", [("vllm_cpu", "random", "process"),
                                               ("vllm_ascend", "sequential", "thread")])
def test_json_schema(tmp_path, layout, order, peer):
    out = tmp_path / "datapath.json"
    assert cli.main(["bench", "datapath", "--device", "cpu", "--tokens", "300", "--layers", "2",
                     "--kv-heads", "2", "--head-dim", "32", "--layout", layout,
                     "--block-order", order, "--repeats", "2", "--connections", "2",
                     "--wire-peer", peer, "--json", str(out)]) == 0
    got = json.loads(out.read_text())
    for key, kind in {"device": str, "copy_gbps": float, "tokens": int, "compress_gbps": float,
                      "decompress_gbps": float, "wire_gbps": float, "exact": bool}.items():
        assert isinstance(got[key], kind), key
    assert got["device"].startswith("cpu") and got["tokens"] == 300 and got["exact"] is True
    assert min(got["copy_gbps"], got["compress_gbps"], got["decompress_gbps"],
               got["wire_gbps"]) > 0
    assert (got["layout"], got["block_order"], got["compress_backend"], got["wire_peer"]) \
        == (layout, order, "cpu", peer)
    assert got["wire_bytes"] < got["kv_bytes"] < got["frame_bytes"] * 2


def test_a_reference_backend_is_refused():
    with pytest.raises(ValueError, match="reference codec"):
        bench_datapath.main(["--device", "cpu", "--tokens", "64", "--layers", "1",
                             "--kv-heads", "1", "--head-dim", "16", "--backend", "torch"])


def test_the_wire_peer_reports_a_failure_in_one_line():
    """A peer that cannot connect: the benchmark raises with the peer's one-line error."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here
    layer = EncodedLayer([WirePage(0, 0, 16, memoryview(b"anchor"), None)], "test")
    with pytest.raises(RuntimeError, match=r"wire peer failed: wire peer: \w*(Connection|"
                                           r"Refused)\w*: [^\n]*$"):
        with bench_datapath._process_peer(port, None, "lynx", [layer], (1, 1, 16, 16),
                                          torch.bfloat16, 1):
            pass
