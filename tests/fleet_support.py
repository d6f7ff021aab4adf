"""Loopback fleets for the fleet's tests: real OpenSSH servers (``sshd -D -f CONFIG``) on
127.0.0.1, each a "node" with its own host key, folder, fake GPUs, stand-in SGLang server and
``stackgate`` (a wrapper running this checkout's program through tests/fleet_node.py).

The controller logs in with a throwaway ed25519 user key, and checks each node's host key
against a known_hosts file written here, as on a real fleet (an unknown key is refused).
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import venv
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from smoke_support import ROOT, free_port, living
from specs import THIS_PYTHON, minimal_spec

SSHD = shutil.which("sshd") or ("/usr/sbin/sshd" if Path("/usr/sbin/sshd").exists() else None)
TESTS = ROOT / "tests"
#: A folder holding only the package (a link to the checkout's stackgate/): what the nodes' processes get on
#: PYTHONPATH instead of the checkout's root, where `pip install -e .` leaves a stackgate.egg-info that a
#: stack's python.consistency would read as an installed stackgate without its dependencies.
CODE = Path(tempfile.mkdtemp(prefix="stackgate-code-"))
(CODE / "stackgate").symlink_to(ROOT / "stackgate", target_is_directory=True)
atexit.register(shutil.rmtree, CODE, True)
VERIFIABLE = ("gpu.*", "python.interpreter", "python.pins", "python.frozen", "python.consistency")
USER = os.environ.get("USER") or "root"


def why_no_sshd() -> str | None:
    """Why real SSH cannot be tested here (None when it can)."""
    if SSHD is None:
        return "no sshd (Debian: apt-get install openssh-server; .ci/run installs it)"
    if os.geteuid() != 0:
        return "sshd needs root to log a user in (CI runs as root)"
    return None


def keygen(path: Path) -> Path:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", path.name, "-f", str(path)], check=True)
    return path


def wait_port(port: int, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket() as probe:
            probe.settimeout(0.5)
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise AssertionError(f"sshd did not listen on {port} within {timeout_s} s")


@dataclass
class Sshd:
    """One private sshd on a loopback port."""

    home: Path
    authorized: Path
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> Sshd:
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # the privilege separation folder sshd insists on
        key = keygen(self.home / "host_ed25519")
        config = self.home / "sshd_config"
        config.write_text(
            f"Port {self.port}\nListenAddress 127.0.0.1\nHostKey {key}\nPidFile {self.home / 'sshd.pid'}\n"
            f"AuthorizedKeysFile {self.authorized}\nStrictModes no\nUsePAM no\nPasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\nPubkeyAuthentication yes\nPermitRootLogin prohibit-password\n"
            f"AllowUsers {USER}\nLogLevel ERROR\nMaxStartups 100:30:200\nMaxSessions 100\n"
        )
        self.process = subprocess.Popen(
            [SSHD, "-D", "-e", "-f", str(config)],
            stdout=subprocess.DEVNULL,
            stderr=open(self.home / "sshd.log", "wb"),
            start_new_session=True,
        )
        wait_port(self.port)
        return self

    def known_hosts_line(self) -> str:
        return f"[127.0.0.1]:{self.port} " + " ".join((self.home / "host_ed25519.pub").read_text().split()[:2])

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)  # its own session: the listener and every connection's child
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()


def node_wrapper(path: Path, env: dict[str, str], *, hang: bool = False, started: Path | None = None) -> Path:
    """The node's `stackgate`: exports the node's environment, runs the checkout's program. With
    ``hang``, any command but --version records its pid in ``started`` and sleeps (a slow node)."""
    exports = "".join(f"export {k}='{v}'\n" for k, v in env.items())
    body = f"#!/bin/sh\n{exports}"
    if started is not None:
        body += f'[ "$1" = --version ] || echo "$$ $*" >> {started}\n'
    if hang:
        body += '[ "$1" = --version ] || exec sleep 600\n'
    body += f'exec {sys.executable} {TESTS / "fleet_node.py"} "$@"\n'
    path.write_text(body)
    path.chmod(0o755)
    return path


def make_venv(home: Path, extra: dict[str, str] | None = None) -> Path:
    """An empty venv (the stack's interpreter), with distributions ``name -> version`` installed
    as an installer leaves them (their METADATA), so that the fingerprint sees them."""
    venv.EnvBuilder(with_pip=False, symlinks=True).create(home)
    site = next((home / "lib").glob("python3*/site-packages"))
    for name, version in (extra or {}).items():
        info = site / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        (info / "RECORD").write_text(f"{info.name}/METADATA,,\n{info.name}/RECORD,,\n")
    return home / "bin" / "python"


def fleet_spec(path: Path, model: Path, python: Path, *, baseline: float = 300.0) -> Path:
    """The one spec every node gets: the stand-in's profile (one fake H200), a short benchmark."""
    head = minimal_spec(
        name="fleetstack", compute_capability="9.0", gpu_name="H200", version=THIS_PYTHON, interpreter=python
    )
    path.write_text(
        head
        + f"""
[smoke]
model = "{model}"
tp = 1
port = 30000
attention_backend = "flashinfer"
ready_timeout_s = 60
silence_s = 60  # a node whose stand-in loads slowly (24 s a phase) is interrupted or lost, not called hung
stop_grace_s = 3

[benchmark]
output_tokens = 100
runs = 2
warmup = 1
baseline_tok_s = {baseline}
max_regression = 0.5
"""
    )
    return path


def nvml_file(path: Path) -> Path:
    from fakes.fake_nvml import gpu, machine

    path.write_text(json.dumps(machine([gpu("NVIDIA H200", (9, 0), uuid="GPU-0000", memory=[141 * 2**30, 2**20])])))
    return path


def behaviour(path: Path, events: Path, **chosen: Any) -> Path:
    path.write_text(json.dumps({"drain_poll_s": 0.2, "events": str(events), **chosen}))
    return path


def stand_in_pids(events: Path) -> list[int]:
    """Every stand-in process a node's gates started (leaders and workers) that is still alive."""
    if not events.exists():
        return []
    rows = [json.loads(line) for line in events.read_text().splitlines() if line.strip()]
    pids = [r["pid"] for r in rows if r["event"] in ("started", "leaked")] + [
        p for r in rows if r["event"] == "workers" for p in r["pids"]
    ]
    return living(pids)
