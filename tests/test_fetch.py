"""Checked downloads against a real HTTP server on 127.0.0.1 that drops connections mid-body,
honours or ignores Range, and answers errors: retries, resume, the final sha256."""

from __future__ import annotations

import hashlib
import http.server
import os
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import pytest

from stackgate.edges import fetch

BODY = bytes(range(256)) * 1200  # 300 KiB: several reads, cut in the middle
WANT = hashlib.sha256(BODY).hexdigest()


@dataclass
class Server:
    """Serves BODY at /file. The first ``drops`` answers stop half-way through their body and
    close the connection; ``statuses`` answer the first requests with those errors instead."""

    ranges: bool = True
    drops: int = 0
    statuses: list[int] = field(default_factory=list)
    requests: list[str | None] = field(default_factory=list)  #: each request's Range header
    sent: int = 0  #: body bytes written, over all answers

    def __post_init__(self) -> None:
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                owner.requests.append(self.headers.get("Range"))
                if owner.statuses:
                    self.send_error(owner.statuses.pop(0))
                    return
                start = (
                    int(match[1])
                    if owner.ranges and (match := re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range") or ""))
                    else 0
                )
                self.send_response(206 if start else 200)
                if start:
                    self.send_header("Content-Range", f"bytes {start}-{len(BODY) - 1}/{len(BODY)}")
                self.send_header("Content-Length", str(len(BODY) - start))
                self.send_header("ETag", '"v1"')
                self.end_headers()
                body = BODY[start:]
                if owner.drops > 0:
                    owner.drops -= 1
                    body = body[: len(body) // 2]  # then the connection closes: a drop mid-body
                owner.sent += len(body)  # counted first: the client may finish before this thread goes on
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/file"


@pytest.fixture
def serve() -> Iterator[type[Server]]:
    started: list[Server] = []

    def make(**kwargs: object) -> Server:
        server = Server(**kwargs)  # type: ignore[arg-type]
        started.append(server)
        return server

    yield make  # type: ignore[misc]
    for server in started:
        server.httpd.shutdown()
        server.httpd.server_close()


def _retry(waits: list[float], attempts: int = 5) -> fetch.Retry:
    return fetch.Retry(attempts=attempts, sleep=waits.append)


def test_a_download_cut_twice_resumes_where_it_stopped(tmp_path: Path, serve: type[Server]) -> None:
    server = serve(drops=2)
    waits: list[float] = []
    notes: list[str] = []
    progress: list[tuple[int, int | None]] = []
    target = tmp_path / "cuda.run"
    assert fetch.fetch_checked(
        server.url,
        target,
        WANT,
        retry=_retry(waits),
        on_retry=notes.append,
        on_progress=lambda d, t: progress.append((d, t)),
    )
    assert target.read_bytes() == BODY
    first = len(BODY) // 2
    second = first + (len(BODY) - first) // 2
    assert server.requests == [None, f"bytes={first}-", f"bytes={second}-"]
    assert server.sent == len(BODY)  # no byte was sent twice
    assert waits == [1.0, 2.0]  # the backoff doubles
    assert f"resuming at byte {first}" in notes[0] and "try 2 of 5" in notes[0]
    assert progress[-1] == (len(BODY), len(BODY))
    assert all(total == len(BODY) for _, total in progress)
    assert [p.name for p in tmp_path.iterdir()] == ["cuda.run"]  # no part file left


def test_a_server_that_ignores_range_is_read_again_from_the_start(tmp_path: Path, serve: type[Server]) -> None:
    server = serve(drops=1, ranges=False)
    target = tmp_path / "cuda.run"
    assert fetch.fetch_checked(server.url, target, WANT, retry=_retry([]))
    assert server.requests == [None, f"bytes={len(BODY) // 2}-"]  # asked to resume, got the whole file (200)
    assert target.read_bytes() == BODY


def test_a_wrong_sha256_at_the_end_removes_the_partial_and_fails(tmp_path: Path, serve: type[Server]) -> None:
    server = serve(drops=1)
    with pytest.raises(fetch.HashMismatch, match=f"{server.url} has sha256 {WANT}, the lock says {'0' * 64}"):
        fetch.fetch_checked(server.url, tmp_path / "cuda.run", "0" * 64, retry=_retry([]))
    assert list(tmp_path.iterdir()) == []


def test_tries_are_bounded_and_the_next_run_resumes_the_part(tmp_path: Path, serve: type[Server]) -> None:
    server = serve(drops=99)
    waits: list[float] = []
    target = tmp_path / "cuda.run"
    with pytest.raises(
        fetch.FetchError,
        match=(
            r"the connection closed at byte \d+ of 307200 \(gave up after 3 tries; the next run resumes at byte "
            r"\d+\)"
        ),
    ):
        fetch.fetch_checked(server.url, target, WANT, retry=_retry(waits, attempts=3))
    assert len(server.requests) == 3 and waits == [1.0, 2.0]
    part = tmp_path / ".cuda.run.part"
    kept = part.stat().st_size
    assert 0 < kept < len(BODY) and part.read_bytes() == BODY[:kept]
    server.drops = 0
    assert fetch.fetch_checked(server.url, target, WANT, retry=_retry([]))
    assert server.requests[3:] == [f"bytes={kept}-"]
    assert target.read_bytes() == BODY and not part.exists()


def test_a_resumed_part_with_wrong_bytes_is_downloaded_again_whole(tmp_path: Path, serve: type[Server]) -> None:
    server = serve()
    (tmp_path / ".cuda.run.part").write_bytes(b"x" * 1000)  # left by another run, of another file
    assert fetch.fetch_checked(server.url, tmp_path / "cuda.run", WANT, retry=_retry([]))
    assert server.requests == ["bytes=1000-", None]
    assert (tmp_path / "cuda.run").read_bytes() == BODY


def test_a_server_error_is_tried_again_and_a_missing_file_is_not(tmp_path: Path, serve: type[Server]) -> None:
    server = serve(statuses=[503])
    waits: list[float] = []
    assert fetch.fetch_checked(server.url, tmp_path / "a.run", WANT, retry=_retry(waits))
    assert len(server.requests) == 2 and waits == [1.0]
    server = serve(statuses=[404])
    with pytest.raises(fetch.FetchError, match=r"cannot download .*: HTTP Error 404"):
        fetch.fetch_checked(server.url, tmp_path / "b.run", WANT, retry=_retry(waits))
    assert len(server.requests) == 1 and waits == [1.0]


def test_two_downloads_of_one_file_at_once_fetch_it_once(tmp_path: Path, serve: type[Server]) -> None:
    server = serve()
    target = tmp_path / "cuda.run"
    results: list[bool] = []
    threads = [
        threading.Thread(target=lambda: results.append(fetch.fetch_checked(server.url, target, WANT, retry=_retry([]))))
        for _ in range(2)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results) == [False, True]
    assert len(server.requests) == 1 and target.read_bytes() == BODY
    assert [p.name for p in tmp_path.iterdir()] == ["cuda.run"]


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_a_part_file_of_another_user_is_refused_and_left_as_it_was(tmp_path: Path, serve: type[Server]) -> None:
    """A runfile's or a wheel's `.<name>.part` that another user put there is not resumed from nor written."""
    part = tmp_path / ".cuda.run.part"
    part.write_bytes(BODY[:1000])
    os.chown(part, 65534, 65534)
    with pytest.raises(fetch.PartRefused, match=r"is owned by uid 65534, not by this user \(uid 0\)"):
        fetch.fetch_checked(serve().url, tmp_path / "cuda.run", WANT, retry=_retry([]))
    assert part.read_bytes() == BODY[:1000] and not (tmp_path / "cuda.run").exists()
