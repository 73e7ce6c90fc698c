"""Lynx in LMCache (the ``lmcache`` extra): the Lynx codecs as an LMCache L2 serde.

serde.py: the object format and its exact size (no LMCache import); factory.py: LMCache's
Serializer / Deserializer around it, registered as serde type ``"lynx"`` on import;
server.py: ``python -m lynx_npu.integration.lmcache.server``, LMCache's multiprocess server with
the serde registered (LMCache has no plugin discovery). See docs/lmcache.md.
"""
