"""The engine's /metrics reader and the accuracy client against a real local server that answers
whatever a test sets: the shapes SGLang writes, and hostile ones (serve/metrics.py, serve/accuracy.py)."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from stackgate.models.engines import NATIVE_GENERATE, OPENAI_CHAT, OPENAI_COMPLETIONS
from stackgate.serve import accuracy, metrics

#: /metrics as prometheus_client writes SGLang's families (a counter, a gauge per rank, a histogram).
SGLANG = """# HELP sglang:generation_tokens_total Number of generation tokens processed.
# TYPE sglang:generation_tokens_total counter
sglang:generation_tokens_total{engine_type="unified",model_name="/models/k2"} 4096.0
# HELP sglang:spec_accept_length Mean acceptance length of speculative decoding.
# TYPE sglang:spec_accept_length gauge
sglang:spec_accept_length{engine_type="unified",model_name="/models/k2",pp_rank="0",tp_rank="0"} 3.1
sglang:spec_accept_length{engine_type="unified",model_name="/models/k2",pp_rank="0",tp_rank="1"} 3.3
# HELP sglang:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE sglang:time_to_first_token_seconds histogram
sglang:time_to_first_token_seconds_bucket{le="0.1",model_name="/models/k2"} 2.0
sglang:time_to_first_token_seconds_bucket{le="+Inf",model_name="/models/k2"} 3.0
sglang:time_to_first_token_seconds_sum{model_name="/models/k2"} 0.42
sglang:time_to_first_token_seconds_count{model_name="/models/k2"} 3.0
"""


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    body = b""
    status = 200

    def log_message(self, *args: object) -> None:
        pass

    def answer(self) -> None:
        self.send_response(self.status)
        self.send_header("content-length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def do_GET(self) -> None:
        self.answer()

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["content-length"]))
        self.answer()


@pytest.fixture
def server():
    Handler.body, Handler.status = b"", 200
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_sglangs_exposition_is_read_whole(server):
    Handler.body = SGLANG.encode()
    found = metrics.scrape(server, "/metrics")
    assert found.total("sglang:generation_tokens_total") == 4096.0
    assert found.values("sglang:spec_accept_length") == [3.1, 3.3]
    assert dict(found.types)["sglang:time_to_first_token_seconds"] == "histogram"
    bucket = found.to_dict()["series"][4]
    assert bucket == {
        "name": "sglang:time_to_first_token_seconds_bucket",
        "labels": {"le": "+Inf", "model_name": "/models/k2"},
        "value": 3.0,
    }


@pytest.mark.parametrize(
    "body, why",
    [
        (b"\xff\xfe not utf-8", "the body is not UTF-8 (byte 0)"),
        (b'ok 1\nsglang:x{le="1"} 2 3 4\n', "line 2: a sample is not name{labels} value [timestamp]"),
        (b'sglang:x{a="\\q"} 1\n', 'line 1: a label is not name="value"'),
        (b"sglang:x 1 12.5\n", "line 1: '12.5' is not a timestamp"),
        (b"# TYPE 9x gauge\n", "line 1: TYPE names no valid metric"),
        (b"x 1\n" * (metrics.MAX_SERIES + 1), f"more than {metrics.MAX_SERIES} series"),
    ],
)
def test_a_hostile_body_is_one_clear_error_naming_the_url_and_line(server, body, why):
    Handler.body = body
    with pytest.raises(metrics.MetricsError) as raised:
        metrics.scrape(server, "/metrics")
    assert str(raised.value).startswith(f"{server}/metrics: ") and why in str(raised.value)


def test_a_body_larger_than_the_limit_is_refused_before_it_is_parsed(server):
    Handler.body = b"x 1\n" * (metrics.MAX_BYTES // 4 + 1)
    with pytest.raises(metrics.MetricsError, match=r"/metrics: the body is \d+ bytes, more than the 8388608 read"):
        metrics.scrape(server, "/metrics")


# --- the accuracy client ----------------------------------------------------------------------

ITEM = accuracy.Item("Answer with the number only. 17 + 25 =", "42")


@pytest.mark.parametrize(
    "api, body, got",
    [
        (NATIVE_GENERATE, b'{"text": " 42", "meta_info": {}}', "42"),
        (OPENAI_COMPLETIONS, b'{"choices": [{"text": " 42.\\n"}]}', "42"),
        (OPENAI_CHAT, b'{"choices": [{"message": {"role": "assistant", "content": "\\n42\\nbecause"}}]}', "42"),
    ],
)
def test_each_api_s_answer_is_read_and_normalised(server, api, body, got):
    Handler.body = body
    assert accuracy.ask(server, api, ITEM, 16).got == got


@pytest.mark.parametrize(
    "api, status, body, why",
    [
        (OPENAI_CHAT, 200, b'{"choices": []}', "the answer has no text at choices[0].message.content"),
        (OPENAI_CHAT, 200, b'{"choices": [{"message": {"content": 42}}]}', "no text at choices[0].message.content"),
        (NATIVE_GENERATE, 200, b"[1, 2]", "the answer has no text at text"),
        (NATIVE_GENERATE, 200, b"<html>", "not JSON"),
        (NATIVE_GENERATE, 500, b"\x1b[2Jboom", "HTTP 500: ?[2Jboom"),
    ],
)
def test_a_hostile_answer_is_a_clear_error_not_a_traceback(server, api, status, body, why):
    Handler.status, Handler.body = status, body
    with pytest.raises(accuracy.AccuracyError) as raised:
        accuracy.ask(server, api, ITEM, 16)
    assert why in str(raised.value)


def test_the_shipped_set_has_unique_prompts_and_one_line_answers():
    name, items = accuracy.load_set()
    assert name == "stackgate-exact-16" and len(items) == 16
    assert len({i.prompt for i in items}) == len(items)
    assert all(accuracy.normalise(i.answer) == i.answer for i in items)
