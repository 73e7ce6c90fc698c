"""The proxy: its request split (same prompt to both servers, one token on the prefill side,
the same transfer id on both), and the proxy against broken and hostile upstreams (issue 18
item 11). The upstreams are small real aiohttp servers on loopback that answer as a failing
vLLM server would; the proxy is the real one, in this process (``start_proxy``, served as
``main`` serves it) or as its own process."""
import asyncio
import os
import socket
import subprocess
import sys
import time

import pytest

from lynx_npu.integration.vllm_ascend.config import TransferParams
from lynx_npu.integration.vllm_ascend.tools.proxy import (
    Timeouts, main, make_app, new_transfer_id, split_request, start_proxy)

aiohttp = pytest.importorskip("aiohttp")
web = pytest.importorskip("aiohttp.web")


def test_split_chat_request():
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True,
            "stream_options": {"include_usage": True}, "max_completion_tokens": 64, "n": 2,
            "min_tokens": 30}
    pre, dec = split_request(body, 42)
    assert pre["messages"] == dec["messages"] == body["messages"]
    assert pre["max_tokens"] == pre["max_completion_tokens"] == 1 and pre["stream"] is False
    # what vLLM would refuse beside max_tokens 1 (min_tokens), or fan out (n)
    assert "stream_options" not in pre and "n" not in pre and "min_tokens" not in pre
    assert dec["stream"] is True and dec["max_completion_tokens"] == 64
    assert dec["n"] == 2 and dec["min_tokens"] == 30
    for b in (pre, dec):
        assert TransferParams.from_request(b["kv_transfer_params"]).transfer_id == 42
    assert "kv_transfer_params" not in body  # the client's body is not modified


@pytest.mark.parametrize("path,extra", [
    ("/v1/completions", {"prompt_logprobs": 1}),
    ("/v1/completions", {"echo": True, "logprobs": 0}),
    ("/v1/chat/completions", {"prompt_logprobs": 0}),
    ("/v1/chat/completions", {"echo": True, "top_logprobs": 2}),
])
def test_prompt_logprobs_go_to_the_decode_server_alone(path, extra):
    # They come from the prompt's forward: no prefill copy, no transfer (the decode server
    # would refuse it), the client's Lynx options dropped with it.
    body = {"prompt": "x", "kv_transfer_params": {"lynx": {"codec": "lynx-int8"}}, **extra}
    pre, dec = split_request(body, 7, path)
    assert pre is None and dec == {k: v for k, v in body.items() if k != "kv_transfer_params"}
    # echo alone, or logprobs of the output alone, still transfer
    for other in ({"echo": True}, {"logprobs": 1, "top_logprobs": 1}):
        pre, dec = split_request({"prompt": "x", **other}, 7, path)
        assert pre is not None and "kv_transfer_params" in dec


def test_bad_input():
    with pytest.raises(ValueError, match="JSON object"):
        split_request([1], 1)
    with pytest.raises(ValueError, match="transfer_id"):
        split_request({}, 0)
    assert 0 < new_transfer_id() < 2**63


def test_client_may_choose_codec_and_draft_cap_only():
    body = {"prompt": "x", "kv_transfer_params": {"lynx": {"codec": "lynx-int8", "max_drafts": 0}}}
    pre, dec = split_request(body, 7)
    for b in (pre, dec):
        p = TransferParams.from_request(b["kv_transfer_params"])
        assert (p.transfer_id, p.codec, p.max_drafts) == (7, "lynx-int8", 0)
    for bad in ({"lynx": {"peer": "evil:1"}}, {"lynx": {"transfer_id": 3}},
                {"lynx": {"drop_residual": True}}, {"other": {}}, {"lynx": 5}, [1]):
        with pytest.raises(ValueError, match="kv_transfer_params"):
            split_request({"prompt": "x", "kv_transfer_params": bad}, 7)


CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Upstream:
    """A loopback server that records each request and answers with ``answer(body)``; a request
    whose connection closes before its answer ends sets ``aborted`` (its handler is cancelled,
    or its write fails, where vLLM's server would abort the request)."""

    def __init__(self, answer):
        self.answer, self.requests, self.aborted = answer, [], asyncio.Event()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json() if request.can_read_body else None
        self.requests.append((request.path, request.headers.copy(), body))
        try:
            return await self.answer(request, body)
        except (asyncio.CancelledError, ConnectionResetError):
            self.aborted.set()
            raise

    async def __aenter__(self):
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        # shutdown_timeout: a handler still waiting at the end must not hold the test 60 s
        self.runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=0.5)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}"
        return self

    async def __aexit__(self, *exc):
        await self.runner.cleanup()


async def answer_json(request, body):
    return web.json_response({"kv": "kv_transfer_params" in (body or {})})


async def answer_500(request, body):
    return web.json_response({"error": "engine dead"}, status=500)


async def answer_hang_up(request, body):
    request.transport.close()
    await asyncio.sleep(3600)


async def answer_never(request, body):
    await asyncio.sleep(3600)


async def stream_forever(request, body):
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    for i in range(100000):
        await response.write(f"data: {i}\n\n".encode())
        await asyncio.sleep(0.02)


async def stream_then_stall(request, body):
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    await response.write(b"data: 0\n\n")
    await asyncio.sleep(3600)


def kv_link():
    """-> (prefill answer, decode answer): the decode server answers a request with transfer
    only once the prefill server has answered (the KV follows the prefill)."""
    kv = asyncio.Event()

    async def prefill(request, body):
        kv.set()
        return await answer_json(request, body)

    async def decode(request, body):
        if "kv_transfer_params" in body:
            await kv.wait()
        return await answer_json(request, body)
    return prefill, decode


async def wait_for_kv(request, body):
    """A decode server whose KV never comes: it answers only a request without transfer."""
    if "kv_transfer_params" in body:
        await asyncio.sleep(3600)
    return await answer_json(request, body)


class Proxy:
    def __init__(self, prefill_url, decode_url, max_request_bytes=32 << 20, **timeouts):
        self.app = make_app(prefill_url, decode_url, Timeouts(**timeouts), max_request_bytes)

    async def __aenter__(self):
        self.runner = await start_proxy(self.app, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}"
        self.session = aiohttp.ClientSession()
        return self

    async def __aexit__(self, *exc):
        await self.session.close()
        await self.runner.cleanup()

    async def post(self, path="/v1/chat/completions", **kw):
        """-> (status, parsed JSON answer, seconds taken)."""
        t0 = time.monotonic()
        async with self.session.post(self.url + path, **kw) as r:
            return r.status, await r.json(content_type=None), time.monotonic() - t0


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


def test_relays_the_decode_answer_and_sends_the_prefill_one_token():
    async def go():
        prefill, decode = kv_link()
        async with Upstream(prefill) as pre, Upstream(decode) as dec, \
                Proxy(pre.url, dec.url) as proxy:
            status, answer, _ = await proxy.post(json=CHAT)
            assert (status, answer) == (200, {"kv": True})
            (_, _, p), = pre.requests
            (_, _, d), = dec.requests
            assert p["max_tokens"] == 1 and d["max_tokens"] == 8
            assert p["kv_transfer_params"] == d["kv_transfer_params"]
    run(go())


def test_prompt_logprobs_request_reaches_only_the_decode_server():
    async def go():
        prefill, decode = kv_link()
        async with Upstream(prefill) as pre, Upstream(decode) as dec, \
                Proxy(pre.url, dec.url) as proxy:
            status, answer, _ = await proxy.post(json=dict(CHAT, prompt_logprobs=1))
            assert (status, answer) == (200, {"kv": False})
            assert pre.requests == [] and dec.requests[0][2]["prompt_logprobs"] == 1
    run(go())


def test_client_headers_forwarded_but_not_hop_by_hop():
    sent = {"Authorization": "Bearer sk-test", "X-Request-Id": "r1", "Keep-Alive": "timeout=5",
            "Proxy-Authorization": "Basic cHJveHk=", "Connection": "keep-alive, X-Hop",
            "X-Hop": "1", "Accept-Encoding": "br"}

    async def go():
        prefill, decode = kv_link()
        async with Upstream(prefill) as pre, Upstream(decode) as dec, \
                Proxy(pre.url, dec.url) as proxy:
            assert (await proxy.post(json=CHAT, headers=sent))[0] == 200
            assert (await proxy.post("/v1/models", json=CHAT, headers=sent))[0] == 200
            seen = [h for _, h, _ in pre.requests + dec.requests]
            assert len(seen) == 3
            for h in seen:
                assert h["Authorization"] == "Bearer sk-test" and h["X-Request-Id"] == "r1"
                for hop in ("Keep-Alive", "Proxy-Authorization", "X-Hop"):
                    assert hop not in h
                assert "x-hop" not in h.get("Connection", "").lower()
                assert "br" not in h.get("Accept-Encoding", "")
            assert dec.requests[-1][1]["Content-Type"] == "application/json"  # passthrough
    run(go())


def test_decode_unreachable_is_502_naming_it_and_no_prefill_request():
    async def go():
        dead = f"http://127.0.0.1:{free_port()}"
        async with Upstream(answer_json) as pre, Proxy(pre.url, dead) as proxy:
            status, answer, _ = await proxy.post(json=CHAT)
            assert status == 502 and answer["error"]["code"] == 502
            assert f"decode server {dead}" in answer["error"]["message"]
            assert pre.requests == []
    run(go())


def test_decode_that_never_answers_is_504_within_the_read_timeout():
    async def go():
        async with Upstream(answer_json) as pre, Upstream(answer_never) as dec, \
                Proxy(pre.url, dec.url, read_s=0.5) as proxy:
            status, answer, took = await proxy.post(json=CHAT)
            assert status == 504, answer
            assert f"decode server {dec.url} sent nothing for 0.5 s" in \
                answer["error"]["message"]
            assert 0.5 <= took < 5
            await asyncio.wait_for(dec.aborted.wait(), 2)  # and its request is closed
    run(go())


def test_decode_that_stalls_mid_stream_cuts_the_client_off_unfinished():
    async def go():
        async with Upstream(answer_json) as pre, Upstream(stream_then_stall) as dec, \
                Proxy(pre.url, dec.url, read_s=0.5) as proxy:
            t0 = time.monotonic()
            async with proxy.session.post(proxy.url + "/v1/completions",
                                          json=dict(CHAT, stream=True)) as r:
                assert r.status == 200
                assert await r.content.readline() == b"data: 0\n"
                with pytest.raises(aiohttp.ClientPayloadError):  # not a complete answer
                    await r.read()
            assert time.monotonic() - t0 < 5
            await asyncio.wait_for(dec.aborted.wait(), 2)
    run(go())


@pytest.mark.parametrize("prefill", ["unreachable", "error 500", "drops the connection"])
def test_failed_prefill_makes_the_decode_server_compute_the_prompt_at_once(prefill):
    async def go():
        answer = {"error 500": answer_500, "drops the connection": answer_hang_up}.get(
            prefill, answer_json)
        async with Upstream(answer) as pre, Upstream(wait_for_kv) as dec:
            pre_url = f"http://127.0.0.1:{free_port()}" if prefill == "unreachable" else pre.url
            async with Proxy(pre_url, dec.url, read_s=1.0) as proxy:
                status, answer, took = await proxy.post(json=CHAT)
            # The decode server waits for KV up to its transfer timeout; the client, here, is
            # answered by the re-sent request without kv_transfer_params.
            assert (status, answer) == (200, {"kv": False}) and took < 10
            assert [("kv_transfer_params" in b) for _, _, b in dec.requests] == [True, False]
            assert dec.aborted.is_set()  # the first request was closed, not left waiting
    run(go())


@pytest.mark.parametrize("body", ["[" * 100_000 + "]" * 100_000,
                                  '{"a":' * 100_000 + "1" + "}" * 100_000, "{", "[1]"],
                         ids=["100k-deep list", "100k-deep object", "malformed", "not an object"])
def test_bad_bodies_are_400(body):
    async def go():
        async with Upstream(answer_json) as pre, Upstream(answer_json) as dec, \
                Proxy(pre.url, dec.url) as proxy:
            status, answer, _ = await proxy.post(data=body)
            assert status == 400 and answer["error"]["type"] == "invalid_request_error"
            assert pre.requests == dec.requests == []
    run(go())


def test_body_over_the_limit_is_413():
    async def go():
        async with Upstream(answer_json) as pre, Upstream(answer_json) as dec, \
                Proxy(pre.url, dec.url, max_request_bytes=1000) as proxy:
            body = dict(CHAT, prompt="x" * 1000)
            async with proxy.session.post(proxy.url + "/v1/completions", json=body) as r:
                assert r.status == 413
            assert pre.requests == dec.requests == []
    run(go())


def test_client_that_leaves_mid_stream_aborts_the_decode_request():
    """The proxy as its own process (``main``), as deployed."""
    async def go():
        async with Upstream(answer_json) as pre, Upstream(stream_forever) as dec:
            port = free_port()
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "lynx_npu.integration.vllm_ascend.tools.proxy",
                "--port", str(port), "--prefill", pre.url, "--decode", dec.url,
                "--read-timeout", "5", stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                env={**os.environ, "PYTHONUNBUFFERED": "1"})
            try:
                url = f"http://127.0.0.1:{port}/v1/chat/completions"
                async with aiohttp.ClientSession() as session:
                    for _ in range(300):  # wait until it listens
                        try:
                            (await asyncio.open_connection("127.0.0.1", port))[1].close()
                            break
                        except OSError:
                            await asyncio.sleep(0.1)
                    async with session.post(url, json=dict(CHAT, stream=True)) as r:
                        assert r.status == 200
                        assert (await r.content.readline()).startswith(b"data: ")
                        assert not dec.aborted.is_set()
                        r.close()  # the client leaves mid-stream
                    await asyncio.wait_for(dec.aborted.wait(), 5)
            finally:
                proc.terminate()
                _, err = await proc.communicate()
            assert b"Traceback" not in err, err.decode()
    run(go())


@pytest.mark.parametrize("argv", [
    ["--connect-timeout", "0"], ["--read-timeout", "inf"], ["--read-timeout", "nan"],
    ["--read-timeout", "-1"], ["--port", "70000"], ["--decode", "localhost:8200"]],
    ids=lambda argv: " ".join(argv))
def test_bad_command_lines_are_refused(argv, capsys):
    base = {"--prefill": "http://127.0.0.1:8100", "--decode": "http://127.0.0.1:8200"}
    for flag, value in zip(argv[::2], argv[1::2]):
        base[flag] = value
    with pytest.raises(SystemExit) as e:
        main([x for kv in base.items() for x in kv])
    err = capsys.readouterr().err
    assert e.value.code == 2 and argv[0] in err and "must be" in err, err


def test_timeouts_validated():
    for bad in (0, -1, float("nan"), float("inf"), True, "5"):
        with pytest.raises(ValueError, match="read_s"):
            Timeouts(read_s=bad)
    assert Timeouts() == Timeouts(connect_s=10.0, read_s=900.0)
