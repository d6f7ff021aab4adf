"""GPU checks through the fake NVML at the module edge (this machine has no GPU)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import time
from pathlib import Path

import pynvml
import pytest
from fakes import fake_nvml
from fakes.fake_nvml import gpu, machine

from stackgate.checks.all import REGISTRY
from stackgate.edges import nvml
from stackgate.facts import gather
from stackgate.models.result import Status
from stackgate.models.spec import load_spec

ROOT = Path(__file__).resolve().parents[1]
SM120 = load_spec(ROOT / "lockfiles" / "blackwell-sm120-cu130.toml")
H200 = "NVIDIA H200"
HOPPER = load_spec(ROOT / "lockfiles" / "hopper-sm90-cu130.toml")


@pytest.fixture
def fake():
    yield fake_nvml
    fake_nvml.configure(None)


def judge(name, machine, spec=SM120):
    fake_nvml.configure(machine)
    facts = gather(spec, ["nvml"], nvml_lib=fake_nvml)
    try:
        return REGISTRY[name].function(spec, facts)
    finally:
        facts.close()
        fake_nvml.configure(None)


def eight(**fields):
    return [gpu(**fields) for _ in range(8)]


def test_the_snapshot_reads_what_nvml_says(fake):
    fake.configure(machine([gpu(), gpu(name=H200, cc=(9, 0), unsupported=["ecc"])]))
    snap = nvml.snapshot(fake)
    assert snap.driver_version == "580.82.07" and snap.cuda_driver_version == (13, 0)
    first, second = snap.gpus
    assert (first.capability, first.pcie_width, first.ecc_uncorrected_volatile) == ((12, 0), 16, 0)
    assert second.name == H200 and second.ecc_uncorrected_volatile is None
    assert ("ecc", "Not Supported") in second.unknown


def test_a_machine_without_the_driver_is_a_reason_not_a_crash(fake):
    fake.configure({"init_error": "NVML_ERROR_LIBRARY_NOT_FOUND", "gpus": []})
    with pytest.raises(nvml.NvmlError, match="NVML not usable: NVML Shared Library Not Found"):
        nvml.snapshot(fake)


def test_without_nvml_the_driver_check_fails_and_the_others_point_at_it():
    spec = {"init_error": "NVML_ERROR_LIBRARY_NOT_FOUND", "driver": "", "cuda": 0, "gpus": []}
    driver = judge("gpu.driver", spec)
    assert driver.status is Status.FAIL and "libnvidia-ml.so.1" in driver.fix.text
    capability = judge("gpu.capability", spec)
    assert capability.status is Status.SKIP and "see gpu.driver" in capability.summary


def test_every_gpu_of_the_wrong_capability_is_named():
    spec = machine([gpu(), gpu(), gpu(name=H200, cc=(9, 0)), *[gpu() for _ in range(5)]])
    result = judge("gpu.capability", spec)
    assert result.status is Status.FAIL
    assert result.summary == "1 of 8 GPU(s) are not compute capability 12.0: NVIDIA H200 is 9.0"
    assert result.details == ("GPU 2 (NVIDIA H200): compute capability 9.0, the lock wants 12.0",)
    assert result.data["gpus"][2] == "9.0"


def test_all_gpus_of_the_locked_capability_pass():
    result = judge("gpu.capability", machine(eight()))
    assert (result.status, result.summary) == (Status.PASS, "all 8 GPU(s) are compute capability 12.0")


def test_an_old_driver_fails_with_the_minimum():
    result = judge("gpu.driver", machine(eight(), driver="570.133.20"))
    assert result.status is Status.FAIL
    assert result.summary == "driver 570.133.20 is older than the locked minimum 580.82.7"


def test_a_driver_too_old_for_cuda_13_fails_the_cuda_check():
    result = judge("gpu.driver_cuda", machine(eight(), cuda=12080))
    assert result.status is Status.FAIL and "supports CUDA 12.8, older than CUDA 13.0.1" in result.summary


def test_count_and_model():
    assert judge("gpu.count", machine(eight())).status is Status.PASS
    short = judge("gpu.count", machine(eight()[:7]))
    assert short.status is Status.FAIL and short.summary == "7 GPU(s) visible, the lock wants 8"
    other = judge("gpu.count", machine([gpu(name=H200, cc=(9, 0))] * 8))
    assert other.status is Status.FAIL and other.summary == "8 of 8 GPU(s) are not a RTX PRO 6000"


def test_a_narrow_link_fails_but_an_idle_generation_drop_does_not():
    idle = judge("gpu.pcie", machine(eight(pcie=[1, 5, 5, 16, 16])))
    assert idle.status is Status.PASS
    narrow = machine([gpu(pcie=[5, 5, 5, 8, 16]), *eight()[1:]])
    result = judge("gpu.pcie", narrow)
    assert result.status is Status.FAIL and result.details == (
        "GPU 0 (NVIDIA RTX PRO 6000 Blackwell Server Edition): link width x8, the link can do x16",
    )
    slot = judge("gpu.pcie", machine([gpu(pcie=[4, 4, 5, 16, 16]), *eight()[1:]]))
    assert slot.status is Status.FAIL and "the slot limits the link to Gen4; the GPU can do Gen5" in slot.details[0]


def test_uncorrectable_ecc_errors_fail_by_gpu():
    result = judge("gpu.ecc", machine([*eight()[:3], gpu(ecc=[2, 5]), *eight()[4:]]))
    assert result.status is Status.FAIL and result.details == (
        "GPU 3 (NVIDIA RTX PRO 6000 Blackwell Server Edition): 2 uncorrectable ECC error(s)",
    )
    assert result.fix.commands == ("nvidia-smi -r -i 3",)
    off = judge("gpu.ecc", machine(eight(unsupported=["ecc"])))
    assert off.status is Status.SKIP


def test_foreign_processes_warn():
    spec = machine([gpu(processes=[{"pid": 4242, "used": 10 * 2**30}]), *eight()[1:]])
    result = judge("gpu.processes", spec)
    assert result.status is Status.WARN
    assert result.details == (
        "GPU 0 (NVIDIA RTX PRO 6000 Blackwell Server Edition): pid 4242 (command not visible here) holds 10240 MiB",
    )
    assert judge("gpu.processes", machine(eight())).status is Status.PASS


@pytest.fixture
def holder(tmp_path):
    """A real process that the fake NVML says holds 120 GiB of an H200 (141 GiB), as one did on the GPU machine."""
    proc = subprocess.Popen(["sleep", "300"])
    while not Path(f"/proc/{proc.pid}/cmdline").read_bytes():  # empty for a moment while the exec completes
        time.sleep(0.01)
    holders = tmp_path / "holders.jsonl"
    holders.write_text(json.dumps({"pid": proc.pid, "gpu": 0, "bytes": 120 * 2**30}) + "\n")
    try:
        yield (
            proc.pid,
            machine([gpu(name=H200, cc=(9, 0), memory=[141 * 2**30, 512 * 2**20])], driver="580.159.03")
            | {"holders": str(holders)},
        )
    finally:
        proc.kill()
        proc.wait()


def test_a_process_holding_the_memory_the_engine_needs_fails_naming_it(holder):
    pid, spec = holder
    result = judge("gpu.processes", spec, HOPPER)
    assert result.status is Status.FAIL
    assert result.summary == (
        f"GPU 0 (NVIDIA H200) has 20992 MiB free, the engine takes 115507 MiB (0.8 of 144384 MiB): pid {pid} (sleep "
        "300) holds 122880 MiB"
    )
    assert result.fix.commands == (f"ps -o pid,user,cmd -p {pid}",) and "--mem-fraction-static" in result.fix.text
    assert result.data["engine_fraction_from"] == "--mem-fraction-static not in [smoke] flags: assumed 0.8"


def test_the_locks_memory_fraction_decides(holder):
    pid, spec = holder
    small = dataclasses.replace(HOPPER, smoke=dataclasses.replace(HOPPER.smoke, flags=("--mem-fraction-static", "0.1")))
    result = judge("gpu.processes", spec, small)
    assert result.status is Status.WARN and result.details == (
        f"GPU 0 (NVIDIA H200): pid {pid} (sleep 300) holds 122880 MiB",
    )
    assert result.data["engine_fraction"] == 0.1


def test_the_fake_raises_the_real_error_classes(fake):
    fake.configure(machine([gpu(unsupported=["pcie_width"])]))
    with pytest.raises(pynvml.NVMLError_NotSupported):
        fake.nvmlDeviceGetCurrPcieLinkWidth(0)
