"""lynx_npu.eval"""
