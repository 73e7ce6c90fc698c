"""LocalPair's decode port (tools/local_pair.py): a port chosen free can be taken before the
decode instance's receiver binds it (a CI run lost the Gemma 3 pair that way: "Address already
in use"); ``port_taken`` is what tells that failure apart from any other before a retry."""
import socket

from lynx_npu.integration.vllm_ascend.tools.local_pair import (_ephemeral_low, free_port,
                                                               port_taken)


def test_port_taken_sees_a_listener_and_its_release():
    port = free_port()
    assert not port_taken(port)
    with socket.create_server(("127.0.0.1", port)):
        assert port_taken(port)
    assert not port_taken(port)


def test_free_ports_lie_below_the_ephemeral_range():
    """vLLM's engines bind(0) for their own ports, i.e. in the ephemeral range: the ports
    chosen for the decode receivers (one per tensor-parallel rank) lie below it, all free."""
    low = _ephemeral_low()
    for count in (1, 2, 4):
        base = free_port(count=count)
        assert base + count <= low
        assert not any(port_taken(p) for p in range(base, base + count))
