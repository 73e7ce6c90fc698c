"""The documented command lines are the generated ones, and they say what the engine args say."""
import json
import os
import pathlib
import subprocess
from dataclasses import replace

import pytest

from lynx_npu.integration.vllm_ascend.tools.engine_config import decode_engine_args
from lynx_npu.integration.vllm_ascend.tools.serve_commands import (DOC_DEPLOYMENTS, Deployment,
                                                                   commands, doc_blocks,
                                                                   engine_flags, render,
                                                                   update_doc)

DEPLOY_MD = pathlib.Path(__file__).resolve().parents[4] / "docs" / "deploy.md"


def test_doc_blocks_are_the_generated_commands():
    blocks = doc_blocks(DEPLOY_MD.read_text())
    assert set(blocks) == set(DOC_DEPLOYMENTS)
    for name, d in DOC_DEPLOYMENTS.items():
        assert blocks[name] == render(d), (
            f"docs/deploy.md's {name!r} block is stale: run python -m "
            f"lynx_npu.integration.vllm_ascend.tools.serve_commands --update-doc docs/deploy.md")


@pytest.mark.parametrize("name", sorted(DOC_DEPLOYMENTS))
def test_rendered_shell_text_parses_back_to_the_argv(name):
    """What a user pastes into bash is exactly commands(): bash itself runs the text, with
    ``python`` and ``vllm`` defined as functions that print their arguments."""
    d = DOC_DEPLOYMENTS[name]
    env = dict(os.environ, MODEL="/models/m", LYNX_SECRET="s" * 32)
    printers = "".join(f'{cmd}() {{ for a in {cmd} "$@"; do printf "%s\\0" "$a"; done; '
                       f'printf "\\1"; }}\n' for cmd in ("python", "vllm"))
    script = printers + render(d).replace(" &\n", "\n")
    out = subprocess.run(["bash", "-c", script], env=env, check=True,
                         capture_output=True).stdout.decode()
    got = [cmd.split("\0")[:-1] for cmd in out.split("\1")[:-1]]
    want = [[w.replace("$MODEL", "/models/m").replace("$LYNX_SECRET", "s" * 32) for w in argv]
            for argv in commands(d).values()]
    assert got == want


def test_commands_carry_the_engine_args():
    d = replace(DOC_DEPLOYMENTS["cpu"], model="/m", receiver_port=17999)
    argv = commands(d)["decode"]
    want = decode_engine_args("/m", host="127.0.0.1", port=17999, **d.engine)
    got = json.loads(argv[argv.index("--kv-transfer-config") + 1])
    assert got == want["kv_transfer_config"]
    assert "--no-enable-prefix-caching" in argv
    assert argv[argv.index("--scheduler-cls") + 1] == want["scheduler_cls"]
    prefill = commands(d)["prefill"]
    extra = json.loads(prefill[prefill.index("--kv-transfer-config") + 1])
    assert extra["kv_connector_extra_config"]["peer"] == "127.0.0.1:17999"
    assert engine_flags({"a_b": True, "c": False, "d": {"x": 1}, "e": 2}) == [
        "--a-b", "--no-c", "--d", '{"x": 1}', "--e", "2"]


def test_bad_deployments_are_refused():
    with pytest.raises(ValueError, match="launcher"):
        Deployment(model="m", launcher="docker")
    with pytest.raises(ValueError, match="distinct"):
        Deployment(model="m", prefill_port=8000, proxy_port=8000)


def test_update_doc_rewrites_a_stale_block(tmp_path):
    doc = tmp_path / "deploy.md"
    doc.write_text("x\n<!-- serve-commands:cpu -->\n```bash\nold\n```\ny\n")
    assert update_doc(doc) and not update_doc(doc)
    assert doc_blocks(doc.read_text())["cpu"] == render(DOC_DEPLOYMENTS["cpu"])
    doc.write_text("<!-- serve-commands:nope -->\n```bash\n```\n")
    with pytest.raises(ValueError, match="unknown deployments"):
        update_doc(doc)
