"""`stackgate diagnose --bundle`: what a user attaches upstream, with secrets planted in the
environment, in URLs and in a server log, and none of them in the archive."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path

from support import install_dist, interpreter_spec, make_venv

from stackgate.models import spec
from stackgate.runs import bundle

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "lockfiles" / "blackwell-sm120-cu130.toml"

HF = "hf_PlantedTokenAbcdefghijklmnop1234"
PASSWORD = "Planted-Pw-9f8e7d6c"
API_KEY = "sk-plantedapikey0123456789abcdef"
SPEC_KEY = "sk-APIKEYlock7Qx9"
SMI = (
    "==============NVSMI LOG==============\nDriver Version                            : 580.82.07\nAttached "
    "GPUs                             "
    ": 1\n"
)


def fake_tools(tmp_path: Path) -> Path:
    """`dmesg` and `nvidia-smi` that print what the real ones print (this machine has no GPU)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (tmp_path / "dmesg.out").write_text(
        (
            "[    1.0] something else\n[  269.5] NVRM: Xid (PCI:0000:18:00): 79, pid=7, name=python3, GPU has fallen "
            "off "
            "the bus.\n[  270.0] later\n"
        )
    )
    (tmp_path / "smi.out").write_text(SMI)
    for name, out in (("dmesg", "dmesg.out"), ("nvidia-smi", "smi.out")):
        (bin_dir / name).write_text(f"#!/bin/sh\ncat {tmp_path / out}\n")
        (bin_dir / name).chmod(0o755)
    return bin_dir


def test_a_bundle_holds_the_parts_and_no_planted_secret(tmp_path: Path) -> None:
    runs = tmp_path / "reports" / "smoke" / "20261130-120000-42"
    runs.mkdir(parents=True)
    (runs / "server.log").write_text(
        f"[2026-11-30 12:00:00] server_args=ServerArgs(model_path='/models/x', api_key='{API_KEY}', tp_size=8)\n"
        f"[2026-11-30 12:00:01] downloading from https://user:{PASSWORD}@hub.example.com/models/x with {HF}\n"
        "RuntimeError: CUDA error: an illegal memory access was encountered\n"
    )
    env = {
        **os.environ,
        "PATH": f"{fake_tools(tmp_path)}{os.pathsep}{os.environ['PATH']}",
        "STACKGATE_KMSG": str(tmp_path / "no-kmsg"),  # the fake dmesg is read, not this machine's records
        "HF_TOKEN": HF,
        "FOO": "AKIAPLANTED7QX9ZZ4B",
        "SOME_TOOL_SETTING": "Unrelated-value-31337",
        "PIP_INDEX_URL": f"https://ci:{PASSWORD}@pypi.example.com/simple",
        "STACKGATE_LOG_DIR": str(tmp_path / "reports"),
        "NO_COLOR": "1",
    }
    out = tmp_path / "support" / "bundle.tar.gz"
    spec = tmp_path / LOCK.name  # its flags carry a literal key of no known token shape
    spec.write_text(LOCK.read_text().replace('flags = ["--enable', f'flags = ["--api-key", "{SPEC_KEY}", "--enable'))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "stackgate",
            "diagnose",
            str(runs / "server.log"),
            "--kernel",
            "--lock",
            str(spec),
            "--bundle",
            str(out),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=300,
    )
    assert done.returncode == 1, done.stderr  # the illegal memory access and the Xid are errors
    assert f"support bundle: {out}" in done.stdout
    with tarfile.open(out) as archive:
        members = {
            m.name.removeprefix("stackgate-bundle/"): archive.extractfile(m).read().decode()
            for m in archive.getmembers()
        }  # type: ignore[union-attr]
    for part in (
        "MANIFEST.txt",
        "diagnose.json",
        "verify.json",
        "nvidia-smi-q.txt",
        "kernel-log-gpu-events.txt",
        "environment.txt",
        f"spec/{LOCK.name}",
        "server-logs/smoke/20261130-120000-42/server.log",
    ):
        assert part in members, sorted(members)
    assert (
        "Driver Version" in members["nvidia-smi-q.txt"]
        and "Xid (PCI:0000:18:00): 79" in members["kernel-log-gpu-events.txt"]
    )
    assert '"command": "verify"' in members["verify.json"] and "xid-79" in members["diagnose.json"]
    assert all(name in members["MANIFEST.txt"] for name in members if name != "MANIFEST.txt")
    for name, text in members.items():
        for secret in (HF, PASSWORD, API_KEY, SPEC_KEY, "AKIAPLANTED7QX9ZZ4B", "Unrelated-value-31337"):
            assert secret not in text, f"{secret} in {name}"
    names_only = members["environment.txt"].split("# set, value not recorded: ", 1)[1].strip().split(", ")
    assert {"FOO", "SOME_TOOL_SETTING", "PIP_INDEX_URL"} <= set(names_only)
    assert 'flags = ["--api-key", "<redacted>", "--enable' in members[f"spec/{LOCK.name}"]
    assert (
        "HF_TOKEN=<redacted>" in members["environment.txt"]
        and "<redacted>" in members["server-logs/smoke/20261130-120000-42/server.log"]
    )


def test_a_bundle_path_that_is_a_folder_is_a_usage_error(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "stackgate", "diagnose", "--bundle", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert done.returncode == 2 and "is a directory" in done.stderr and "Traceback" not in done.stderr


def test_a_bundle_lists_the_stacks_installed_distributions(tmp_path: Path) -> None:
    """The distributions come from the stack's own interpreter, each with its version and place."""
    python, site = make_venv(tmp_path / "stack")
    install_dist(site, "flashinfer-python", "0.6.4")
    install_dist(site, "sglang", "0.5.9")
    spec_file = tmp_path / "stackgate.toml"
    spec_file.write_text(interpreter_spec(python))
    env = {
        **os.environ,
        "PATH": f"{fake_tools(tmp_path)}{os.pathsep}{os.environ['PATH']}",
        "STACKGATE_LOG_DIR": str(tmp_path / "none"),
    }
    made = bundle.write(tmp_path / "b.tar.gz", spec=spec.load_spec(spec_file), diagnose_report=None, environ=env)
    assert not any("installed distributions" in note or "installed-distributions" in note for note in made.notes), (
        made.notes
    )
    listed = made.members["installed-distributions.txt"]
    assert f"flashinfer-python==0.6.4  {site}" in listed and f"sglang==0.5.9  {site}" in listed, listed
    assert listed.startswith(f"# 2 distribution(s) in {tmp_path / 'stack'}"), listed


def test_a_bundle_replaces_a_link_at_its_path_instead_of_writing_through_it_and_is_private(tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    victim.chmod(0o644)
    out = tmp_path / "b.tar.gz"
    out.symlink_to(victim)
    env = {
        **os.environ,
        "PATH": f"{fake_tools(tmp_path)}{os.pathsep}{os.environ['PATH']}",
        "STACKGATE_LOG_DIR": str(tmp_path / "none"),
        "STACKGATE_KMSG": str(tmp_path / "no-kmsg"),
    }
    bundle.write(out, spec=spec.load_spec(LOCK), diagnose_report=None, environ=env)
    assert victim.read_text() == "precious\n" and not out.is_symlink()
    assert out.stat().st_mode & 0o777 == 0o600  # as private as its members
    with tarfile.open(out) as archive:
        assert "stackgate-bundle/MANIFEST.txt" in archive.getnames()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".b.tar.gz")] == []
