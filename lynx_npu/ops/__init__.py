"""lynx_npu.ops: the Lynx compress / decompress ops, dispatched per device.

The only package that knows about devices. Functions: api.py; backend choice: backends.py;
paged KV-cache layouts (as data): kv_layouts.py; page byte offsets: plan.py.
"""
from .api import (  # noqa: F401
    backend_for, compress, decompress, decompress_page, decompress_page_paged, decompress_paged,
)
from .backends import Backend, BackendUnavailable, list_backends, register_backend  # noqa: F401
from .kv_layouts import KV_CACHE_LAYOUTS, KVCacheLayout, get_layout  # noqa: F401
from .plan import LayerPlan, layer_plan, page_plan  # noqa: F401
