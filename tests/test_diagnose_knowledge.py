"""One body of knowledge, read by family: what verify recognises in a failing run and what diagnose
recognises in a pasted log are the same entries; a fix names what the log names (its package, its
library, its scheduler), never this stack's pins for another project's log; a failure buried in a
long healthy log is found first, with nothing said of the healthy lines."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from stackgate.checks import deep
from stackgate.facts.deepruns import AllReduceRequest, Sweep
from stackgate.flows import diagnose
from stackgate.models import knowledge
from stackgate.models.finding import Finding
from stackgate.models.spec import load_spec
from stackgate.scan import Scanner, match_all

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(__file__).resolve().parent / "data"
LOCK = ROOT / "lockfiles" / "blackwell-sm120-cu130.toml"
CONTEXT = knowledge.spec_context(load_spec(LOCK))


def diagnosed(text: str, context: dict[str, str] | None = None) -> list[Finding]:
    scanner = Scanner(never_silent=True, context=context)
    scanner.feed_text(text)
    scanner.finish()
    return [*scanner.findings, *scanner.unrecognized]


def said(finding: Finding) -> str:
    return " ".join((finding.title, finding.cause, finding.fix.text, *finding.fix.commands))


# -- a fix names what the log names -------------------------------------------------------------

VLLM_SYMBOL = (
    "ImportError: /usr/local/lib/python3.10/dist-packages/vllm/_C.abi3.so: undefined symbol: "
    "_ZN3c106detail14torchCheckFailEPKcS2_jRKSs"
)


@pytest.mark.parametrize("context", [None, CONTEXT], ids=["no lock", "the stack's lock"])
def test_another_projects_undefined_symbol_is_told_its_own_package_never_this_stacks_pin(
    context: dict[str, str] | None,
) -> None:
    (found,) = diagnosed(VLLM_SYMBOL, context)
    assert found.id == "undefined-symbol" and found.values["package"] == "vllm"
    assert found.fix.text.startswith("Reinstall vllm built for the torch installed here")
    assert "2.9.1" not in said(found) and "locked" not in said(found) and "sgl-kernel" not in said(found)


def test_the_stacks_own_extension_is_told_the_locks_pin_when_a_lock_is_given() -> None:
    line = "ImportError: /v/site-packages/sgl_kernel/common_ops.abi3.so: undefined symbol: _ZNK3c106SymInt6sym_neERKS0_"
    (with_lock,) = diagnosed(line, CONTEXT)
    assert "(the lock pins torch==2.9.1+cu130)" in with_lock.fix.text
    (without,) = diagnosed(line)
    assert "2.9.1" not in said(without)  # no lock given: no pin is anyone's


def test_an_installer_that_replaced_torch_is_told_the_locks_pins_only_when_a_lock_is_given() -> None:
    log = "    Uninstalling torch-2.4.0:\n      Successfully uninstalled torch-2.4.0\n"
    (foreign,) = diagnosed(log)
    assert "(it had torch 2.4.0)" in foreign.fix.text and "default profile" not in said(foreign)
    (ours,) = diagnosed(log, CONTEXT)
    assert "(it had torch 2.4.0; the lock freezes torch==2.9.1+cu130 " in ours.fix.text


def test_a_missing_cuda_symbol_library_is_named_as_the_extension_links_it() -> None:
    line = (
        "ImportError: /root/miniconda3/lib/python3.8/site-packages/deepspeed/ops/quantizer/"
        "quantizer_op.cpython-38-x86_64-linux-gnu.so: undefined symbol: curandCreateGenerator"
    )
    (found,) = diagnosed(line, CONTEXT)
    assert found.values["provider"] == "cuRAND (libcurand.so)" and found.component == "cuda toolkit"
    assert "deepspeed" in found.fix.text and "torch" not in found.fix.text


@pytest.mark.parametrize(
    "line",
    [
        "OSError: libnvidia-ml.so.1: cannot open shared object file: No such file or directory",
        "./main: error while loading shared libraries: libcuda.so.1: cannot open shared object file: No such file",
        "2022/05/13 23:09:23 Failed to initialize NVML: could not load NVML library.",
    ],
)
def test_the_drivers_own_libraries_are_the_driver_never_a_build_for_cuda_1(line: str) -> None:
    (found,) = diagnosed(line, CONTEXT)
    assert found.id == "driver-library-missing" and found.component == "driver"
    assert "CUDA 1" not in said(found) and "provision" not in said(found)  # nothing to install from the lock


@pytest.mark.parametrize(
    ("line", "lib", "words"),
    [
        ("ImportError: libmpi_cxx.so.40: cannot open shared object file: No such file", "libmpi_cxx.so.40", "major 40"),
        (
            "examl: error while loading shared libraries: libmpi.so.40: cannot open shared object file: No such file",
            "libmpi.so.40",
            "ldconfig -p | grep libmpi",
        ),
        (
            "ImportError: /home/u/.cache/torch_extensions/py38_cu116/transformer_inference/transformer_inference.so:"
            " cannot open shared object file: No such file or directory",
            "/home/u/.cache/torch_extensions/py38_cu116/transformer_inference/transformer_inference.so",
            "Read the first error of the build",
        ),
    ],
)
def test_any_missing_shared_library_is_one_family_named_by_the_log(line: str, lib: str, words: str) -> None:
    (found,) = diagnosed(line)
    assert found.id == "shared-library-missing" and found.values["lib"] == lib
    assert words in said(found) and "CUDA" not in found.title


def test_a_cuda_library_is_still_read_by_its_cuda_major_not_as_any_library() -> None:
    (found,) = diagnosed("ImportError: libcudart.so.12: cannot open shared object file: No such file", CONTEXT)
    assert found.id == "cuda-major-mismatch" and found.values["major"] == "12"


@pytest.mark.parametrize(
    "line",
    [
        "srun: error: Unable to allocate resources: Requested node configuration is not available",
        "sbatch: error: Batch job submission failed: Requested GRES option unsupported by configured SelectType plugin",
        "salloc: error: Invalid generic resource (gres) specification",
        "srun: error: Unable to create step for job 77: Invalid generic resource (gres) specification",
    ],
)
def test_a_slurm_refusal_is_the_schedulers_whatever_the_client(line: str) -> None:
    (found,) = diagnosed(line, CONTEXT)
    assert found.id == "slurm-resource-refused" and found.component == "slurm"
    assert line.split("error: ")[-1].split(": ")[-1] in found.title and "sinfo" in found.fix.commands[0]


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        (
            "Message:         Pod Allocate failed due to requested number of devices unavailable for nvidia.com/gpu. "
            "Requested:1, Available: 0, which is unexpected",
            "requested number of devices unavailable for nvidia.com/gpu. Requested:1, Available: 0",
        ),
        (
            "Message:        Pod Allocate failed due to device plugin GetPreferredAllocation rpc failed with err: rpc "
            "error: code = Unknown desc = Unable to retrieve list of available devices: error creating nvml.Device 5: "
            "nvml: GPU is lost, which is unexpected",
            "nvml: GPU is lost",
        ),
    ],
)
def test_a_kubelet_that_cannot_allocate_the_pods_devices_is_the_schedulers_family(line: str, reason: str) -> None:
    (found,) = diagnosed(line, CONTEXT)
    assert found.id == "k8s-device-allocate-failed" and found.component == "kubernetes"
    assert reason in found.values["reason"] and "reboot" not in said(found).lower()  # no reboot on a guess


def test_a_tools_own_error_line_is_never_silent() -> None:
    (found,) = diagnosed("mpirun: error: the launcher said something new")
    assert found.id == "unrecognized-failure"


@pytest.mark.parametrize(
    "text",
    [
        "jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate 4770354232 "
        "bytes.",
        "E local_client.cc:672] Execution of replica 0 failed: Resource exhausted: Out \nof memory while trying to "
        "allocate 5520758552 bytes.",
    ],
)
def test_xlas_out_of_memory_is_told_xlas_settings_not_an_engines_flags(text: str) -> None:
    (found,) = diagnosed(text, CONTEXT)
    assert found.id == "xla-out-of-memory" and "XLA_PYTHON_CLIENT_MEM_FRACTION" in found.fix.text
    assert "--mem-fraction-static" not in said(found)


VLLM_CAPTURE = (
    "(VllmWorkerProcess pid=13109) INFO 08-19 07:51:12 model_runner.py:1024] Capturing the model for CUDA graphs.\n"
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."
)


@pytest.mark.parametrize("context", [None, CONTEXT], ids=["no lock", "the stack's lock"])
def test_an_out_of_memory_is_told_in_the_knobs_of_the_engine_the_log_names(context: dict[str, str] | None) -> None:
    (vllm,) = diagnosed(VLLM_CAPTURE, context)
    assert vllm.values["phase"] == "while capturing CUDA graphs" and "--max-num-seqs" in vllm.fix.text
    assert "--mem-fraction-static" not in said(vllm) and "--cuda-graph-max-bs" not in said(vllm)
    (bare,) = diagnosed("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.", context)
    knob = "--mem-fraction-static" if context else "the engine's memory fraction"  # a lock says the engine
    assert knob in bare.fix.text and "--gpu-memory-utilization" not in said(bare)


# -- verify and diagnose read the same entries ------------------------------------------------------

NO_SOCKET = (
    "[rank0]: torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/"
    "ProcessGroupNCCL.cpp:2588, internal error - please report this issue to the NCCL developers, NCCL version 2.21.5\n"
    "[rank0]: ncclInternalError: Internal check failed.\n"
    "[rank0]: Last error:\n"
    "[rank0]: Bootstrap : no socket interface found"
)


def test_a_bootstrap_without_an_interface_is_one_entry_in_diagnose_and_in_verify() -> None:
    (pasted,) = diagnosed(NO_SOCKET)
    assert pasted.id == "nccl-no-socket-interface" and "NCCL_SOCKET_IFNAME" in pasted.fix.text
    assert "P2P" not in said(pasted)
    # verify's whole-text reading (abi.imports, deep's runs) tells the same event once, by the same entry
    assert [f.id for f in match_all(NO_SOCKET)] == ["nccl-no-socket-interface"]
    # and deep.collective recognises it through that entry: another wording of the entry's pattern is enough
    sweep = Sweep(
        request=AllReduceRequest(1, min_bytes=8192, max_bytes=8192),
        sizes=(),
        progress={},
        pids=(),
        nccl_version="2.28.9",
        returncode=1,
        timeout_s=300.0,
        tail=("ncclInternalError: Internal check failed.", "Bootstrap: no socket interface found"),
        log=Path("/tmp/allreduce.log"),
        nccl_env={"NCCL_SOCKET_IFNAME": "eth9"},
        transports={},
        channels=None,
        duration_s=1.0,
        interfaces=("lo", "ens5"),
    )
    result = deep.judge_collective(sweep, None)
    assert "NCCL_SOCKET_IFNAME=eth9 matches none of this host's interfaces (lo, ens5)" in result.summary


@pytest.mark.parametrize(
    "line",
    [
        "ERROR: Could not install packages due to an OSError: [Errno 28] No space left on device",
        "/usr/bin/ld: final link failed: No space left on device",
        "OSError: [Errno 28] No space left on device: '/root/.cache/flashinfer/90/cached_ops/x/x.cuda.o'",
    ],
)
def test_a_full_filesystem_is_one_entry_whoever_writes(line: str) -> None:
    (found,) = diagnosed(line, CONTEXT)
    assert found.id == "disk-full" and found.fix.commands[0] == "df -h"
    assert "reinstall" not in said(found).lower() and "provision" not in said(found)
    # deep.flashinfer_attention reads a JIT build's output for a full filesystem through the same entry
    assert deep._recognised(line, deep.DISK_FULL) is not None


def test_nccls_shared_memory_segment_is_its_own_entry_not_any_full_disk() -> None:
    line = (
        "[0] misc/shmutils.cc:88 NCCL WARN Error: failed to extend /dev/shm/nccl-WU88OE to 9637892 bytes, error: "
        "No space left on device (28)"
    )
    assert [f.id for f in diagnosed(line)] == ["nccl-shm-segment"]


# -- long logs: the failure first, nothing for the healthy lines ------------------------------------


def buried(name: str, failure: str, at: float) -> str:
    lines = (DATA / name).read_text(encoding="utf-8").splitlines()
    cut = int(len(lines) * at)
    return "\n".join([*lines[:cut], *failure.splitlines(), *lines[cut:]]) + "\n"


FAILURES = {
    "disk-full": "ERROR: Could not install packages due to an OSError: [Errno 28] No space left on device",
    "undefined-symbol": VLLM_SYMBOL,
    "nccl-no-socket-interface": NO_SOCKET,
    "driver-library-missing": "OSError: libnvidia-ml.so.1: cannot open shared object file: No such file or directory",
    "shared-library-missing": "ImportError: libmpi.so.40: cannot open shared object file: No such file or directory",
    "slurm-resource-refused": "srun: error: Unable to allocate resources: Requested node configuration is not "
    "available",
    "cuda-out-of-memory": "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 MiB. GPU 6 has a total "
    "capacity of 44.53 GiB of which 448.00 KiB is free.",
}


@pytest.mark.parametrize("name", ["sglang-0.5.9-tp8-healthy.log", "pip-install-healthy.log", "uv-install-healthy.log"])
@pytest.mark.parametrize("entry", sorted(FAILURES))
@pytest.mark.parametrize("at", [0.1, 0.5, 0.9])
def test_a_failure_buried_in_a_long_healthy_log_is_found_first_and_alone(name: str, entry: str, at: float) -> None:
    text = buried(name, FAILURES[entry], at)
    assert 25 <= text.count("\n") <= 300
    done = diagnose.diagnose([(name, lambda: io.BytesIO(text.encode()))], never_silent=True)
    alarms = [f.id for f in done.findings if f.severity != "info"] + [f.id for f in done.unrecognized]
    assert alarms == [entry]
