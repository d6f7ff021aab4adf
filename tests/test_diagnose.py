"""`invoke diagnose`: inputs, exit codes, the rendered report, the JSON report, the lock's context."""

from __future__ import annotations

import gzip
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support import run_program

from stackgate.commands import diagnose
from stackgate.commands.diagnose import DiagnoseRequest
from stackgate.models import knowledge as signatures
from stackgate.models.exitcodes import ExitCode, UsageError
from stackgate.render.ui import UI, render_findings
from stackgate.scan import Scanner

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(__file__).resolve().parent / "data"
LOCK = ROOT / "lockfiles" / "blackwell-sm120-cu130.toml"
HEALTHY = DATA / "sglang-0.5.9-tp8-healthy.log"

FAILED_START = """[2026-02-03 09:00:14 TP0] Init torch distributed begin.
[2026-02-03 09:00:18 TP0] Attention backend not specified. Use triton backend by default.
[2026-02-03 09:00:19 TP0] Scheduler hit an exception: Traceback (most recent call last):
  File "/opt/stackgate/current/lib/python3.12/site-packages/sglang/srt/distributed/device_communicators/torch_symm_mem.py", line 83, in __init__
    not in TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES[self.device_capability]
           ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~^^^^^^^^^^^^^^^^^^^^^^^^
KeyError: 12
[2026-02-03 09:00:19] Received sigquit from a child process. It usually means the child failed.
"""  # noqa: E501 (text as it is: the lines are the test's data)


def run(request: DiagnoseRequest, stdin: bytes | None = None) -> tuple[ExitCode, str]:
    out = io.StringIO()
    code = diagnose.run(
        request, UI(stream=out, force_plain=True), stdin=io.BytesIO(stdin) if stdin is not None else None
    )
    return code, out.getvalue()


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_an_error_finding_fails_and_is_listed_first_with_its_lines(tmp_path: Path) -> None:
    code, out = run(DiagnoseRequest(paths=(write(tmp_path, "server.log", FAILED_START),)))
    assert code == ExitCode.FAILED
    order = [line.split()[1].rstrip(":") for line in out.splitlines() if line[:7] in ("FAIL   ", "WARN   ", "INFO   ")]
    assert order == [
        "sglang-symm-mem-keyerror",
        "sglang-scheduler-exception",
        "sglang-child-failed",
        "sglang-attention-backend-default",
    ]
    assert f"  at {tmp_path / 'server.log'}:5-7  [sglang]" in out
    assert "  | 7  KeyError: 12" in out
    assert "  $ stackgate provision --only patches" in out
    assert out.rstrip().endswith("4 finding(s) (3 fail, 1 warn) in " + out.rstrip().rsplit(" in ", 1)[1])
    assert out.rstrip().endswith(": FAILED")


def test_warnings_alone_pass_and_a_healthy_log_passes(tmp_path: Path) -> None:
    code, out = run(
        DiagnoseRequest(
            paths=(write(tmp_path, "a.log", "Attention backend not specified. Use triton backend by default.\n"),)
        )
    )
    assert code == ExitCode.PASSED and "passed (no failing finding)" in out
    code, out = run(DiagnoseRequest(paths=(HEALTHY,)))
    assert code == ExitCode.PASSED
    assert "INFO     sglang-custom-allreduce-pcie" in out and "FAIL " not in out and "WARN " not in out


def test_nothing_known_passes(tmp_path: Path) -> None:
    code, out = run(DiagnoseRequest(paths=(write(tmp_path, "a.log", "all good\n"),)))
    assert code == ExitCode.PASSED
    assert out.splitlines()[-1].startswith("no known failure found in ") and out.rstrip().endswith(": passed")


def test_several_inputs_and_standard_input_are_read(tmp_path: Path) -> None:
    first = write(
        tmp_path, "install.log", "  Attempting uninstall: torch\n      Successfully uninstalled torch-2.9.1+cu130\n"
    )
    code, out = run(
        DiagnoseRequest(paths=(first, HEALTHY), stdin=True),
        stdin=b"ImportError: libcudart.so.12: cannot open shared object file: No such file or directory\n",
    )
    assert code == ExitCode.FAILED
    assert "stackgate diagnose: 3 inputs, " in out
    assert "  at <stdin>:1  [cuda toolkit]" in out
    assert f"  at {first}:2  [installer]" in out


def test_a_compressed_log_is_read(tmp_path: Path) -> None:
    path = tmp_path / "server.log.gz"
    with gzip.open(path, "wt") as out:
        out.write(HEALTHY.read_text() + FAILED_START)
    code, text = run(DiagnoseRequest(paths=(path,)))
    assert code == ExitCode.FAILED and "KeyError: 12" in text


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: p / "missing.log", "no such file"),
        (lambda p: p, "is a directory"),
        (lambda p: (p / "broken.log.gz").write_bytes(b"not gzip") and p / "broken.log.gz", "cannot read"),
    ],
    ids=["missing", "directory", "bad-gzip"],
)
def test_an_unreadable_input_is_a_usage_error(tmp_path: Path, make, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(UsageError, match=message):
        run(DiagnoseRequest(paths=(HEALTHY, make(tmp_path))))


def test_no_input_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="nothing to diagnose"):
        run(DiagnoseRequest())


def test_the_lock_is_quoted(tmp_path: Path) -> None:
    log = write(
        tmp_path,
        "s.log",
        "ImportError: libnvrtc.so.12: cannot open shared object file: No such file or directory\n[x TP0] Attention "
        "backend not specified. Use triton backend by default.\n",
    )
    _, out = run(DiagnoseRequest(paths=(log,), spec_path=LOCK))
    assert "libnvrtc.so.12 is missing: a build for CUDA 12, not for the stack's CUDA (13.0)" in out
    assert "the stack runs flashinfer." in out
    assert f"  $ stackgate provision --only python --lock {LOCK}" in out


def test_without_a_lock_the_report_reads_as_english(tmp_path: Path) -> None:
    """The wording the issue found broken: holes where a lock value would go, "1 lines"."""
    log = write(
        tmp_path, "s.log", "ImportError: libnvrtc.so.12: cannot open shared object file: No such file or directory"
    )
    _, out = run(DiagnoseRequest(paths=(log,)))
    assert "stackgate diagnose: 1 input, 1 line, " in out
    assert (
        "libnvrtc.so.12 is missing: a build for CUDA 12, not for the stack's CUDA (13.0 in the default profile)" in out
    )
    assert "  $ stackgate provision --only python\n" in out
    for broken in ("a CUDA the", "packages ()", " 1 lines", "{"):
        assert broken not in out
    resolver = write(
        tmp_path, "pip.log", next(s for s in signatures.load() if s.id == "pip-resolution-impossible").examples[0]
    )
    _, out = run(DiagnoseRequest(paths=(resolver,)))
    assert (
        "Never let a resolution move the frozen packages (torch, torchaudio, triton and nvidia-nccl-cu13 in the "
        "default profile)."
    ) in out


def test_the_json_report_carries_every_finding(tmp_path: Path) -> None:
    log = write(tmp_path, "server.log", FAILED_START)
    report = tmp_path / "out" / "diagnose.json"
    code, _ = run(DiagnoseRequest(paths=(log,), json_path=report, spec_path=LOCK))
    doc = json.loads(report.read_text())
    assert doc["schema"] == "stackgate.diagnose/4" and doc["exit_code"] == int(code) == 1 and doc["verdict"] == "failed"
    assert doc["lock"]["name"] == "blackwell-sm120-cu130"
    assert doc["inputs"] == [{"name": str(log), "lines": 8, "bytes": len(FAILED_START.encode())}]
    assert doc["counts"] == {"fail": 3, "warn": 1, "info": 0, "unrecognized": 0} and doc["unrecognized"] == []
    first = doc["findings"][0]
    assert (
        first["id"] == "sglang-symm-mem-keyerror"
        and first["evidence"]["line"] == 7
        and first["evidence"]["start_line"] == 5
    )
    assert first["evidence"]["file"] == str(log) and first["evidence"]["lines"][-1].endswith("KeyError: 12")
    assert first["values"] == {"major": "12"}
    assert first["fix"]["commands"][0] == f"stackgate provision --only patches --lock {LOCK}"
    assert first["learned_from"].startswith("sglang 0.5.9 wheel: ")


def test_the_rendered_finding_reads_exactly() -> None:
    scanner = Scanner(source="server.log")
    scanner.feed_text(
        "ok\n[rank5]:[E226 11:16:37.121617583 ProcessGroupNCCL.cpp:616] [Rank 5] "
        "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5653, OpType=ALLREDUCE, NumelIn=58720256, "
        "NumelOut=58720256"
    )
    lines = [
        text for text, _ in render_findings("stackgate diagnose: 1 input(s)", scanner.findings, "1 finding(s): FAILED")
    ]
    assert lines == [
        "stackgate diagnose: 1 input(s)",
        "",
        "FAIL     nccl-watchdog-timeout: A collective timed out (ALLREDUCE, sequence 5653)",
        "  at server.log:2  [nccl]",
        "  | 2  [rank5]:[E226 11:16:37.121617583 ProcessGroupNCCL.cpp:616] [Rank 5] "
        "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5653, OpType=ALLREDUCE, NumelIn=58720256, "
        "NumelOut=58720256",
        "  cause: A collective (ALLREDUCE, sequence 5653) did not finish within the process group's timeout: "
        "a rank hung or died, or peer-to-peer traffic between the GPUs stalls (IOMMU, ACS on PCIe hosts).",
        "  fix: Find the rank that stopped first (its error is earlier in the log); run the collective test to find "
        "a GPU pair or setting that hangs; check NCCL_P2P_LEVEL and the PCIe topology.",
        "  $ stackgate verify --deep",
        "  $ nvidia-smi topo -m",
        "  learned from: https://github.com/sgl-project/sglang/issues/3836",
        "",
        "1 finding(s): FAILED",
    ]


def test_long_lines_are_clipped_unless_verbose() -> None:
    scanner = Scanner(source="x.log")
    line = "ImportError: /opt/" + "very/" * 60 + "common_ops.abi3.so: undefined symbol: _ZN3c104cuda9SetDeviceEab"
    scanner.feed_text(line)
    scanner.finish()  # the symbol may follow on the next line: the event is complete at the end
    short = [t for t, _ in render_findings("t", scanner.findings, "v")]
    assert f"  | 1  {line[:237]}..." in short
    verbose = [t for t, _ in render_findings("t", scanner.findings, "v", verbose=1)]
    assert f"  | 1  {line}" in verbose
    assert "  see also: https://github.com/sgl-project/sglang/pull/30562" in verbose
    assert "  symbol = _ZN3c104cuda9SetDeviceEab" in verbose


# -- through invoke, as a person runs it ------------------------------------------------------


def invoke(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return run_program("diagnose", *args, program="invoke", stdin=stdin, timeout=120)


def test_invoke_diagnose_exit_codes(tmp_path: Path) -> None:
    bad = write(tmp_path, "server.log", FAILED_START)
    failed = invoke("--path", str(bad), "--path", str(HEALTHY))
    assert failed.returncode == 1, failed.stderr
    assert "FAIL     sglang-symm-mem-keyerror" in failed.stdout
    passed = invoke("--", str(HEALTHY))
    assert passed.returncode == 0 and "sglang-custom-allreduce-pcie" in passed.stdout
    missing = invoke("-p", str(tmp_path / "nope.log"))
    assert missing.returncode == 2 and "stackgate: " in missing.stderr and "no such file" in missing.stderr
    assert invoke().returncode == 2


def test_invoke_diagnose_reads_standard_input_and_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "d.json"
    done = invoke(
        "--stdin",
        "--json",
        str(out),
        "--lock",
        str(LOCK),
        stdin="NVRM: Xid (PCI:0000:01:00): 79, GPU has fallen off the bus.\n",
    )
    assert done.returncode == 1, done.stderr
    assert "  at <stdin>:1  [driver]" in done.stdout
    found = json.loads(out.read_text())["findings"]
    assert [f["id"] for f in found] == ["xid-79"]  # any input's kernel lines are decoded by the Xid catalog, once


#: What a hostile log line plants for a terminal: a window title (OSC 0), a screen clear, an OSC 8
#: hyperlink, a colour, a carriage return and the C1 CSI.
PLANTED = "\x1b]0;pwned\x07\x1b[2J\x1b]8;;http://evil.example\x1b\\click\x1b]8;;\x1b\\\x1b[31mred\rback\u009b2J"


def test_a_hostile_logs_escape_sequences_never_reach_the_console_plain_or_not(tmp_path: Path) -> None:
    log = write(tmp_path, "hostile.log", f"RuntimeError: CUDA error: out of memory {PLANTED}\nValueError: {PLANTED}\n")
    environ = {**os.environ, "PYTHONPATH": str(ROOT), "NO_COLOR": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "stackgate", "diagnose", str(log)], capture_output=True, text=True, env=environ
    )
    assert done.returncode == 1, done.stderr
    assert "cuda-out-of-memory" in done.stdout and "?]0;pwned??[2J?]8;;http://evil.example?\\click" in done.stdout
    assert not re.search("[\x00-\x09\x0b-\x1f\x7f-\x9f]", done.stdout + done.stderr)
