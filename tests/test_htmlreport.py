"""The HTML report: self-contained (nothing fetched), escaped, and rendered by headless Chromium
with its chart: the DOM Chromium builds holds the SVG and its data points, and its screenshot
holds the series' colours."""

from __future__ import annotations

import html
import io
import json
import re
import shutil
import struct
import subprocess
import zlib
from collections import Counter
from html.parser import HTMLParser
from pathlib import Path

import pytest
from history_support import gate_doc, keep

from stackgate.commands import report as reporting
from stackgate.models.exitcodes import UsageError
from stackgate.models.result import Status
from stackgate.render import html as htmlreport
from stackgate.render.ui import UI
from stackgate.runs import history

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None,
    reason="headless Chromium is not installed (Debian: apt-get install -y chromium; .ci/run installs it)",
)
DECODE = [92.6, 92.4, None, 83.9, 92.7]


def history_of(folder: Path) -> list[history.Run]:
    for day, decode in enumerate(DECODE, 1):
        backend = "triton" if decode == 83.9 else "flashinfer"
        keep(
            folder,
            gate_doc(
                decode=decode,
                backend=backend,
                status=Status.FAIL if decode == 83.9 else Status.PASS,
                summary="slow" if decode == 83.9 else "fine",
            ),
            f"2025-01-0{day}T10:00:00+00:00",
        )
    return history.load(folder)[0]


def write_page(tmp_path: Path, *runs: str) -> Path:
    folder = tmp_path / "runs"
    history_of(folder)
    page = tmp_path / "report.html"
    code = reporting.run(
        reporting.ReportRequest(runs=runs, html_path=page, runs_dir=folder), UI(stream=io.StringIO(), force_plain=True)
    )
    assert code == 0
    return page


def chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
    ]
    return subprocess.run([CHROMIUM, *flags, *args], capture_output=True, text=True, timeout=120)


class Elements(HTMLParser):
    """Every start tag with its attributes, in document order."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[tuple[str, dict[str, str]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.found.append((tag, {k: v or "" for k, v in attrs}))


def elements(text: str) -> list[tuple[str, dict[str, str]]]:
    parser = Elements()
    parser.feed(text)
    return parser.found


@needs_chromium
def test_the_history_page_renders_in_headless_chromium_with_its_chart(tmp_path):
    page = write_page(tmp_path)
    done = chromium(tmp_path, "--dump-dom", page.as_uri())
    assert done.returncode == 0, done.stderr[-2000:]
    dom = elements(done.stdout)  # what Chromium built from the page, serialised back
    svgs = [attrs for tag, attrs in dom if tag == "svg"]
    assert [s["id"] for s in svgs] == [htmlreport.CHART_ID]
    points = [attrs for tag, attrs in dom if tag == "circle" and "point" in attrs.get("class", "").split()]
    measured = [d for d in DECODE if d is not None]
    assert len(points) == 2 * len(measured)  # tok/s and decode tok/s of each run with a benchmark
    decode = [float(p["data-value"]) for p in points if p["data-series"] == "decode_tok_s"]
    assert decode == pytest.approx(measured, abs=0.001)
    assert [p for p in points if "focus" in p["class"]][0]["data-run"].startswith("20250105")  # the newest run
    assert {a["data-series"] for t, a in dom if t == "polyline"} == {"tok_s", "decode_tok_s"}
    assert any(t == "line" and a.get("class") == "baseline" for t, a in dom)

    shot = tmp_path / "page.png"
    done = chromium(tmp_path, "--window-size=900,700", f"--screenshot={shot}", page.as_uri())
    assert done.returncode == 0 and shot.exists(), done.stderr[-2000:]
    width, height, pixels = read_png(shot)
    assert (width, height) == (900, 700)
    drawn = Counter(pixels[i : i + 3] for i in range(0, len(pixels), 3))
    for colour in ("1f6feb", "1a7f37"):  # the two series' strokes and points were drawn
        assert drawn[bytes.fromhex(colour)] > 200, (colour, drawn.most_common(8))


@needs_chromium
def test_the_page_of_one_run_shows_its_checks_its_benchmark_and_what_changed(tmp_path):
    page = write_page(tmp_path, "-2")
    done = chromium(tmp_path, "--dump-dom", page.as_uri())
    assert done.returncode == 0
    text = html.unescape(re.sub(r"<[^>]+>", " ", done.stdout))
    words = " ".join(text.split())
    assert "Changes since the last good run" in words and "attention_backend flashinfer triton" in words
    assert "decode tok/s: 92.40 -> 83.90" in words
    assert "FAIL slow fix: Do the thing. echo fix" in words
    assert "Benchmark runs (real weights)" in words and "83.70" in words


def test_the_page_fetches_nothing_and_escapes_what_the_runs_say(tmp_path):
    folder = tmp_path / "runs"
    hostile = '<script>alert(1)</script><img src="http://example.com/x.png">'
    keep(folder, gate_doc(decode=90.0, summary=hostile, status=Status.FAIL), "2025-01-01T10:00:00+00:00")
    runs = history.load(folder)[0]
    text = htmlreport.page(runs, runs[-1], title="t", source="s")
    assert "<script" not in text and "<img" not in text and "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    for tag, attrs in elements(text):
        for name in ("src", "href", "xlink:href", "action", "data"):
            assert name not in attrs, (tag, attrs)
    assert not re.search(r"url\(|@import|<link|<iframe|<object|<embed", text)


def read_png(path: Path) -> tuple[int, int, bytes]:
    """Width, height and the RGB bytes of an 8-bit, non-interlaced PNG (what Chromium writes)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, chunks = 8, {"IDAT": b""}
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos : pos + 8])
        body = data[pos + 8 : pos + 8 + length]
        chunks["IDAT" if kind == b"IDAT" else kind.decode()] = chunks["IDAT"] + body if kind == b"IDAT" else body
        pos += 12 + length
    width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", chunks["IHDR"])
    assert depth == 8 and colour in (2, 6) and interlace == 0
    channels = 3 if colour == 2 else 4
    raw = zlib.decompress(chunks["IDAT"])
    stride = width * channels
    rows, previous = [], bytearray(stride)
    for y in range(height):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        for i in range(stride):
            left = line[i - channels] if i >= channels else 0
            up, corner = previous[i], previous[i - channels] if i >= channels else 0
            line[i] = (line[i] + _predict(kind, left, up, corner)) & 0xFF
        rows.append(bytes(line))
        previous = line
    pixels = b"".join(bytes(row[i : i + 3]) for row in rows for i in range(0, stride, channels))
    return width, height, pixels


def _predict(kind: int, left: int, up: int, corner: int) -> int:
    if kind == 0:
        return 0
    if kind == 1:
        return left
    if kind == 2:
        return up
    if kind == 3:
        return (left + up) // 2
    p = left + up - corner
    pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
    return left if pa <= pb and pa <= pc else up if pb <= pc else corner


def plant(folder: Path, name: str, doc: dict, **replacements: str) -> Path:
    """A run document copied into the runs folder as it is (not kept: kept runs are checked),
    each ``"key": value`` of its JSON text given in ``replacements`` written as the raw JSON text."""
    text = json.dumps(doc)
    for key, raw in replacements.items():
        text = re.sub(rf'"{key}": [^,}}]+', f'"{key}": {raw}', text, count=1)
    path = folder / f"{name}.json"
    path.write_text(text)
    return path


def test_a_hostile_copied_run_never_scripts_the_page_nor_crashes_report(tmp_path):
    folder = tmp_path / "runs"
    good = keep(folder, gate_doc(decode=92.0), "2025-01-01T10:00:00+00:00")
    script = '"<script>alert(document.cookie)</script>"'
    plant(folder, "scripted", {**gate_doc(decode=91.0), "started": "2025-01-02T10:00:00+00:00"}, floor_tok_s=script)
    plant(folder, "worded", {**gate_doc(decode=90.0), "started": "2025-01-03T10:00:00+00:00"}, seconds='"abc"')
    huge = plant(folder, "huge", {**gate_doc(decode=89.0), "started": "2025-01-04T10:00:00+00:00"}, mean="1e999")
    page, out = tmp_path / "page.html", io.StringIO()
    ui = UI(stream=out, force_plain=True)
    assert reporting.run(reporting.ReportRequest(html_path=page, runs_dir=folder), ui) == 0
    text = page.read_text()
    assert "<script" not in text and "alert(document.cookie)" not in text and good.id in text
    assert "gate.benchmark.floor_tok_s: text (&#x27;&lt;script&gt;alert(docume...&#x27;), not a number or null" in text
    assert "gate.benchmark.runs[0].seconds: text (&#x27;abc&#x27;), not a number or null" in text
    assert "gate.benchmark.tok_s.mean: inf, not a finite number" in text
    assert reporting.run(reporting.ReportRequest(runs=("-1",), runs_dir=folder), ui) == 0
    assert f"run {good.id} (gate of standin, passed" in out.getvalue()  # the newest run that is one
    with pytest.raises(UsageError, match=r"huge.json: damaged: gate.benchmark.tok_s.mean: inf"):
        reporting.run(reporting.ReportRequest(runs=(str(huge),), runs_dir=folder), ui)


def test_the_page_escapes_and_formats_every_value_even_of_a_document_never_validated(tmp_path):
    doc = gate_doc(decode=91.0, summary="<b>bold</b>", status=Status.FAIL)
    bench = doc["gate"]["benchmark"]
    bench.update(floor_tok_s="<script>alert(1)</script>", baseline_tok_s=190.0, summary="<img src=x onerror=alert(1)>")
    bench["runs"][0].update(seconds="abc", ttft_s="<i>", tokens="<u>")
    doc.update(duration_s="<s>", started="2025-01-01T10:00:00+00:00", run_id="r1")
    doc["gate"]["stages"][0]["duration_s"] = float("inf")
    run = history.Run("r1", tmp_path / "r1.json", doc)
    text = htmlreport.page([run], run, title="t", source="s")
    assert not re.search(r"<(script|img|u|i|s|b)\b", text), re.search(r"<(script|img|u|i|s|b)\b", text)
    assert "baseline 190 tok/s, floor -: &lt;img src=x onerror=alert(1)&gt;" in text
