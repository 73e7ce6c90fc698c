"""``import lynx_npu`` and the core API work on a base install (no optional extras)."""
import subprocess
import sys

OPTIONAL = ["constriction", "triton", "transformers", "gguf", "vllm", "lmcache", "matplotlib"]

SCRIPT = f"""
import sys
for name in {OPTIONAL!r}:
    sys.modules[name] = None  # makes `import name` raise ImportError, as if not installed
import torch, lynx_npu
from lynx_npu import ops
k = torch.randn(2, 40, 64, dtype=torch.bfloat16)
codec = lynx_npu.get_codec("lynx")
k2, _ = codec.decode(codec.encode(k, k), stage="full")
assert k2.shape == k.shape
try:
    lynx_npu.get_codec("cachegen").encode(k, k)
except ImportError as e:
    assert "lynx_npu[eval]" in str(e), e
else:
    raise AssertionError("cachegen encoded without constriction")
print("ok")
"""


def test_import_without_optional_extras():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
