"""Engine integrations (installed as lynx_npu.integration)."""
