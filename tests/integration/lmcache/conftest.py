import contextlib
import os
import pathlib

import pytest

# LMCache reports usage to its authors unless told not to (lmcache/usage_telemetry/).
os.environ.setdefault("LMCACHE_TRACK_USAGE", "false")


def lmcache_or_skip():
    try:
        import lmcache.v1.distributed.serde  # noqa: F401
    except Exception as e:  # ImportError, or a broken install's own error
        pytest.skip(f"lmcache does not import ({type(e).__name__}: {e}); install it with "
                    f"pip install --no-deps lmcache==0.5.6 (ci/install.sh)")


@contextlib.contextmanager
def no_leaked_kv_segments():
    """LMCache moves a CPU KV cache into a POSIX shared-memory segment (/dev/shm/lmcache_kv_
    <pid>_<n>, lmcache/v1/platform/devices/cpu/shm.py) that it unlinks only when the tensor is
    collected; a vLLM engine process ends without that, and each segment (the test's 0.25 GB
    cache) would hold RAM until reboot. Remove those the block's processes left, once gone."""
    shm = pathlib.Path("/dev/shm")
    before = set(shm.glob("lmcache_kv_*")) if shm.is_dir() else set()
    try:
        yield
    finally:
        for seg in (set(shm.glob("lmcache_kv_*")) if shm.is_dir() else set()) - before:
            pid = seg.name.split("_")[2]
            if pid.isdigit() and not pathlib.Path(f"/proc/{pid}").exists():
                seg.unlink(missing_ok=True)
