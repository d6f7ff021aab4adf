"""The gate's report in the shapes others read: JUnit suites, a Markdown summary for a CI job,
and the Prometheus text exposition format for node_exporter's textfile collector.

Every renderer reads only the gate's JSON document (``GateRun.document()``), so a stored run
renders the same way as the one that just finished.
"""

from __future__ import annotations

import datetime as _dt
import math
import re
from typing import Any, Iterable, Mapping, Sequence

from stackgate.models.result import Result
from stackgate.render.sweeptables import prometheus_families, sweep_markdown, sweep_of

__all__ = [
    "STAGE_STATUSES",
    "Family",
    "benchmark_line",
    "exposition",
    "headline_lines",
    "markdown",
    "md_block",
    "md_code",
    "md_text",
    "prometheus",
    "suites",
    "verdict_word",
    "verify_prometheus",
]

#: Every status a stage can have, as Prometheus label values (a state set: one series is 1).
STAGE_STATUSES = ("passed", "failed", "not_run", "interrupted")
_BAD = ("FAIL", "ERROR")
_ICONS = {"passed": "✅", "failed": "❌", "not run": "⏭️", "interrupted": "⚠️"}


def _gate(doc: Mapping[str, Any]) -> Mapping[str, Any]:
    return doc.get("gate") or {}


def verdict_word(doc: Mapping[str, Any]) -> str:
    """PASSED, FAILED, USAGE ERROR or INTERRUPTED."""
    if _gate(doc).get("interrupted"):
        return "INTERRUPTED"
    if doc.get("exit_code") == 2:
        return "USAGE ERROR"
    return "PASSED" if doc.get("verdict") == "passed" else "FAILED"


def suites(doc: Mapping[str, Any]) -> dict[str, list[Result]]:
    """One JUnit testsuite per stage, every stage listed (one not run holds its SKIP)."""
    return {
        f"stackgate.gate.{stage['name']}": [Result.from_dict(r) for r in stage["results"]]
        for stage in _gate(doc).get("stages", ())
    }


def headline_lines(doc: Mapping[str, Any]) -> list[str]:
    """The fingerprint and the benchmark against its baseline, one line each."""
    lines = []
    finger = _gate(doc).get("fingerprint")
    if finger:
        components = finger["components"]
        count = sum(len(section) for section in components.values())
        sections = ", ".join(f"{name} {len(section)}" for name, section in components.items())
        lines.append(f"fingerprint {finger['short']} (sha256 {finger['digest']} over {count} components: {sections})")
    lines.append(benchmark_line(_gate(doc).get("benchmark"), _stage_status(doc, "benchmark")))
    return lines


def _stage_status(doc: Mapping[str, Any], name: str) -> str | None:
    return next((s.get("status") for s in _gate(doc).get("stages", ()) if s.get("name") == name), None)


def benchmark_line(bench: Mapping[str, Any] | None, stage: str | None = None) -> str:
    """``decode 197.31 tok/s vs baseline 190 (+3.8%, floor 180.50): PASS; end-to-end 195.20 tok/s``

    The decode rate is what the verdict judges against the baseline; the end-to-end rate (with
    the time to first token) stands beside it. Without figures, the benchmark stage's status
    (``stage``) says why: it did not run, or it was interrupted or failed before a figure.

    >>> benchmark_line(None), benchmark_line(None, "interrupted"), benchmark_line(None, "not run")
    ('benchmark: not run', 'benchmark: interrupted before a figure was measured', 'benchmark: not run')
    """
    if not bench:
        cut = stage in ("interrupted", "failed")
        return f"benchmark: {stage} before a figure was measured" if cut else "benchmark: not run"
    decode = (bench.get("decode_tok_s") or {}).get("mean")
    tok = (bench.get("tok_s") or {}).get("mean")
    if tok is None or decode is None:
        return f"benchmark: {bench.get('summary') or 'no complete run'}"
    whole = f"end-to-end {tok:.2f} tok/s"
    baseline = bench.get("baseline_tok_s")
    if not baseline:
        return f"decode {decode:.2f} tok/s, {whole} (the lock sets no baseline_tok_s)"
    floor = bench.get("floor_tok_s")
    return (
        f"decode {decode:.2f} tok/s vs baseline {baseline:g} ({decode / baseline - 1:+.1%}, floor "
        f"{'-' if floor is None else format(floor, '.2f')}): {bench.get('status')}; {whole}"
    )


# --- Markdown -----------------------------------------------------------------------------------


def markdown(doc: Mapping[str, Any]) -> str:
    """A summary fit for a CI job summary: verdict, stages, failures with fixes, the benchmark."""
    gate = _gate(doc)
    spec = doc.get("lock") or {}
    word = verdict_word(doc)
    finger = gate.get("fingerprint")
    facts = [
        f"lock **{md_text(spec.get('name') or spec.get('path'))}**",
        f"host {md_code(doc['host']['hostname'])}",
        f"exit code {doc['exit_code']}",
        f"{doc['duration_s']:.1f} s",
        f"run {md_code(doc.get('run_id'))}",
    ]
    if finger:
        facts.append(f"fingerprint {md_code(finger['short'])}")
    out = [
        f"## {'✅' if word == 'PASSED' else '❌'} stackgate gate: {word}",
        "",
        " · ".join(facts),
        "",
        f"{md_text(doc.get('reason', ''))}",
        "",
    ]
    out += ["| stage | status | seconds | reason |", "|---|---|---:|---|"]
    for stage in gate.get("stages", ()):
        out.append(
            f"| {md_text(stage['name'])} | {_ICONS.get(stage['status'], '')} {md_text(stage['status'])} | "
            f"{stage['duration_s']:.1f} | {md_text(stage['reason'])} |"
        )
    out += _failures(gate.get("stages", ()))
    out += _benchmark_section(gate.get("benchmark"), _stage_status(doc, "benchmark"))
    out += sweep_markdown(sweep_of(doc), md_text)
    if finger:
        out += _fingerprint_section(finger)
    return "\n".join(out).rstrip() + "\n"


def _failures(stages: Iterable[Mapping[str, Any]]) -> list[str]:
    bad = [
        (stage["name"], r)
        for stage in stages
        for r in stage["results"]
        if r["status"] in _BAD or (r["status"] == "WARN")
    ]
    if not bad:
        return []
    out = ["", "### Failures and warnings", ""]
    for stage, result in bad:
        out.append(
            f"- **{md_text(result['status'])}** {md_text(stage)} {md_code(result['check'])}: "
            f"{md_text(result['summary'])}"
        )
        out += [f"  - {md_text(line)}" for line in result.get("details", ())[:6]]
        fix = result.get("fix")
        if fix:
            out.append(f"  - fix: {md_text(fix['text'])}")
            if fix.get("commands"):
                out += ["", *md_block(fix["commands"], "sh", "    "), ""]
    return out


def _benchmark_section(bench: Mapping[str, Any] | None, stage: str | None) -> list[str]:
    out = ["", "### Benchmark (real weights)", ""]
    if not bench:
        return out + [benchmark_line(bench, stage).removeprefix("benchmark: ").capitalize() + "."]
    out += ["| run | tokens | seconds | tok/s | TTFT ms | decode tok/s |", "|---|---:|---:|---:|---:|---:|"]
    for i, row in enumerate(bench.get("runs", ()), 1):
        ttft = f"{row['ttft_s'] * 1000:.0f}" if row.get("ttft_s") is not None else "-"
        decode = f"{row['decode_tok_s']:.2f}" if row.get("decode_tok_s") is not None else "-"
        out.append(f"| {i} | {row['tokens']} | {row['seconds']:.3f} | {row['tok_s']:.2f} | {ttft} | {decode} |")
    return out + ["", benchmark_line(bench)]


def _fingerprint_section(finger: Mapping[str, Any]) -> list[str]:
    out = ["", f"### Fingerprint {md_code(finger['short'])}", "", f"sha256 {md_code(finger['digest'])} over:", ""]
    for section, values in finger["components"].items():
        out += [
            f"<details><summary>{md_text(section)} ({len(values)})</summary>",
            "",
            "| component | value |",
            "|---|---|",
        ]
        out += [f"| {md_text(name)} | {md_text(value)} |" for name, value in values.items()]
        out += ["", "</details>", ""]
    return out


def md_text(value: Any) -> str:
    r"""A value as Markdown text, safe in a table cell: one line, pipes escaped, and ``<`` as an
    entity, so that no tag can begin (GitHub renders inline HTML: a GPU name ``<script>`` would be one).

    >>> md_text("NVIDIA <script>x</script> | a\nb -> c")
    'NVIDIA &lt;script>x&lt;/script> \\| a b -> c'
    """
    return _one_line(value).replace("<", "&lt;").replace("|", "\\|")


def md_code(value: Any) -> str:
    r"""A value as a Markdown code span that no backquote in it can end early (a fence longer than
    its longest run of backquotes, spaced when it starts or ends with one); pipes escaped for a table.

    >>> md_code("vm"), md_code("a`b"), md_code("`x``")
    ('`vm`', '``a`b``', '``` `x`` ```')
    """
    text = _one_line(value).replace("|", "\\|")
    fence = "`" * (max((len(run) for run in re.findall("`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def md_block(lines: Sequence[str], info: str = "", indent: str = "") -> list[str]:
    """Lines as a fenced code block whose fence no line of them can close."""
    runs = [len(run) for line in lines for run in re.findall("`{3,}", line)]
    fence = "`" * max([3, *(n + 1 for n in runs)])
    return [f"{indent}{fence}{info}", *(f"{indent}{_one_line(line)}" for line in lines), f"{indent}{fence}"]


def _one_line(value: Any) -> str:
    return str(value).replace("\r", " ").replace("\n", " ")


# --- Prometheus ---------------------------------------------------------------------------------


def prometheus(doc: Mapping[str, Any]) -> str:
    """The text exposition format (version 0.0.4) that node_exporter's textfile collector reads.

    Every series carries the ``lock`` and ``host`` labels; stage status is a state set (one
    series per status, the stage's own is 1); the benchmark's series are left out when it did
    not run, rather than written as a number nobody measured.
    """
    gate = _gate(doc)
    spec = (doc.get("lock") or {}).get("name") or (doc.get("lock") or {}).get("path") or "unknown"
    base = {"lock": str(spec), "host": str(doc["host"]["hostname"])}
    counts = doc.get("counts", {})
    finger = gate.get("fingerprint") or {}
    families: list[tuple[str, str, list[tuple[dict[str, str], float]]]] = [
        (
            "stackgate_gate_passed",
            "Whether the last gate passed (1) or not (0).",
            [(base, 1.0 if doc.get("verdict") == "passed" else 0.0)],
        ),
        (
            "stackgate_gate_exit_code",
            "Exit code of the last gate: 0 passed, 1 failed, 2 usage or bad lockfile, 130 interrupted.",
            [(base, float(doc["exit_code"]))],
        ),
        (
            "stackgate_gate_checks_failed",
            "Checks that failed or crashed in the last gate.",
            [(base, float(sum(counts.get(s, 0) for s in _BAD)))],
        ),
        (
            "stackgate_gate_checks",
            "Checks of the last gate, by status.",
            [({**base, "status": s.lower()}, float(n)) for s, n in counts.items()],
        ),
        (
            "stackgate_gate_stage_status",
            "Status of each stage of the last gate (1 for the status it had).",
            _stage_states(gate, base),
        ),
        (
            "stackgate_gate_stage_duration_seconds",
            "Wall time of each stage of the last gate.",
            [({**base, "stage": s["name"]}, float(s["duration_s"])) for s in gate.get("stages", ())],
        ),
        ("stackgate_gate_duration_seconds", "Wall time of the last gate.", [(base, float(doc["duration_s"]))]),
        (
            "stackgate_gate_last_run_timestamp_seconds",
            "When the last gate started (Unix time).",
            [(base, _timestamp(doc.get("started")))],
        ),
        (
            "stackgate_gate_info",
            "The last gate's run id and stack fingerprint.",
            [
                (
                    {
                        **base,
                        "run_id": str(doc.get("run_id") or ""),
                        "fingerprint": str(finger.get("short") or ""),
                        "lock_sha256": str((doc.get("lock") or {}).get("sha256") or ""),
                    },
                    1.0,
                )
            ],
        ),
    ]
    families += _benchmark_families(gate.get("benchmark"), base)
    families += prometheus_families(sweep_of(doc), base)
    return exposition(families)


Family = tuple[str, str, Sequence[tuple[Mapping[str, str], float]]]


def exposition(families: Iterable[Family]) -> str:
    """Gauge families (name, help, samples of (labels, value)) in the text format; a family
    without samples is left out."""
    lines = []
    for name, help_text, samples in families:
        if not samples:
            continue
        lines += [f"# HELP {name} {_help(help_text)}", f"# TYPE {name} gauge"]
        lines += [f"{name}{_labels(labels)} {_number(value)}" for labels, value in samples]
    return "\n".join(lines) + "\n"


def verify_prometheus(doc: Mapping[str, Any]) -> str:
    """A verify's verdict in the same format as the gate's (``stackgate verify --cached --prom``
    on a timer): whether it passed, its checks by status, each check failed or not, the GPUs
    visible, its wall time and start, and whether the static checks came from the cache."""
    spec = (doc.get("lock") or {}).get("name") or (doc.get("lock") or {}).get("path") or "unknown"
    base = {"lock": str(spec), "host": str(doc["host"]["hostname"])}
    counts = doc.get("counts", {})
    results = [r for r in doc.get("results", ()) if isinstance(r, Mapping)]
    gpus = next((r.get("data", {}).get("gpus") for r in results if r.get("check") == "gpu.count"), None)
    cache = doc.get("cache")
    failed: list[tuple[Mapping[str, str], float]] = [
        ({**base, "check": str(r.get("check"))}, 1.0 if r.get("status") in _BAD else 0.0) for r in results
    ]
    hit: list[tuple[Mapping[str, str], float]] = (
        [(base, 1.0 if cache.get("hit") else 0.0)] if isinstance(cache, Mapping) else []
    )
    families: list[tuple[str, str, list[tuple[Mapping[str, str], float]]]] = [
        (
            "stackgate_verify_passed",
            "Whether the last verify passed (1) or not (0).",
            [(base, 1.0 if doc.get("verdict") == "passed" else 0.0)],
        ),
        (
            "stackgate_verify_exit_code",
            "Exit code of the last verify: 0 passed, 1 failed, 2 usage or bad lockfile, 130 interrupted.",
            [(base, float(doc["exit_code"]))],
        ),
        (
            "stackgate_verify_checks",
            "Checks of the last verify, by status.",
            [({**base, "status": s.lower()}, float(n)) for s, n in counts.items()],
        ),
        (
            "stackgate_verify_check_failed",
            "Whether each check of the last verify failed or crashed (1) or not (0).",
            failed,
        ),
        (
            "stackgate_verify_gpus",
            "GPUs visible to NVML at the last verify.",
            [(base, float(len(gpus)))] if isinstance(gpus, list) else [],
        ),
        ("stackgate_verify_duration_seconds", "Wall time of the last verify.", [(base, float(doc["duration_s"]))]),
        (
            "stackgate_verify_last_run_timestamp_seconds",
            "When the last verify started (Unix time).",
            [(base, _timestamp(doc.get("started")))],
        ),
        (
            "stackgate_verify_cache_hit",
            "Whether the last verify --cached reused the static checks' results (1) or ran them (0).",
            hit,
        ),
    ]
    return exposition(families)


def _stage_states(gate: Mapping[str, Any], base: Mapping[str, str]) -> list[tuple[dict[str, str], float]]:
    samples = []
    for stage in gate.get("stages", ()):
        own = stage["status"].replace(" ", "_")
        samples += [
            ({**base, "stage": stage["name"], "status": status}, 1.0 if status == own else 0.0)
            for status in STAGE_STATUSES
        ]
    return samples


def _benchmark_families(
    bench: Mapping[str, Any] | None, base: Mapping[str, str]
) -> list[tuple[str, str, list[tuple[dict[str, str], float]]]]:
    if not bench:
        return []
    decode = (bench.get("decode_tok_s") or {}).get("mean")
    tok = (bench.get("tok_s") or {}).get("mean")
    baseline = bench.get("baseline_tok_s")
    found = [
        (
            "stackgate_gate_decode_tokens_per_second",
            "Single-stream decode rate of the last gate's benchmark (mean over runs, first token excluded).",
            decode,
        ),
        (
            "stackgate_gate_tokens_per_second",
            "Single-stream output rate of the last gate's benchmark (mean over runs), judged against the baseline.",
            tok,
        ),
        ("stackgate_gate_baseline_tokens_per_second", "The lock's baseline_tok_s.", baseline),
    ]
    return [(name, text, [(dict(base), float(value))]) for name, text, value in found if value is not None]


def _timestamp(started: Any) -> float:
    try:
        return _dt.datetime.fromisoformat(str(started)).timestamp()
    except ValueError:
        return math.nan


_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


def _labels(labels: Mapping[str, str]) -> str:
    r"""Label pairs, each value with backslash, double quote and newline escaped as the format requires.

    >>> print(_labels({"lock": 'a"b', "host": "c\\d"}))
    {lock="a\"b",host="c\\d"}
    """
    for name in labels:
        if not _LABEL_NAME.match(name):
            raise ValueError(f"invalid label name {name!r}")
    inner = ",".join(f'{name}="{_escape(value)}"' for name, value in labels.items())
    return "{" + inner + "}" if inner else ""


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _number(value: float) -> str:
    """Go's float syntax, as the format takes it: NaN, +Inf, -Inf, or the shortest repr.

    >>> [_number(v) for v in (1.0, 197.3125, math.nan, math.inf)]
    ['1', '197.3125', 'NaN', '+Inf']
    """
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return str(int(value)) if value == int(value) and abs(value) < 2**53 else repr(value)
