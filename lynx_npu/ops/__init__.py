"""lynx_npu.ops: the Lynx compress / decompress ops, dispatched per device.

The only package that knows about devices. Functions: api.py; backend choice: backends.py;
paged KV-cache layouts (as data): kv_layouts.py, a whole engine cache: paged_cache.py; page
byte offsets: plan.py; the page serde (cache -> wire pages -> cache) that the transport, the
vLLM connector and the benchmarks use: page_serde.py (wire frames placed by wire_layout.py).
"""
from .api import (  # noqa: F401
    backend_for, compress, decompress, decompress_page, decompress_page_paged, decompress_paged,
)
from .backends import Backend, BackendUnavailable, list_backends, register_backend  # noqa: F401
from .kv_layouts import KV_CACHE_LAYOUTS, KVCacheLayout, get_layout  # noqa: F401
from .plan import LayerPlan, layer_plan, page_plan  # noqa: F401
from .page_serde import EncodedLayer, PageSerde, WirePage, serde_for  # noqa: F401
from .paged_cache import PagedKVCache, slots_for_blocks  # noqa: F401
