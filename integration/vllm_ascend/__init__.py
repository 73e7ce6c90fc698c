"""vLLM / vLLM-Ascend plugin and LMCache connector for Lynx."""
