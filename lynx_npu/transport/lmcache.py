"""Split-stream KV transfer over LMCache (DESIGN §5; issue 17): the prefill side stores each
page's anchor and residual as two LMCache objects, every anchor of a request first; the decode
side reads every anchor, reports ``anchor_ready``, then reads the residuals. The project's
scheduler and connector stay in front (LMCache's own vLLM connectors cannot refine blocks after
decoding starts); LMCache moves and stores the bytes.

    prefill (LMCacheSender)                          decode (LMCacheReceiver)
    serde encodes layer i -> one wire frame per page
    and stream (exactly the TCP transport's frames)
    header object: a frame naming codec, layers,      request(rid): look the header object up
      tokens, shape; whether residuals follow         -> the codec gives every object's key and
    anchor objects of every layer                        size (PageSerde.page_nbytes)
      ... LMCache reports them all in L2 ...          prefetch the anchors of every pending
    residual objects                                    request (before any residual), check
                                                        each frame (CRC32C, limits, that it is
                                                        the page asked for), hand pages on
                                                      -> anchor_ready; then the residuals
                                                      -> residual_ready
                                                      release(rid): its objects are deleted

Keys (lmcache ObjectKey): model_name ``lynx-<receiver port>``, chunk_hash (request id, layer,
page), and cache_salt ``header`` / ``anchor`` / ``residual`` / ``abort``: a page's two objects
differ only in their salt; a request its sender failed gets an abort object (its ERROR frame),
which the receiver looks up every 50 ms and fails the request on at once.

The store is chosen for what works across two processes on a CPU host (LMCache 0.5.6,
--no-deps): each side runs its own LMCache StorageManager (``lmcache.v1.distributed``) whose
L2 is the ``fs_native`` adapter on one directory both can reach (LMCacheConfig.directory):
objects are files written under a temporary name and renamed, so a reader never sees half of
one, and a reader started first finds objects stored after it. The ``fs`` adapter needs
aiofiles, which the --no-deps install lacks; LMCache's multiprocess server was the other
candidate, but it is a cache server behind vLLM's connector whose API addresses KV by token
chunks of a registered engine's paged buffers, not arbitrary objects of a second process.
Limits: both instances need the one directory (one host, or a shared filesystem such as NFS
or 3FS: LMCache has L2 adapters for those and for Mooncake Store, not tested here); the
receiver polls for objects not yet stored (``poll_interval_s``); every byte is written to and
read from that filesystem (page cache on one host), so it is slower than the TCP transport on
the same link and the emulated link rate (LMCacheConfig.gbps, on the receiver) is on top of
that; there is no handshake: the directory's permissions are the access control (a secret
does not apply); objects of a request that is never released stay until a receiver of the
same port starts again and sweeps them.

    store = LMCacheConfig(directory="/dev/shm/lynx")
    receiver = LMCacheReceiver(ReceiverConfig(port=8100), store)
    sender = LMCacheSender(SenderConfig(port=8100), store)
    sender.send(request_id, lynx_npu.get_codec("lynx"), [(k, v) for each layer])
    handle = receiver.request(request_id); handle.anchor_ready.wait(); handle.wait()

LMCache is an optional dependency: importing this module does not need it, constructing a
sender or receiver does (LMCacheUnavailable otherwise). Set LMCACHE_TRACK_USAGE=false (this
module's store does, if it is unset) to keep LMCache's usage telemetry off.
"""
from .lmcache_receiver import LMCacheReceiver  # noqa: F401
from .lmcache_sender import LMCacheSender  # noqa: F401
from .lmcache_store import (HEADER_OBJECT_BYTES, LMCacheConfig, LMCacheStore,  # noqa: F401
                            LMCacheUnavailable, unavailable_reason)

__all__ = ["HEADER_OBJECT_BYTES", "LMCacheConfig", "LMCacheReceiver", "LMCacheSender",
           "LMCacheStore", "LMCacheUnavailable", "unavailable_reason"]
