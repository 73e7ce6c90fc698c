"""Tooling around the vLLM plug-in: the local prefill + decode pair and ``lynx demo``, model
preparation, engine arguments and server command lines, and the OpenAI proxy. The plug-in itself
(connector, scheduler, proposer, compat) never imports from here."""
