"""Hostile input through the real command line: an inventory or a slurm-health --config nested
hundreds deep, an inventory of 10,000 hosts full of duplicates (each bad input: exit 2, the file
named, a bounded message, no traceback), and a host name that is not UTF-8."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from test_pylock_hostile import ROOT, stackgate

DEEP = "[" * 500 + "]" * 500


@pytest.mark.parametrize(
    ("text", "command"),
    [
        (f'[[node]]\nhost = "a"\nx = {DEEP}\n', ["fleet", "verify", "--inventory"]),
        (f"[slurm-health]\nchecks = {DEEP}\n", ["slurm-health", "--config"]),
    ],
    ids=["inventory", "slurm-health-config"],
)
def test_a_file_nested_500_deep_exits_2_naming_it(tmp_path: Path, text: str, command: list[str]) -> None:
    path = tmp_path / "deep.toml"
    path.write_text(text)
    done = stackgate(*command, str(path), home=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"stackgate: {path}: not valid TOML: nested too deeply" in done.stderr and "Traceback" not in done.stderr


def test_an_inventory_of_10000_hosts_with_duplicates_lists_the_first_problems_and_counts_the_rest(
    tmp_path: Path,
) -> None:
    path = tmp_path / "nodes.toml"
    path.write_text("".join(f'[[node]]\nhost = "h{i % 5000}"\n' for i in range(10_000)))
    done = stackgate("fleet", "verify", "--inventory", str(path), home=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.splitlines()
    assert lines[0] == f"stackgate: {path}: 5000 problems:" and lines[1] == "  node: the node name 'h0' is given twice"
    assert lines[-1] == "  ... and 4980 more (fix these and run it again to see the rest)" and len(lines) == 22


HOSTNAMED = """
import runpy, socket, sys
socket.sethostname(bytes.fromhex(sys.argv[1]))
sys.argv = ["stackgate", *sys.argv[2:]]
runpy.run_module("stackgate", run_name="__main__", alter_sys=True)
"""


def test_a_host_name_that_is_not_utf8_is_written_escaped_in_every_report(tmp_path: Path) -> None:
    """The kernel takes any bytes as a host name; in a UTS namespace of its own (root only) the
    real program runs under ``node<FF>`x`` and writes its Prometheus, JUnit and JSON reports."""
    unshare = shutil.which("unshare")
    probe = subprocess.run([unshare or "unshare", "--uts", "true"], capture_output=True) if unshare else None
    if probe is None or probe.returncode != 0:
        pytest.skip("needs unshare --uts (util-linux, as root) to give the test a host name of its own")
    prom, junit, out = tmp_path / "v.prom", tmp_path / "v.xml", tmp_path / "v.json"
    argv = ["verify", "--prom", str(prom), "--junit", str(junit), "--json", str(out)]
    done = subprocess.run(
        [unshare, "--uts", sys.executable, "-c", HOSTNAMED, b"node\xff`x".hex(), *argv],
        cwd=tmp_path,
        env={"PATH": os.environ["PATH"], "HOME": str(tmp_path), "NO_COLOR": "1", "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert 'host="node\\\\xff`x"' in prom.read_text(encoding="utf-8")
    assert json.loads(out.read_text(encoding="utf-8"))["host"]["hostname"] == "node\\xff`x"
    ET.fromstring(junit.read_bytes())
