"""The launcher (python -m lynx_npu.integration.lmcache.server): its --lynx-* options become the
serde of the --l2-adapter JSON, bad input is one line on stderr and exit status 2, and the real
LMCache multiprocess server it starts has "lynx" registered (it comes up with the serde on an
fs adapter, and a bad lynx entry is refused by the serde's own check, where LMCache's server
started directly does not know the type at all)."""
import json
import os
import socket
import subprocess
import sys
import time

import pytest

from .conftest import lmcache_or_skip
from .server_proc import stop_server

lmcache_or_skip()

from lynx_npu.integration.lmcache import server  # noqa: E402

LAUNCHER = [sys.executable, "-m", "lynx_npu.integration.lmcache.server"]
ENV = {**os.environ, "LMCACHE_TRACK_USAGE": "false"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(args, timeout=60):
    return subprocess.run(LAUNCHER + args, capture_output=True, text=True, env=ENV,
                          timeout=timeout)


def adapters(argv):
    return [json.loads(argv[i + 1]) for i, a in enumerate(argv) if a == "--l2-adapter"]


def test_the_serde_goes_on_every_adapter_that_names_none():
    args, rest = server._parser().parse_known_args(
        ["--port", "7", "--lynx-codec", "lynx-int8", "--lynx-head-dim", "64",
         "--lynx-kv-layout", "vllm_cpu_vec",
         "--l2-adapter", '{"type": "fs", "base_path": "/a"}',
         "--l2-adapter={\"type\": \"fs\", \"base_path\": \"/b\", \"serde\": null}",
         "--l2-adapter", '{"type": "fs", "base_path": "/c", "serde": {"type": "fp8"}}',
         "--chunk-size", "128"])
    out = server.with_serde(rest, server.serde_entry(args))
    a, b, c = adapters(out)
    assert a == {"type": "fs", "base_path": "/a",
                 "serde": {"type": "lynx", "codec": "lynx-int8", "head_dim": 64,
                           "kv_layout": "vllm_cpu_vec"}}
    assert b["serde"] is None  # kept raw
    assert c["serde"] == {"type": "fp8"}  # named by the user: left alone
    # LMCache's own arguments pass through in order
    assert out[:2] == ["--port", "7"] and out[-2:] == ["--chunk-size", "128"]


@pytest.mark.parametrize("args, message", [
    (["--lynx-codec", "lynx", "--l2-adapter", '{"type": "fs"}'], "needs --lynx-head-dim"),
    (["--lynx-codec", "lynx", "--lynx-head-dim", "64", "--l2-adapter", "{bad"],
     "--l2-adapter is not JSON"),
    (["--lynx-codec", "int8", "--lynx-head-dim", "64", "--l2-adapter", '{"type": "fs"}'],
     "is not a Lynx codec"),
    (["--lynx-codec", "lynx", "--lynx-head-dim", "64", "--lynx-stage", "half",
      "--l2-adapter", '{"type": "fs"}'], "is not a stage of codec"),
    (["--lynx-codec", "lynx", "--lynx-head-dim", "64"], "no --l2-adapter"),
    (["--lynx-head-dim", "64", "--l2-adapter", '{"type": "fs"}'], "needs --lynx-codec"),
])
def test_bad_options_are_one_line_and_exit_2(args, message):
    r = launch(args)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], r.stderr
    assert lines[0].startswith("python -m lynx_npu.integration.lmcache.server: error: ")


def fs_adapter(tmp_path, serde=None):
    spec = {"type": "fs", "base_path": str(tmp_path)}
    if serde is not None:
        spec["serde"] = serde
    return ["--l2-adapter", json.dumps(spec)]


def server_args(port):
    return ["--port", str(port), "--disable-metrics", "--l1-size-gb", "0.05",
            "--eviction-policy", "LRU", "--chunk-size", "128"]


def test_the_launched_server_comes_up_with_the_lynx_serde(tmp_path):
    log = tmp_path / "server.log"
    with log.open("w") as f:
        proc = subprocess.Popen(
            LAUNCHER + ["--lynx-codec", "lynx", "--lynx-head-dim", "64"]
            + server_args(free_port()) + fs_adapter(tmp_path / "l2"),
            stdout=f, stderr=subprocess.STDOUT, env=ENV)
    try:
        t0 = time.monotonic()
        while "cache server is running..." not in log.read_text():
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() - t0 < 60, "the server did not come up in 60 s"
            time.sleep(0.1)
        assert "Initialized FSL2Adapter" in log.read_text()
    finally:
        rc = stop_server(proc)  # LMCache's own shutdown path (SIGINT, then SIGTERM)
    assert rc == 0, log.read_text()[-3000:]
    assert "MPCacheServer closed" in log.read_text()


def test_lynx_is_registered_in_the_launched_server_and_not_in_lmcaches_own(tmp_path):
    # A lynx entry the launcher passes through untouched (it names its serde): only the
    # serde's own factory, running inside LMCache's server, can refuse it this way.
    bad = fs_adapter(tmp_path, {"type": "lynx", "head_dim": 64, "codec": "int8"})
    r = launch(server_args(free_port()) + bad)
    assert r.returncode != 0
    assert "codec='int8' is not a Lynx codec" in r.stderr + r.stdout
    direct = subprocess.run([sys.executable, "-m", "lmcache.v1.multiprocess.server"]
                            + server_args(free_port()) + bad,
                            capture_output=True, text=True, env=ENV, timeout=60)
    assert direct.returncode != 0
    assert "lynx" in direct.stderr and "Lynx codec" not in direct.stderr
