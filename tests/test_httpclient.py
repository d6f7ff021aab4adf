"""The HTTP edge against real local servers: statuses, refusals, timeouts, SSE framing, abort."""

from __future__ import annotations

import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from smoke_support import free_port

from stackgate.edges import httpclient


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    chunks: list[bytes] = []
    pause_s = 0.0
    seen: list[str | None] = []  #: the Authorization header of each request

    def log_message(self, *args: object) -> None:
        pass

    def send(self, status: int, body: bytes, kind: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("content-type", kind)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        self.seen.append(self.headers.get("Authorization"))
        if self.path == "/slow":
            time.sleep(1.0)
        if self.path == "/ok":
            self.send(200, b'{"a": 1}')
        else:
            self.send(503, b"")

    def do_POST(self) -> None:
        self.seen.append(self.headers.get("Authorization"))
        self.rfile.read(int(self.headers["content-length"]))
        if self.path == "/plain":
            self.send(200, b"{}")
            return
        self.send_response(200)
        self.send_header("content-type", "text/event-stream; charset=utf-8")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        for chunk in self.chunks:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            self.wfile.flush()
            time.sleep(self.pause_s)
        if self.path == "/cut":  # the server dies mid-stream: its socket closes
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
        else:
            self.wfile.write(b"0\r\n\r\n")


@pytest.fixture
def server():
    Handler.chunks, Handler.pause_s, Handler.seen = [], 0.0, []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    httpd.handle_error = lambda *args: None  # a client that cut its stream is the point of a test
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_json_and_statuses(server):
    assert httpclient.get_json(server + "/ok") == {"a": 1}
    assert httpclient.request("GET", server + "/health").status == 503
    with pytest.raises(httpclient.HttpError) as caught:
        httpclient.get_json(server + "/health")
    assert (caught.value.kind, caught.value.status) == ("status", 503)


def test_a_port_nobody_listens_on_is_refused():
    with pytest.raises(httpclient.HttpError) as caught:
        httpclient.request("GET", f"http://127.0.0.1:{free_port()}/health")
    assert caught.value.kind == "refused"


def test_a_silent_server_times_out(server):
    with pytest.raises(httpclient.HttpError) as caught:
        httpclient.request("GET", server + "/slow", timeout_s=0.2)
    assert caught.value.kind == "timeout"


def test_events_are_framed_whatever_the_chunking(server):
    Handler.chunks = [
        b'data: {"n":',
        b' 1}\n\ndata: {"n": 2}\r\n\r\n: a comment\n\nda',
        b"ta: line one\ndata: line two\n\n",
        b"data: [DONE]\n\n",
    ]
    with httpclient.EventStream(server + "/generate", {"x": 1}) as stream:
        payloads = [data for _, data in stream.events()]
    assert payloads == [b'{"n": 1}', b'{"n": 2}', b"line one\nline two", b"[DONE]"]


def test_a_stream_cut_by_the_server_is_an_error(server):
    Handler.chunks = [b'data: {"n": 1}\n\n']
    stream = httpclient.EventStream(server + "/cut", {})
    seen = []
    with pytest.raises(httpclient.HttpError) as caught:
        for _, data in stream.events():
            seen.append(data)
    assert seen == [b'{"n": 1}'] and caught.value.kind == "closed"


def test_abort_from_another_thread_ends_a_blocked_read(server):
    Handler.chunks, Handler.pause_s = [b'data: {"n": 1}\n\n'] * 50, 0.2
    stream = httpclient.EventStream(server + "/generate", {})
    threading.Timer(0.3, stream.abort).start()
    seen = []
    with pytest.raises(httpclient.HttpError) as caught:
        for _, data in stream.events():
            seen.append(data)
    assert caught.value.kind == "aborted" and 0 < len(seen) < 50


def test_an_answer_that_is_not_an_event_stream_is_refused(server):
    with pytest.raises(httpclient.HttpError) as caught:
        list(httpclient.EventStream(server + "/plain", {}).events())
    assert caught.value.kind == "protocol" and "expected text/event-stream" in str(caught.value)


def test_a_bearer_key_is_sent_on_every_kind_of_request_and_never_in_an_error(server):
    key = httpclient.bearer("sk-edge")
    assert httpclient.get_json(server + "/ok", headers=key) == {"a": 1}
    Handler.chunks = [b"data: [DONE]\n\n"]
    assert [d for _, d in httpclient.EventStream(server + "/generate", {}, headers=key).events()] == [b"[DONE]"]
    with pytest.raises(httpclient.HttpError) as caught:
        httpclient.get_json(server + "/health", headers=key)
    assert Handler.seen == ["Bearer sk-edge"] * 3
    assert "sk-edge" not in str(caught.value)
    httpclient.request("GET", server + "/ok")
    assert Handler.seen[-1] is None  # no key, no header
