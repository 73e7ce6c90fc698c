"""A small proxy in front of a Lynx prefill server and a Lynx decode server (OpenAI API).

    python -m lynx_npu.integration.vllm_ascend.tools.proxy --port 8000 \\
        --prefill http://prefill-host:8100 --decode http://decode-host:8200

For each ``/v1/completions`` or ``/v1/chat/completions`` request it picks a transfer id (a
client may choose the ``codec`` and ``max_drafts`` in its own ``kv_transfer_params["lynx"]``), sends
the request to the decode server (which waits for the KV) and a one-token copy to the prefill
server (which computes the prompt and streams its KV to the decode server, anchor first), and
returns the decode server's response, streamed or not, unchanged. A request for prompt logprobs
(``prompt_logprobs``, or ``echo`` with logprobs) goes to the decode server alone, without a
transfer: they come from the prompt's forward, which a KV load skips. Both servers see the same
prompt, so they tokenize it identically. Anything else (``/v1/models``, ...) goes to the decode
server. The client's headers (``Authorization``, ...) go to both servers, less the hop-by-hop
ones and those the proxy sets itself.

Failures, each answered at once and named (``{"error": {"message", "type", "code"}}``):

- the decode request is sent first, the prefill request only once the decode server has taken
  it (connection open, request sent): a decode server that cannot be reached is a 502 naming
  it, and no prefill work is started;
- ``--connect-timeout`` bounds every connection, ``--read-timeout`` every silence of an
  upstream (before its answer or between two reads): a decode server that takes the request
  and does not answer is a 504 naming it;
- a prefill request that fails (unreachable, connection lost, an error status) before the
  decode server's first bytes (which need the KV) makes the proxy abort the decode request (its
  connection is closed, which vLLM's server takes as an abort) and send it again without
  ``kv_transfer_params``: the decode server computes the prompt at once instead of waiting out
  its transfer timeout. Nothing goes to the client before those first bytes, so it never sees
  a byte of the aborted request. A prefill server that hangs cannot be told from a slow one:
  the decode server's own ``transfer_timeout_s`` (below the read timeout) covers it;
- a client that disconnects aborts every upstream request (its handler is cancelled: the
  runner needs ``handler_cancellation=True``, as ``main`` and ``start_proxy`` set);
- a body that is not a JSON object (malformed, nested too deep for the parser) is a 400, one
  over ``--max-request-mb`` a 413.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import secrets
from dataclasses import dataclass

log = logging.getLogger("lynx.proxy")
GENERATE = ("/v1/completions", "/v1/chat/completions")


def split_request(body: dict, transfer_id: int,
                  path: str = "/v1/completions") -> tuple[dict | None, dict]:
    """-> (prefill body, decode body) for one client request; (None, decode body) when the
    prompt must be computed on the decode server."""
    if not isinstance(body, dict):
        raise ValueError("the request body must be a JSON object")
    if not 0 < transfer_id < 2**63:
        raise ValueError(f"{transfer_id=} must be in [1, 2**63)")
    client = _client_options(body)
    if asks_prompt_logprobs(body, path):
        # They come from the prompt's forward, which a KV load skips: the decode server
        # would refuse the transfer (connector_scheduler), so none is started.
        return None, {k: v for k, v in body.items() if k != "kv_transfer_params"}
    params = {"lynx": {**client, "transfer_id": transfer_id}}
    decode = dict(body, kv_transfer_params=params)
    prefill = dict(body, kv_transfer_params=params, max_tokens=1, stream=False)
    prefill.pop("stream_options", None)
    if "max_completion_tokens" in prefill:
        prefill["max_completion_tokens"] = 1
    prefill.pop("n", None)        # one prefill for all samples (they share its transfer)
    # vLLM refuses min_tokens > max_tokens: a 400 there made every such request compute its
    # prompt on the decode server (the fallback below), silently.
    prefill.pop("min_tokens", None)
    return prefill, decode


def asks_prompt_logprobs(body: dict, path: str) -> bool:
    """vLLM's rule (its protocols' to_sampling_params): ``prompt_logprobs``, or ``echo`` with
    ``logprobs`` (completions) or ``top_logprobs`` (chat)."""
    if body.get("prompt_logprobs") is not None:
        return True
    logprobs = "top_logprobs" if path.endswith("/chat/completions") else "logprobs"
    return bool(body.get("echo")) and body.get(logprobs) is not None


# What a client may choose per request in its own kv_transfer_params["lynx"]. The rest (the
# transfer id, the prefill side's peer, fault injection) is the proxy's or the operator's.
CLIENT_OPTIONS = ("codec", "max_drafts")


def _client_options(body: dict) -> dict:
    params = body.get("kv_transfer_params")
    if params is None:
        return {}
    lynx = params.get("lynx") if isinstance(params, dict) else None
    if not isinstance(params, dict) or set(params) != {"lynx"} or not isinstance(lynx, dict):
        raise ValueError('kv_transfer_params must be {"lynx": {...}}')
    refused = set(lynx) - set(CLIENT_OPTIONS)
    if refused:
        raise ValueError(f"kv_transfer_params['lynx'] keys {sorted(refused)} are not the "
                         f"client's to set; allowed: {list(CLIENT_OPTIONS)}")
    return dict(lynx)


def new_transfer_id() -> int:
    return secrets.randbits(63) or 1


# Not forwarded from the client: hop-by-hop headers (RFC 9110 7.6.1), those the proxy's own
# request sets (the body is re-encoded as JSON), and Accept-Encoding (the proxy relays the
# upstream's answer decompressed, whatever the client accepts).
DROP_HEADERS = frozenset(h.lower() for h in (
    "Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "TE", "Trailer",
    "Transfer-Encoding", "Upgrade", "Host", "Content-Length", "Content-Type",
    "Content-Encoding", "Accept-Encoding", "Expect"))


def forwarded_headers(headers) -> dict[str, str]:
    """The client's headers to send upstream (Authorization, custom X- headers, ...)."""
    drop = set(DROP_HEADERS)
    for value in headers.getall("Connection", []):  # headers the client names hop-by-hop
        drop.update(v.strip().lower() for v in value.split(","))
    return {k: v for k, v in headers.items() if k.lower() not in drop}


@dataclass(frozen=True)
class Timeouts:
    connect_s: float = 10.0   # TCP connection to an upstream
    read_s: float = 900.0     # an upstream's silence (before its answer, or between two reads):
    #                           above the decode server's transfer_timeout_s (600) plus its
    #                           longest unstreamed generation, which sends no byte before the end

    def __post_init__(self):
        for name in ("connect_s", "read_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not 0 < value <= 86400:
                raise ValueError(f"{name}={value!r} must be a number in (0, 86400]")


class UpstreamError(Exception):
    """An upstream could not be used: -> the proxy's answer (502, or 504 for a timeout)."""

    def __init__(self, role: str, url: str, exc: BaseException, timeouts: Timeouts):
        from aiohttp import ConnectionTimeoutError
        self.status = 504 if isinstance(exc, asyncio.TimeoutError) else 502
        if isinstance(exc, ConnectionTimeoutError):
            why = f"could not be connected to within {timeouts.connect_s:g} s"
        elif self.status == 504:
            why = f"sent nothing for {timeouts.read_s:g} s"
        else:
            why = f"could not be reached or failed ({type(exc).__name__}: {exc})"
        super().__init__(f"{role} server {url} {why}")


def _error(status: int, message: str, kind: str = "upstream_error"):
    from aiohttp import web
    return web.json_response({"error": {"message": message, "type": kind, "code": status}},
                             status=status)


def make_app(prefill_url: str, decode_url: str, timeouts: Timeouts = Timeouts(),
             max_request_bytes: int = 32 << 20):
    from aiohttp import (ClientError, ClientResponse, ClientSession, ClientTimeout,
                         TCPConnector, TraceConfig, web)
    failed = (ClientError, OSError, asyncio.TimeoutError)  # an upstream that failed us
    session_key = web.AppKey("session", ClientSession)

    async def on_sent(session, ctx, params) -> None:
        if ctx.trace_request_ctx is not None:
            ctx.trace_request_ctx["sent"].set()

    async def on_startup(app):
        trace = TraceConfig()
        trace.on_request_headers_sent.append(on_sent)
        app[session_key] = ClientSession(
            # limit=0: no pool cap, or requests beyond 100 would queue here and time out
            connector=TCPConnector(limit=0),
            timeout=ClientTimeout(total=None, connect=timeouts.connect_s,
                                  sock_connect=timeouts.connect_s, sock_read=timeouts.read_s),
            trace_configs=[trace])

    async def on_cleanup(app):
        await app[session_key].close()

    async def post(url: str, body: dict, headers: dict, sent: asyncio.Event | None = None):
        ctx = {"sent": sent} if sent is not None else None
        return await app[session_key].post(url, json=body, headers=headers,
                                           trace_request_ctx=ctx)

    async def start_decode(url: str, body: dict, headers: dict) -> asyncio.Task:
        """The decode request, once its server has taken it (UpstreamError if it cannot)."""
        sent = asyncio.Event()
        task = asyncio.ensure_future(post(url, body, headers, sent))
        waiter = asyncio.ensure_future(sent.wait())
        try:
            await asyncio.wait({task, waiter}, timeout=timeouts.connect_s + timeouts.read_s,
                               return_when=asyncio.FIRST_COMPLETED)
        except BaseException:  # cancelled: the client left
            task.cancel()
            raise
        finally:
            waiter.cancel()
        if task.done() and task.exception() is not None:
            raise UpstreamError("decode", decode_url, task.exception(), timeouts)
        if not (task.done() or sent.is_set()):
            task.cancel()
            raise UpstreamError("decode", decode_url, asyncio.TimeoutError(), timeouts)
        return task

    async def first_bytes(decode: asyncio.Task) -> bytes:
        """The decode server's first body bytes: it has the KV (or computed the prompt)."""
        return await (await decode).content.readany()

    async def run_prefill(url: str, body: dict | None, headers: dict) -> str | None:
        """-> None when the prefill server computed the prompt (or was not asked to: body
        None), else why it did not."""
        if body is None:
            return None
        try:
            async with await post(url, body, headers) as r:
                text = await r.text()
                if r.status != 200:
                    return f"prefill server {prefill_url} answered {r.status}: " \
                           f"{' '.join(text.split())[:200]}"
                return None
        except failed as e:
            return str(UpstreamError("prefill", prefill_url, e, timeouts))

    async def abort(task: asyncio.Task) -> None:
        """Cancel an upstream request, or close its answer's connection: vLLM's server aborts
        a request whose connection closes."""
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        elif not task.cancelled() and task.exception() is None \
                and isinstance(task.result(), ClientResponse):
            task.result().close()  # after a full answer it was released: a no-op

    async def generate(request: web.Request) -> web.StreamResponse:
        try:
            body = await request.json()
            prefill_body, decode_body = split_request(body, new_transfer_id(), request.path)
        except RecursionError:
            return _error(400, "the request body is nested too deeply to parse",
                          "invalid_request_error")
        except ValueError as e:  # json.JSONDecodeError is one
            return _error(400, f"bad request body: {e}", "invalid_request_error")
        headers = forwarded_headers(request.headers)
        url = decode_url + request.path
        tasks = []  # every upstream request; those still open at the end are aborted
        try:
            # The decode request first; the prefill's work only once the decode server took it.
            try:
                decode = await start_decode(url, decode_body, headers)
            except UpstreamError as e:
                log.warning("%s; prefill not started", e)
                return _error(e.status, f"{e}; the prefill request was not started")
            prefill = asyncio.ensure_future(
                run_prefill(prefill_url + request.path, prefill_body, headers))
            first = asyncio.ensure_future(first_bytes(decode))
            tasks += [decode, prefill, first]
            # Nothing goes to the client before the decode server's first bytes, which need the
            # KV: a prefill failure before them is caught while the decode request can be redone.
            await asyncio.wait({prefill, first}, return_when=asyncio.FIRST_COMPLETED)
            if not first.done() and prefill.result() is not None:
                # The decode server would wait out its transfer timeout: abort the request
                # and send it again without KV transfer, so it computes the prompt now.
                log.warning("%s; decode request re-sent without kv_transfer_params",
                            prefill.result())
                await abort(first)
                await abort(decode)
                local = {k: v for k, v in decode_body.items() if k != "kv_transfer_params"}
                decode = await start_decode(url, local, headers)
                first = asyncio.ensure_future(first_bytes(decode))
                tasks += [decode, first]
            try:
                chunk = await first
            except failed as e:
                raise UpstreamError("decode", decode_url, e, timeouts) from e
            return await relay(request, decode.result(), chunk)
        except UpstreamError as e:
            log.warning("%s", e)
            return _error(e.status, str(e))
        finally:  # the client left, or anything failed: no upstream request left running
            for task in tasks:
                await abort(task)

    async def relay(request: web.Request, upstream: ClientResponse,
                    chunk: bytes) -> web.StreamResponse:
        response = web.StreamResponse(status=upstream.status, headers={
            "Content-Type": upstream.headers.get("Content-Type", "application/json")})
        await response.prepare(request)
        while chunk:
            await response.write(chunk)  # a client that left raises here (or is cancelled)
            try:
                chunk = await upstream.content.readany()
            except failed as e:
                # The status is out: closing the client's connection unfinished is all that
                # is left, so that it cannot take the answer for complete.
                log.warning("decode server %s failed mid-answer: %s", decode_url, e)
                raise
        await response.write_eof()
        upstream.release()
        return response

    async def passthrough(request: web.Request) -> web.Response:
        headers = forwarded_headers(request.headers)
        if "Content-Type" in request.headers:  # the body goes as it came
            headers["Content-Type"] = request.headers["Content-Type"]
        try:
            async with app[session_key].request(
                    request.method, decode_url + request.path_qs, data=await request.read(),
                    headers=headers) as r:
                return web.Response(status=r.status, body=await r.read(),
                                    content_type=r.content_type)
        except failed as e:
            err = UpstreamError("decode", decode_url, e, timeouts)
            log.warning("%s", err)
            return _error(err.status, str(err))

    app = web.Application(client_max_size=max_request_bytes)
    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    for path in GENERATE:
        app.router.add_post(path, generate)
    app.router.add_route("*", "/{tail:.*}", passthrough)
    return app


async def start_proxy(app, host: str, port: int):
    """Serve ``app`` (from make_app) as ``main`` does; -> the started AppRunner (cleanup()
    stops it). A client that disconnects cancels its handler, which aborts the upstreams."""
    from aiohttp import web
    runner = web.AppRunner(app, handler_cancellation=True)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner


def main(argv: list[str] | None = None) -> int:
    from lynx_npu.cli_types import int_in, number_in

    p = argparse.ArgumentParser(prog="python -m lynx_npu.integration.vllm_ascend.tools.proxy",
                                description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int_in(0, 65535), default=8000)
    p.add_argument("--prefill", required=True, help="prefill server URL, e.g. http://h:8100")
    p.add_argument("--decode", required=True, help="decode server URL, e.g. http://h:8200")
    p.add_argument("--connect-timeout", type=number_in(0, 86400, low_open=True), default=10.0,
                   help="seconds to connect to an upstream server (default 10)")
    p.add_argument("--read-timeout", type=number_in(0, 86400, low_open=True), default=900.0,
                   help="seconds an upstream may stay silent (default 900: above the decode "
                        "server's transfer_timeout_s plus its longest unstreamed answer)")
    p.add_argument("--max-request-mb", type=int_in(1, 4096), default=32,
                   help="largest request body accepted, in MiB (default 32)")
    args = p.parse_args(argv)
    for name in ("prefill", "decode"):
        url = getattr(args, name)
        if not url.startswith(("http://", "https://")):
            p.error(f"--{name} {url!r} must be an http:// or https:// URL")
    logging.basicConfig(level=logging.INFO)
    from aiohttp import web
    app = make_app(args.prefill.rstrip("/"), args.decode.rstrip("/"),
                   Timeouts(args.connect_timeout, args.read_timeout), args.max_request_mb << 20)
    web.run_app(app, host=args.host, port=args.port, handler_cancellation=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
