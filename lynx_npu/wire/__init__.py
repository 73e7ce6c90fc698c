"""lynx_npu.wire"""
