"""A small proxy in front of a Lynx prefill server and a Lynx decode server (OpenAI API).

    python -m lynx_npu.integration.vllm_ascend.tools.proxy --port 8000 \\
        --prefill http://prefill-host:8100 --decode http://decode-host:8200

For each ``/v1/completions`` or ``/v1/chat/completions`` request it picks a transfer id (a
client may choose the ``codec`` and ``max_drafts`` in its own ``kv_transfer_params["lynx"]``), sends
the request to the decode server (which waits for the KV) and a one-token copy to the prefill
server (which computes the prompt and streams its KV to the decode server, anchor first), and
returns the decode server's response, streamed or not, unchanged. Both servers see the same
prompt, so they tokenize it identically. Anything else (``/v1/models``, ...) goes to the decode
server.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import secrets

log = logging.getLogger("lynx.proxy")
GENERATE = ("/v1/completions", "/v1/chat/completions")


def split_request(body: dict, transfer_id: int) -> tuple[dict, dict]:
    """-> (prefill body, decode body) for one client request."""
    if not isinstance(body, dict):
        raise ValueError("the request body must be a JSON object")
    if not 0 < transfer_id < 2**63:
        raise ValueError(f"{transfer_id=} must be in [1, 2**63)")
    params = {"lynx": {**_client_options(body), "transfer_id": transfer_id}}
    decode = dict(body, kv_transfer_params=params)
    prefill = dict(body, kv_transfer_params=params, max_tokens=1, stream=False)
    prefill.pop("stream_options", None)
    if "max_completion_tokens" in prefill:
        prefill["max_completion_tokens"] = 1
    prefill.pop("n", None)
    return prefill, decode


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


def make_app(prefill_url: str, decode_url: str):
    from aiohttp import ClientSession, ClientTimeout, web

    async def on_startup(app):
        app["session"] = ClientSession(timeout=ClientTimeout(total=None, sock_connect=10))

    async def on_cleanup(app):
        await app["session"].close()

    async def generate(request: web.Request) -> web.StreamResponse:
        try:
            body = await request.json()
            prefill_body, decode_body = split_request(body, new_transfer_id())
        except ValueError as e:
            return web.json_response({"error": str(e)}, status=400)
        session = request.app["session"]
        path = request.path
        # Both at once: the decode request waits (WAITING_FOR_REMOTE_KVS) for the KV, and KV
        # that arrives before it is held by the decode server's receiver.
        decode_req = asyncio.ensure_future(session.post(decode_url + path, json=decode_body))
        prefill = asyncio.ensure_future(session.post(prefill_url + path, json=prefill_body))
        prefill.add_done_callback(_log_prefill)
        decode = await decode_req
        response = web.StreamResponse(status=decode.status, headers={
            "Content-Type": decode.headers.get("Content-Type", "application/json")})
        await response.prepare(request)
        async for chunk in decode.content.iter_any():
            await response.write(chunk)
        await response.write_eof()
        decode.release()
        return response

    async def passthrough(request: web.Request) -> web.Response:
        session = request.app["session"]
        async with session.request(request.method, decode_url + request.path_qs,
                                   data=await request.read()) as r:
            return web.Response(status=r.status, body=await r.read(),
                                content_type=r.content_type)

    app = web.Application()
    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    for path in GENERATE:
        app.router.add_post(path, generate)
    app.router.add_route("*", "/{tail:.*}", passthrough)
    return app


def _log_prefill(fut: asyncio.Future) -> None:
    try:
        r = fut.result()
        if r.status != 200:
            log.warning("prefill server answered %d; the decode server recomputes the prompt "
                        "after its transfer timeout", r.status)
        r.release()
    except Exception as e:  # noqa: BLE001 - logged, the decode side recovers
        log.warning("prefill request failed: %s", e)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lynx_npu.integration.vllm_ascend.tools.proxy",
                                description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--prefill", required=True, help="prefill server URL, e.g. http://h:8100")
    p.add_argument("--decode", required=True, help="decode server URL, e.g. http://h:8200")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    from aiohttp import web
    web.run_app(make_app(args.prefill.rstrip("/"), args.decode.rstrip("/")), host=args.host,
                port=args.port)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
