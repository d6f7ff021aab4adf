"""Families, not strings: each entry captures its variables and recognises the failure in other
words; what no entry explains is still reported (unrecognized-failure), apart."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

from stackgate.flows import diagnose
from stackgate.models import knowledge
from stackgate.models.spec import load_spec
from stackgate.scan import Scanner, extract

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(__file__).resolve().parent / "data"
LOCK = ROOT / "lockfiles" / "blackwell-sm120-cu130.toml"


def scan(text: str, **kwargs: object) -> Scanner:
    scanner = Scanner(never_silent=True, **kwargs)  # type: ignore[arg-type]
    scanner.feed_text(text)
    scanner.finish()
    return scanner


def first(text: str, **kwargs: object) -> knowledge.Finding:
    return scan(text, **kwargs).findings[0]


def test_an_undefined_symbol_is_demangled_and_its_provider_named() -> None:
    torch = first("ImportError: /x/flash_attn_2_cuda.so: undefined symbol: _ZN3c104cuda9SetDeviceEi")
    assert (
        torch.values["name"] == "c10::cuda::SetDevice"
        and torch.values["provider"].startswith("torch")
        and torch.values["extension"] == "flash_attn_2_cuda.so"
    )
    driver = first("ImportError: /x/common_ops.abi3.so: undefined symbol: cuGreenCtxStreamCreate")
    assert driver.component == "driver" and "driver is older" in driver.cause
    demangled = first(
        "ImportError: libfoo.so: undefined symbol: c10::MessageLogger::MessageLogger(char const*, int, int)"
    )
    assert demangled.values["name"] == "c10::MessageLogger::MessageLogger" and demangled.values["provider"].startswith(
        "torch"
    )


@pytest.mark.parametrize(
    ("line", "lib", "major"),
    [
        (
            "ImportError: libcublasLt.so.13: cannot open shared object file: No such file or directory",
            "libcublasLt.so.13",
            "13",
        ),
        (
            "OSError: libcudart.so.11.0: cannot open shared object file: No such file or directory",
            "libcudart.so.11.0",
            "11",
        ),
        (
            "error while loading shared libraries: libnvrtc.alt.so.12: cannot open shared object file",
            "libnvrtc.alt.so.12",
            "12",
        ),
        (
            "ImportError: libcudnn_ops.so.9: cannot open shared object file: No such file or directory",
            "libcudnn_ops.so.9",
            "9",
        ),
    ],
)
def test_any_versioned_cuda_library_is_one_family(line: str, lib: str, major: str) -> None:
    found = first(line, context=knowledge.spec_context(load_spec(LOCK)))
    assert found.id == "cuda-major-mismatch" and found.values["lib"] == lib and found.values["major"] == major


@pytest.mark.parametrize(
    ("text", "code"),
    [
        (
            (
                "RuntimeError: Unexpected error from cudaGetDeviceCount(). Did you run some cuda functions ... Error "
                "802: "
                "system not yet initialized"
            ),
            "802",
        ),
        (
            (
                "RuntimeError: Unexpected error from cudaGetDeviceCount(). Did you run some cuda functions before "
                "calling\nalready "
                "set an error? Error 999: unknown error"
            ),
            "999",
        ),
        ("RuntimeError: CUDA driver initialization failed, you might not have a CUDA gpu.", "3"),
        ("cudaErrorNoDevice: no CUDA-capable device is detected", "100"),
    ],
)
def test_cuda_init_failures_are_read_by_code_and_name(text: str, code: str) -> None:
    found = first(text)
    assert found.id == "cuda-init-failed" and found.values["code"] == code
    assert extract.CUDA_INIT_ERRORS[code][2] in found.fix.text


def test_nccl_classes_and_allocation_failures() -> None:
    usage = first(
        (
            "torch.distributed.DistBackendError: NCCL error in: ../ProcessGroupNCCL.cpp:1287, invalid usage, NCCL "
            "version "
            "2.27.7"
        )
    )
    assert (
        usage.id == "nccl-error"
        and usage.values["nccl_class"] == "invalid usage"
        and "two ranks on one GPU" in usage.cause
    )
    alloc = scan(
        (
            "host:1:2 [3] include/alloc.h:185 NCCL WARN Failed to CUDA calloc 6291456 bytes\nhost:1:2 [3] "
            "enqueue.cc:43 "
            "NCCL "
            "WARN Cuda failure 'out of memory'"
        )
    )
    assert [f.id for f in alloc.findings] == ["nccl-alloc-failed"]  # it supersedes the generic class on its line


def test_the_installer_family_reads_versions_against_the_lock() -> None:
    context = knowledge.spec_context(load_spec(LOCK))
    log = (
        "#12 41.2 Collecting torch==2.10.0\n#12 45.0   Downloading "
        "torch-2.10.0-cp312-cp312-manylinux_2_28_x86_64.whl "
        "(899.7 MB)\n Collecting numpy==2.1.0\n + "
        "nvidia-nccl-cu12==2.27.5\n"
    )
    found = scan(log, context=context, stage="provision").findings
    assert [f.id for f in found] == ["installer-unlocked-version"] and found[0].evidence.count == 3
    assert found[0].values["package"] == "torch" and found[0].values["locked"] == "2.9.1+cu130"
    assert scan(" + torch==2.9.1+cu130\n + triton==3.5.1\n", context=context).findings == []
    assert scan(log).findings == []  # without a lock there is nothing to read the versions against


def test_kernel_asserts_name_their_library() -> None:
    deepgemm = first(
        (
            "RuntimeError: Assertion error (/sgl-kernel/build/_deps/repo-deepgemm-src/csrc/jit/compiler.hpp:50): not "
            "library_root_path.empty()"
        )
    )
    assert (
        deepgemm.id == "kernel-assert" and deepgemm.component == "deepgemm" and deepgemm.values["owner"] == "DeepGEMM"
    )
    triton = first(
        "unknown:0: unknown: block: [0,0,0], thread: [1,0,0] Assertion `index out of bounds: 0 <= tmp4 < 32000` failed."
    )
    assert triton.component == "triton" and triton.values["condition"] == "index out of bounds: 0 <= tmp4 < 32000"


def test_a_missing_moe_config_is_a_performance_warning() -> None:
    found = first(
        (
            "[2026-02-21 10:48:17 TP3] Config file not found at "
            "/x/configs/triton_3_5_1/E=128,N=192,device_name=NVIDIA_RTX_PRO_6000_Blackwell_Server_Edition.json, "
            "you "
            "can create them"
        )
    )
    assert found.id == "moe-config-missing" and found.severity == "warn"
    assert (
        found.values["device"] == "NVIDIA_RTX_PRO_6000_Blackwell_Server_Edition"
        and found.values["shape"] == "E=128 N=192"
    )


def test_out_of_memory_names_its_phase() -> None:
    graph = first(
        (
            '  File "/x/sglang/srt/model_executor/cuda_graph_runner.py", line 300, in capture\n    out = '
            "run_once()\ntorch.OutOfMemoryError: "
            "CUDA out of memory. Tried to allocate 2.00 GiB."
        )
    )
    assert (
        graph.id == "cuda-out-of-memory"
        and graph.values["phase"] == "while capturing CUDA graphs"
        and "--cuda-graph-max-bs" in graph.fix.text
    )


# -- never silent ------------------------------------------------------------------------------

TRACEBACK = """[2026-02-03 11:00:19 TP0] Scheduler hit an exception: Traceback (most recent call last):
  File "/opt/venv/lib/python3.12/site-packages/sglang/srt/managers/scheduler.py", line 2552, in run_scheduler_process
    scheduler = Scheduler(
  File "/opt/venv/lib/python3.12/site-packages/flashinfer/decode.py", line 83, in plan
    raise ValueError("page size 7 is not one of 1, 16")
ValueError: page size 7 is not one of 1, 16
[2026-02-03 11:00:20] Received sigquit from a child process. It usually means the child failed.
"""


def test_an_unexplained_traceback_is_reported_with_its_last_exception_first() -> None:
    scanner = scan(TRACEBACK)
    (unknown,) = scanner.unrecognized
    assert unknown.id == "unrecognized-failure" and unknown.component == "flashinfer"
    assert unknown.title == "Unrecognized traceback: ValueError: page size 7 is not one of 1, 16"
    assert unknown.values["headline"] == unknown.evidence.lines[-1] == "ValueError: page size 7 is not one of 1, 16"
    assert unknown.values["kind"] == "traceback" and "its last frame is in flashinfer" in unknown.cause
    assert [f.id for f in scanner.findings] == [
        "sglang-scheduler-exception",
        "sglang-child-failed",
    ]  # consequences only


def test_an_explained_traceback_is_not_reported_again() -> None:
    scanner = scan(
        (
            'Traceback (most recent call last):\n  File "x.py", line 1\nImportError: libcudart.so.12: cannot open '
            "shared "
            "object file: No such file or directory\n"
        )
    )
    assert [f.id for f in scanner.findings] == ["cuda-major-mismatch"] and scanner.unrecognized == []


def test_error_lines_asserts_and_exits_are_never_silent_and_counted_once_each() -> None:
    text = "\n".join(
        [
            "ERROR: something odd 1",
            "x",
            "y",
            "z",
            "ERROR: something odd 2",
            "python: a.c:3: main: Assertion `n > 0' failed.",
            "",
            "",
            "worker exited with code 3",
        ]
    )
    found = scan(text).unrecognized
    assert [f.values["kind"] for f in found] == ["error line", "assertion", "non-zero exit"]
    assert found[0].evidence.count == 2  # the same words, another number


def test_a_traceback_split_across_blocks_is_still_read_whole() -> None:
    data = TRACEBACK.encode()
    for size in (5, 64, 1000):
        scanner = Scanner(never_silent=True)
        for start in range(0, len(data), size):
            scanner.feed_bytes(data[start : start + size])
        scanner.finish()
        assert scanner.unrecognized[0].values["headline"] == "ValueError: page size 7 is not one of 1, 16", size


@pytest.mark.parametrize("name", ["sglang-0.5.9-tp8-healthy.log", "pip-install-healthy.log", "uv-install-healthy.log"])
def test_healthy_logs_raise_no_alarm(name: str) -> None:
    done = diagnose.diagnose([(name, lambda: open(DATA / name, "rb"))], never_silent=True)
    assert [f for f in done.findings if f.severity != "info"] == [] and done.unrecognized == ()


def test_the_report_shows_unrecognized_failures_apart(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text("[x TP0] Attention backend not specified. Use triton backend by default.\n" + TRACEBACK)
    out = subprocess.run(
        [sys.executable, "-m", "stackgate", "diagnose", str(log), "--json", str(tmp_path / "d.json")],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert out.returncode == 1
    assert "Not recognised by any entry (1):" in out.stdout and out.stdout.index(
        "sglang-attention-backend-default"
    ) < out.stdout.index("Not recognised")
    assert "1 unrecognized failure(s)" in out.stdout
    import json

    doc = json.loads((tmp_path / "d.json").read_text())
    assert doc["counts"]["unrecognized"] == 1 and doc["unrecognized"][0]["id"] == "unrecognized-failure"
    assert all(f["id"] != "unrecognized-failure" for f in doc["findings"])


def test_the_manifest_split_was_fixed_by_the_source_hash() -> None:
    """The halves are what the committed rule gives: nobody moved a case between them."""
    import hashlib

    manifest = tomllib.loads((DATA / "diagnose" / "manifest.toml").read_text())
    for case in manifest["case"]:
        even = int(hashlib.sha256(case["source"].encode()).hexdigest(), 16) % 2 == 0
        assert case["split"] == ("learn" if even else "held-out"), case["file"]
        assert (DATA / "diagnose" / case["file"]).is_file()
