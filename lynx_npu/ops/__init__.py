"""lynx_npu.ops"""
