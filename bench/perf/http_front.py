"""What the HTTP front alone costs per request: aiohttp against a bare asyncio protocol.

Both servers answer the same v2 JSON infer request (the digits input, 64 FP32 values) with the
same fixed 200-byte JSON answer after parsing the body with ``json.loads``: no model, no queue.
``aiohttp`` is an ``aiohttp.web`` application with one route (as the gateway and the floor use
it, less their middlewares); ``protocol`` is an ``asyncio.Protocol`` that splits HTTP/1.1
keep-alive requests on ``Content-Length`` itself (no header parsing beyond that), the least a
Python HTTP front can do on this event loop. Each runs in its own process on uvloop, loaded by
:mod:`bench.perf.loadgen` (closed loop, keep-alive) at each concurrency; the table gives
throughput and the server process's CPU µs per request (user + system, psutil), alternating
the servers ``--rounds`` times so a drifting machine hits both alike.

    .venv/bin/python -m bench.perf.http_front --concurrency 1 32 --duration 4 --rounds 2
"""

from __future__ import annotations

import asyncio
import json
import socket

from bench.perf import front_probe, loadgen

ANSWER = json.dumps({
    "model_name": "digits", "model_version": "1",
    "outputs": [{"name": "label", "datatype": "INT64", "shape": [1, 1], "data": [3]},
                {"name": "probabilities", "datatype": "FP32", "shape": [1, 10], "data": [0.1] * 10}],
}).encode()  # fmt: skip


def serve_aiohttp(sock: socket.socket) -> None:
    from aiohttp import web  # noqa: PLC0415

    async def infer(request: web.Request) -> web.Response:
        json.loads(await request.read())
        return web.Response(body=ANSWER, content_type="application/json")

    app = web.Application()
    app.router.add_post("/v2/models/{model}/infer", infer)
    loadgen.run(lambda: _serve_app(app, sock))


async def _serve_app(app, sock: socket.socket) -> None:
    from aiohttp import web  # noqa: PLC0415

    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.SockSite(runner, sock).start()
    await asyncio.Event().wait()


class BareHttp(asyncio.Protocol):
    """HTTP/1.1 keep-alive requests split on Content-Length; every answer is :data:`ANSWER`."""

    HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
            + str(len(ANSWER)).encode() + b"\r\n\r\n")  # fmt: skip

    def connection_made(self, transport) -> None:
        self.transport, self.buffer = transport, bytearray()

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while (end := self.buffer.find(b"\r\n\r\n")) >= 0:
            head = bytes(self.buffer[:end]).lower()
            at = head.find(b"content-length:")
            length = int(head[at + 15:].split(b"\r\n", 1)[0]) if at >= 0 else 0
            if len(self.buffer) < end + 4 + length:
                return
            body = bytes(self.buffer[end + 4:end + 4 + length])
            del self.buffer[:end + 4 + length]
            json.loads(body)
            self.transport.write(self.HEAD + ANSWER)


def serve_protocol(sock: socket.socket) -> None:
    async def main() -> None:
        server = await asyncio.get_running_loop().create_server(BareHttp, sock=sock)
        await server.serve_forever()

    loadgen.run(main)


SERVERS = {"aiohttp": serve_aiohttp, "protocol": serve_protocol}


if __name__ == "__main__":
    front_probe.main(SERVERS, "http", __doc__.splitlines()[0])
