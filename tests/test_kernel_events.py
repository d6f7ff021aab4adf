"""The kernel log: Xid, PCIe AER and NVRM events decoded, named by GPU index; verify's
gpu.kernel_events and `stackgate diagnose --kernel`. The only fake is at the edge: a `dmesg` on
PATH that prints what the real one prints, read through the runner like the real one (with
$STACKGATE_KMSG naming no record device); the record device itself is read for real and
compared with this machine's `dmesg`."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from fakes import fake_nvml
from fakes.fake_nvml import gpu, machine

from stackgate.checks.all import REGISTRY
from stackgate.edges import kernellog
from stackgate.facts import gather
from stackgate.models import kernelevents
from stackgate.models.result import Status
from stackgate.models.spec import load_spec

ROOT = Path(__file__).resolve().parents[1]
SM120 = load_spec(ROOT / "lockfiles" / "blackwell-sm120-cu130.toml")

# As dmesg prints them (the Xid lines as NVIDIA's driver writes them; fake NVML puts GPU i at bus 0x18 + i).
FALLEN = """[    2.104512] nvidia: loading out-of-tree module taints kernel.
[  269.516977] NVRM: GPU at PCI:0000:1a:00: GPU-0b11d014-1685-04bd-26ed-5fc0bc1c44ae
[  269.516986] NVRM: Xid (PCI:0000:1a:00): 79, pid=1101234, name=python3, GPU has fallen off the bus.
[  269.517011] NVRM: GPU 0000:1a:00.0: GPU has fallen off the bus.
[  301.000001] NVRM: Xid (PCI:0000:19:00): 63, pid=1896, Row Remapper: New row marked for remapping, reset gpu to activate.
[  412.337100] pcieport 0000:00:03.1: AER: Corrected error received: 0000:18:00.0
[  412.337120] nvidia 0000:18:00.0: PCIe Bus Error: severity=Corrected, type=Physical Layer, (Receiver ID)
"""  # noqa: E501 (text as it is: the lines are the test's data)
APP_FAULT = (
    "[  100.1] NVRM: Xid (PCI:0000:18:00): 13, pid=4242, name=python3, Graphics Exception: ESR 0x405048=0x80000000\n"
)
CLEAN = (
    "[    2.104512] nvidia: loading out-of-tree module taints kernel.\n[    3.0] nvidia-uvm: Loaded the UVM "
    "driver, "
    "major device number 508.\n"
)


#: `journalctl` where the journal holds no kernel line (no journald, Storage=none): it says so, exit 0,
#: unless told --quiet.
NO_ENTRIES = 'case " $* " in *" --quiet "*|*" -q "*) ;; *) echo "-- No entries --";; esac'


def fake_dmesg(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str | None, journal: str | None = None, script: str = ""
) -> Path:
    """A bin folder first on PATH with `dmesg` (and `journalctl`) printing ``text``, or refusing
    like an unprivileged one; ``script``, a shell script's body, is `journalctl` instead."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, body in (("dmesg", text), ("journalctl", journal)):
        (tmp_path / f"{name}.out").write_text(body or "")
        refuse = f"echo '{name}: read kernel buffer failed: Operation not permitted' >&2; exit 1"
        run = refuse if body is None else f"cat {tmp_path}/{name}.out"
        (bin_dir / name).write_text(f"#!/bin/sh\n{script if name == 'journalctl' and script else run}\n")
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("STACKGATE_KMSG", str(tmp_path / "no-kmsg"))  # no record device: dmesg is read
    return bin_dir


def judge(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str | None, journal: str | None = None, script: str = ""
):
    fake_dmesg(tmp_path, monkeypatch, text, journal, script)
    fake_nvml.configure(machine([gpu() for _ in range(8)]))
    facts = gather(SM120, ["kernel", "nvml"], nvml_lib=fake_nvml)
    try:
        return REGISTRY["gpu.kernel_events"].function(SM120, facts)
    finally:
        facts.close()
        fake_nvml.configure(None)


def test_the_xid_catalog_decodes_meaning_action_and_gpu() -> None:
    found = kernelevents.findings(kernelevents.parse(FALLEN), {"0000:18:00": 0, "0000:19:00": 1, "0000:1a:00": 2})
    assert [f.id for f in found] == [
        "xid-79",
        "xid-63",
        "pcie-aer",
    ]  # the driver's own "fallen off" line is the same event
    fallen, remap, aer = found
    assert fallen.title == "Xid 79 on GPU 2 (PCI 0000:1a:00): GPU has fallen off the bus: it stopped answering on PCIe"
    assert fallen.severity == "fail" and fallen.values["action"] == "RESTART_BM" and "reboot" in fallen.fix.text
    assert remap.severity == "warn" and "activate the remapping" in remap.fix.text and remap.values["gpu"] == "1"
    assert aer.values["gpu"] == "0" and aer.evidence.count == 2 and "a corrected error" in aer.cause


def test_bus_ids_are_one_form_whoever_writes_them() -> None:
    old = kernelevents.parse("NVRM: Xid (0000:01:00): 3, C 00000005 SC 00000007 M 00001ffc Data ffffffff")
    assert (
        old[0].bus == "0000:01:00" and old[0].code == 3 and old[0].severity == "fail"
    )  # not in the summary: a GPU fault until looked up
    assert kernelevents.normalize_bus("00000000:1A:00.0") == "0000:1a:00"


def test_verify_fails_on_a_gpu_fault_of_this_boot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    result = judge(tmp_path, monkeypatch, FALLEN)
    assert result.status is Status.FAIL
    assert result.summary.startswith("3 kind(s) of GPU event on this boot, first: Xid 79 on GPU 2 (PCI 0000:1a:00)")
    assert result.data["source"] == "dmesg" and len(result.data["events"]) == 3


def test_verify_warns_on_an_application_fault_and_passes_a_clean_boot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    warned = judge(tmp_path, monkeypatch, APP_FAULT)
    assert (
        warned.status is Status.WARN
        and "Xid 13 on GPU 0" in warned.summary
        and "Restart the application" in warned.fix.text
    )
    clean = judge(tmp_path, monkeypatch, CLEAN)
    assert clean.status is Status.PASS and clean.summary == "no GPU event in 2 lines of `dmesg`"


def test_journalctl_is_read_when_dmesg_is_refused_and_neither_is_a_skip(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    journal = judge(tmp_path, monkeypatch, None, "Nov 30 10:00:00 node kernel: " + APP_FAULT.split("] ", 1)[1])
    assert journal.status is Status.WARN and journal.data["source"].startswith("journalctl -k -b")
    neither = judge(tmp_path, monkeypatch, None, None)
    assert (
        neither.status is Status.SKIP
        and "dmesg: dmesg: read kernel buffer failed: Operation not permitted" in neither.summary
    )


def test_a_journal_without_kernel_lines_is_no_kernel_log_and_a_skip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """/dev/kmsg and dmesg refused (a health check without CAP_SYSLOG), and journalctl answering
    "-- No entries --" with exit 0: nothing was read, which is a SKIP that says so, never a PASS
    "no GPU event in 1 lines"."""
    result = judge(tmp_path, monkeypatch, None, script=NO_ENTRIES)
    assert result.status is Status.SKIP, result.summary
    assert "journalctl -k -b --no-pager -o short-precise --quiet: exit 0, no output" in result.summary


def test_diagnose_kernel_reads_the_live_log_and_a_saved_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_dmesg(tmp_path, monkeypatch, FALLEN)
    live = subprocess.run(
        [sys.executable, "-m", "stackgate", "diagnose", "--kernel"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "NO_COLOR": "1"},
    )
    assert live.returncode == 1, live.stderr
    assert "xid-79: Xid 79 on the device at PCI 0000:1a:00" in live.stdout and "kernel log (dmesg)" not in live.stderr
    saved = tmp_path / "dmesg.txt"
    saved.write_text(APP_FAULT)
    quiet = subprocess.run(
        [sys.executable, "-m", "stackgate", "diagnose", "--kernel-log", str(saved)],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert quiet.returncode == 0 and "xid-13" in quiet.stdout
    missing = subprocess.run(
        [sys.executable, "-m", "stackgate", "diagnose", "--kernel-log", str(tmp_path / "nope")],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert missing.returncode == 2 and "no such file" in missing.stderr


def test_any_input_s_kernel_lines_are_decoded_without_a_flag(tmp_path: Path) -> None:
    """A dmesg excerpt given as a plain log (or pasted among server lines) is read in the same pass."""
    log = tmp_path / "dmesg.txt"
    log.write_text("[2026-02-03 09:00:14 TP0] Init torch distributed begin.\n" + FALLEN + APP_FAULT)
    argv = [sys.executable, "-m", "stackgate", "diagnose", str(log), "--json", str(tmp_path / "d.json")]
    out = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 1, out.stderr
    import json

    doc = json.loads((tmp_path / "d.json").read_text())
    ids = [f["id"] for f in doc["findings"]]
    assert ids[:2] == ["xid-79", "xid-63"] and "xid-13" in ids and "pcie-aer" in ids
    assert "gpu-fallen-off-bus" not in ids and doc["unrecognized"] == []  # the Xid line is the catalog's, once
    aer = next(f for f in doc["findings"] if f["id"] == "pcie-aer")
    assert aer["evidence"]["count"] == 2 and aer["evidence"]["line"] == 7


def test_the_scanner_maps_bus_ids_to_gpus_given_the_index() -> None:
    from stackgate.scan import Scanner

    scanner = Scanner(kernel=True, never_silent=True)
    scanner.feed_text("ImportError: x\n" + APP_FAULT)
    scanner.finish()
    assert scanner.kernel is not None and [e.code for e in scanner.kernel.events] == [13]
    (found,) = scanner.kernel.findings({"0000:18:00": 5}, "pasted")
    assert found.title.startswith("Xid 13 on GPU 5 (PCI 0000:18:00)") and found.evidence.line == 2
    quiet = Scanner(kernel=True)
    quiet.feed_text(CLEAN)
    quiet.finish()
    assert quiet.kernel is not None and quiet.kernel.events == []


# --- the kernel's record device, read in this process -------------------------------------------


def _readable(path: str) -> bool:
    try:
        os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK))
    except OSError:
        return False
    return shutil.which("dmesg") is not None


@pytest.mark.skipif(not _readable("/dev/kmsg"), reason="this machine's /dev/kmsg (or dmesg) cannot be read")
def test_the_record_device_reads_as_dmesg_prints_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STACKGATE_KMSG", raising=False)
    log = kernellog.read()
    printed = subprocess.run(["dmesg"], capture_output=True, text=True, check=True).stdout.splitlines(keepends=True)
    mine = log.text.splitlines(keepends=True)
    assert log.source == "/dev/kmsg" and len(mine) > 10
    # The same lines, byte for byte, as far as both read (the kernel may log between the two reads).
    assert mine[: len(printed)] == printed[: len(mine)]


def test_a_record_device_that_is_no_character_device_is_passed_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_dmesg(tmp_path, monkeypatch, CLEAN)
    fifo = tmp_path / "kmsg"
    os.mkfifo(fifo)  # opened for reading with no writer: a blocking reader would wait for ever
    for planted in (fifo, tmp_path / "dmesg.out"):
        monkeypatch.setenv("STACKGATE_KMSG", str(planted))
        log = kernellog.read()
        assert (log.source, log.text) == ("dmesg", CLEAN)
    fake_dmesg(tmp_path, monkeypatch, None)
    monkeypatch.setenv("STACKGATE_KMSG", str(fifo))
    with pytest.raises(kernellog.KernelLogError, match=f"{fifo}: not a character device; dmesg: "):
        kernellog.read()
