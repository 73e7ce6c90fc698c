"""lynx_npu.transport"""
