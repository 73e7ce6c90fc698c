"""lynx_npu.transport: split-stream KV transfer over TCP (anchor stream first).

    receiver = Receiver(ReceiverConfig())                       # decode instance
    sender = Sender(SenderConfig(port=receiver.port, gbps=10))  # prefill instance
    sender.send(request_id, lynx_npu.get_codec("lynx"), [(k, v) for each layer])
    handle = receiver.request(request_id)
    handle.anchor_ready.wait(); ...; handle.residual_ready.wait()
"""
from .config import ReceiverConfig, SenderConfig  # noqa: F401
from .errors import (AuthenticationError, HandshakeError, IncompatiblePeerError,  # noqa: F401
                     RemoteError, TransferDeadlineError, TransferError, TransportClosed)
from .events import StageEvent  # noqa: F401
from .rate_limit import TokenBucket  # noqa: F401
from .receive_state import ReceiveHandle  # noqa: F401
from .receiver import Receiver  # noqa: F401
from .sender import SendHandle, Sender  # noqa: F401
