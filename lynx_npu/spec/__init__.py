"""lynx_npu.spec"""
