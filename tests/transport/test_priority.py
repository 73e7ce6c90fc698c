"""The transport's threads run at a lower CPU priority than the model's (transport/priority.py)."""
import os
import re
import sys
import threading

import pytest

from lynx_npu.transport import ReceiverConfig, SenderConfig
from lynx_npu.transport.priority import lower_this_thread

from .helpers import assert_kv_equal, expected_kv, make_layers, pair, small_codec

WAIT = 30
linux = pytest.mark.skipif(not sys.platform.startswith("linux"),
                           reason="per-thread priorities are Linux's (setpriority on a thread id)")


def _nice(tid: int) -> int:
    return os.getpriority(os.PRIO_PROCESS, tid)


@pytest.mark.parametrize("value", [-1, 20, 1.5, True, "10"])
def test_thread_nice_is_checked_by_both_configs(value):
    for make in (lambda: SenderConfig(port=1, thread_nice=value),
                 lambda: ReceiverConfig(thread_nice=value)):
        with pytest.raises(ValueError, match=rf"thread_nice={value!r} must be an int in \[0, 19\]"):
            make()


@linux
def test_only_the_calling_thread_is_lowered():
    main = _nice(threading.get_native_id())
    seen = {}

    def worker():
        lower_this_thread(main + 7)
        seen["tid"] = threading.get_native_id()
        seen["nice"] = _nice(seen["tid"])
        lower_this_thread(main + 3)  # "at least": never raised back
        seen["again"] = _nice(seen["tid"])

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert seen["nice"] == seen["again"] == main + 7
    assert _nice(threading.get_native_id()) == main  # the rest of the process is untouched


@linux
@pytest.mark.parametrize("nice", [0, 10])
def test_readers_decoders_and_writers_run_at_thread_nice(nice):
    base = _nice(threading.get_native_id())
    if base > nice and nice:
        pytest.skip(f"this process already runs at nice {base}")
    codec, layers = small_codec("lynx"), make_layers(2, 200)
    with pair(receiver_kw={"thread_nice": nice}, sender_kw={"thread_nice": nice}) as (
            receiver, sender, _):
        sent = sender.send(7, codec, layers)
        handle = receiver.request(7)
        assert handle.wait(WAIT) and sent.wait(WAIT)
        assert_kv_equal(handle, expected_kv(codec, layers))
        names = {t.name for t in threading.enumerate()}
        lowered = [t for t in threading.enumerate()  # readers, page decoders, writers
                   if re.fullmatch(r"lynx-(recv-conn|decode-\d+|send-\d+)", t.name)]
        assert {t.name for t in lowered} >= {"lynx-recv-conn", "lynx-send-0", "lynx-decode-0"}, names
        want = max(base, nice)
        assert {t.name: _nice(t.native_id) for t in lowered} == {
            t.name: want for t in lowered}
        assert _nice(threading.get_native_id()) == base
