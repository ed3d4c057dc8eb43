"""A scriptable OpenAI-compatible chat-completions server on 127.0.0.1 for oracle tests.

Each test passes `respond(payload, headers) -> Reply`; the server records every call (document text,
headers, payload, status) and can answer late, drip its body a byte at a time, or echo headers.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Reply:
    status: int = 200
    body: bytes | str | dict = b""
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0  # before anything is sent
    drip_s: float | None = None  # send the body one byte at a time, this far apart


def completion(content: str | None, refusal: str | None = None) -> dict:
    message = {"role": "assistant", "content": content, "refusal": refusal}
    return {"choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}


def scores_reply(scores: dict) -> Reply:
    return Reply(body=completion(json.dumps(scores)))


def document_of(payload: dict) -> str:
    """The document text inside a rubric prompt."""
    content = payload["messages"][1]["content"]
    return content.split("<document>\n", 1)[1].split("\n</document>", 1)[0]


@dataclass
class Call:
    document: str
    payload: dict
    headers: dict[str, str]
    status: int


class _Server(ThreadingHTTPServer):
    # The client opens up to max_concurrency (16) connections at once: socketserver's default listen
    # backlog of 5 refuses some of them on a busy machine, a transport error no test asked for.
    request_queue_size = 64


class OracleServer:
    def __init__(self, respond: Callable[[dict, dict[str, str]], Reply]):
        self.respond = respond
        self.calls: list[Call] = []
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.in_flight = self.peak_in_flight = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # keep test output clean
                pass

            def do_POST(self) -> None:
                payload = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                headers = {k.lower(): v for k, v in self.headers.items()}
                with server.lock:
                    server.in_flight += 1
                    server.peak_in_flight = max(server.peak_in_flight, server.in_flight)
                try:
                    reply = server.respond(payload, headers)
                    with server.lock:
                        server.calls.append(Call(document_of(payload), payload, headers, reply.status))
                    self._send(reply)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up on this request
                finally:
                    with server.lock:
                        server.in_flight -= 1

            def _send(self, reply: Reply) -> None:
                if server.stopping.wait(reply.delay_s):
                    return
                body = reply.body
                if isinstance(body, dict):
                    body = json.dumps(body)
                data = body.encode() if isinstance(body, str) else body
                self.send_response(reply.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for name, value in reply.headers.items():
                    self.send_header(name, value)
                self.end_headers()
                if reply.drip_s is None:
                    self.wfile.write(data)
                    return
                for i in range(len(data)):
                    if server.stopping.wait(reply.drip_s):
                        return
                    self.wfile.write(data[i : i + 1])
                    self.wfile.flush()

        self._server = _Server(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.02,), daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def documents_answered(self, status: int = 200) -> list[str]:
        with self.lock:
            return [call.document for call in self.calls if call.status == status]

    def __enter__(self) -> OracleServer:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopping.set()
        self._server.shutdown()
        self._server.server_close()
        time.sleep(0)  # let handler threads see `stopping`
