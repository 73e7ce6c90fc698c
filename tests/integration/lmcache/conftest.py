import os

import pytest

# LMCache reports usage to its authors unless told not to (lmcache/usage_telemetry/).
os.environ.setdefault("LMCACHE_TRACK_USAGE", "false")


def lmcache_or_skip():
    try:
        import lmcache.v1.distributed.serde  # noqa: F401
    except Exception as e:  # ImportError, or a broken install's own error
        pytest.skip(f"lmcache does not import ({type(e).__name__}: {e}); install it with "
                    f"pip install --no-deps lmcache==0.5.6 (ci/install.sh)")
