"""lynx_npu.wire: versioned frames for the anchor and residual streams (frame format v5), and
the compatibility description peers exchange when they meet (payload format, codec parameters).

See frame.py for the byte layout, compat.py for the description. Decoding raises only WireError
subclasses.
"""
from .compat import CodecSpec, Compat  # noqa: F401
from .crc import crc32c  # noqa: F401
from .errors import (ChecksumError, FrameFieldError, TruncatedFrameError,  # noqa: F401
                     UnknownCodecError, UnsupportedVersionError, WireError)
from .frame import (DATA_KINDS, DTYPE_CODES, DTYPES, HEADER_SIZE, MAGIC, NONCE_BYTES,  # noqa: F401
                    VERSION, BufferReader, Frame, FramePage, Kind, decode_frame, encode_frame,
                    frame_nbytes, frame_pages, max_data_payload, pack_header, page_table,
                    params_from_json, params_to_json, read_frame, table_nbytes)
from .limits import (DEFAULT_LIMITS, ReceiveLimits, WireLimits,  # noqa: F401
                     request_kv_bytes)
