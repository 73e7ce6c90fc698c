"""Start a documented Lynx deployment (two vLLM OpenAI servers and the proxy) as real processes,
and talk to it over HTTP. The command lines are serve_commands.commands() of the doc's ``cpu``
deployment with only the model path, the ports and (where a test asks) the emulated link rate
changed."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import replace

from lynx_npu.integration.vllm_ascend.tools.local_pair import free_port
from lynx_npu.integration.vllm_ascend.tools.serve_commands import (DOC_DEPLOYMENTS, Deployment,
                                                                   commands)


class ServerDied(RuntimeError):
    pass


class OpenAIPair:
    def __init__(self, model: str, log_dir, start_timeout_s: float = 600.0,
                 gbps: float | None = None):
        ports = set()
        while len(ports) < 4:
            ports.add(free_port())
        p, d, x, r = sorted(ports)
        self.deployment: Deployment = replace(DOC_DEPLOYMENTS["cpu"], model=model,
                                              prefill_port=p, decode_port=d, proxy_port=x,
                                              receiver_port=r)
        if gbps is not None:
            self.deployment = replace(self.deployment, gbps=gbps)
        env = dict(os.environ, **dict(self.deployment.env))
        env.setdefault("VLLM_LOGGING_LEVEL", "INFO")
        self.logs = {}
        self.procs: dict[str, subprocess.Popen] = {}
        vllm_ports = free_port(count=48)
        while any(vllm_ports <= port < vllm_ports + 48 for port in ports):
            vllm_ports = free_port(count=48)
        try:
            for i, (role, argv) in enumerate(commands(self.deployment).items()):
                argv = [sys.executable if w == "python" else w for w in argv]
                self.logs[role] = log_dir / f"{role}.log"
                # Each server's own ports (torch.distributed's store) from a base of its own
                # below the ephemeral range: drawn by bind(0), as vLLM draws them, a store's
                # port was taken before it listened once (EADDRINUSE, 0.23, 2026-11-29).
                role_env = dict(env, VLLM_PORT=str(vllm_ports + 16 * i))
                self.procs[role] = subprocess.Popen(
                    argv, env=role_env, stdout=self.logs[role].open("wb"),
                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
            deadline = time.monotonic() + start_timeout_s
            for role in ("decode", "prefill", "proxy"):
                self._wait_healthy(role, deadline)
        except BaseException:
            self.close()
            raise

    def url(self, role: str) -> str:
        return self.deployment.url(role)

    def log_tail(self, role: str, n: int = 60) -> str:
        lines = self.logs[role].read_text(errors="replace").splitlines()
        return "\n".join(lines[-n:])

    def check_alive(self, role: str) -> None:
        code = self.procs[role].poll()
        if code is not None:
            raise ServerDied(f"{role} exited with {code}:\n{self.log_tail(role)}")

    def _wait_healthy(self, role: str, deadline: float) -> None:
        path = "/health" if role != "proxy" else "/v1/models"
        while True:
            self.check_alive(role)
            try:
                if self.get(role, path)[0] == 200:
                    return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"{role} not healthy in time:\n{self.log_tail(role)}")
            time.sleep(1.0)

    def get(self, role: str, path: str, timeout: float = 10.0) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(self.url(role) + path, timeout=timeout) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode(errors="replace")

    def chat(self, body: dict, timeout: float = 900.0) -> dict:
        """POST a non-streaming chat request through the proxy; the parsed JSON response."""
        return self.post("/v1/chat/completions", body, timeout)

    def post(self, path: str, body: dict, timeout: float = 900.0, role: str = "proxy") -> dict:
        """POST a non-streaming request through the proxy (or straight to ``role``'s server);
        the parsed JSON response."""
        req = urllib.request.Request(self.url(role) + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read())

    def chat_stream(self, body: dict, timeout: float = 900.0) -> list[dict]:
        """POST a streaming chat request through the proxy; every parsed SSE chunk, in order."""
        req = urllib.request.Request(self.url("proxy") + "/v1/chat/completions",
                                     data=json.dumps(dict(body, stream=True)).encode(),
                                     headers={"Content-Type": "application/json"})
        chunks = []
        with urllib.request.urlopen(req, timeout=timeout) as r:
            for raw in r:
                line = raw.decode().strip()
                if not line.startswith("data:"):
                    continue
                data = line[len("data:"):].strip()
                if data == "[DONE]":
                    break
                chunks.append(json.loads(data))
        return chunks

    def close(self) -> None:
        """SIGTERM to each server's process group (its engine core and workers too), then
        SIGKILL what is left after 30 s."""
        for role in ("proxy", "prefill", "decode"):
            proc = self.procs.get(role)
            if proc is not None and proc.poll() is None:
                _signal_group(proc, signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                _signal_group(proc, signal.SIGKILL)
                proc.wait()


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass
