"""Split-stream KV transfer over the Mooncake transfer engine (DESIGN §5: the engine vLLM-Ascend's
own disaggregated-prefill connectors use; TCP in CI, RDMA or the NPU build in production).

The bytes move through the engine, pulled by the decode side; a small control connection says
what to pull:

    prefill (MooncakeSender)                         decode (MooncakeReceiver)
    serde encodes layer i  -> copies its pages into
    one host buffer registered with its engine
    control connection (TCP, the project's handshake: secret, codec compatibility):
      ANCHOR / RESIDUAL data frames (frame format v2: request, layer, page, tokens, codec and
      parameters, checked by read_frame) whose payload is a page descriptor: the sender
      engine's segment, address, length, CRC32C (mooncake_descriptor.py)
                                                     fetch queue: every pending anchor, of any
                                                     request, before any residual
                                                     engine batch reads into its registered
                                                     staging buffer; CRC32C; the TCP receiver's
                                                     ReceiveHandle (anchor_ready / residual_ready)
      <- ACK per page stream once read intact (ERROR: the request failed, with the reason)
    a request's buffers are unregistered when every stream is acknowledged or it fails

So the decode side reads all anchors of all pending requests before any residual, whatever
order the pages were offered in, and the receiver bounds everything a peer controls before it
reads (the frame decoder's limits, the page's payload cap, the control peer's own segment).
Same semantics as the TCP transport otherwise: handles, callbacks, deadlines, errors that name
the request and what was missing. Nothing here imports the integration.

    receiver = MooncakeReceiver(ReceiverConfig(), MooncakeConfig(protocol="tcp"))
    sender = MooncakeSender(SenderConfig(port=receiver.port), MooncakeConfig(protocol="tcp"))
    sender.send(request_id, lynx_npu.get_codec("lynx"), [(k, v) for each layer])
    handle = receiver.request(request_id); handle.anchor_ready.wait(); handle.residual_ready.wait()

The engine is an optional dependency (mooncake_engine.py says which package); importing this
module does not need it, constructing a sender or receiver does (EngineUnavailable otherwise).
"""
from .mooncake_descriptor import DescriptorError, PageDescriptor  # noqa: F401
from .mooncake_engine import (EngineUnavailable, MooncakeConfig, MooncakeEngine,  # noqa: F401
                              unavailable_reason)
from .mooncake_receiver import MooncakeReceiver  # noqa: F401
from .mooncake_sender import MooncakeSender  # noqa: F401

__all__ = ["DescriptorError", "EngineUnavailable", "MooncakeConfig", "MooncakeEngine",
           "MooncakeReceiver", "MooncakeSender", "PageDescriptor", "unavailable_reason"]
