"""Triton kernels (installed as lynx_npu.gpu)."""
