"""CI (.ci/run) works in a venv of its own: .ci/venv.sh, sourced before anything is installed, makes
.ci/venv (ignored by git) and puts it first on PATH, so the README's `python3 -m pip install` lands
there and the machine's python3 is left as it was."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUN = ROOT / ".ci" / "run"


def test_every_install_of_ci_comes_after_its_venv_is_first_on_path():
    lines = [line.strip() for line in RUN.read_text().splitlines()]
    venv = lines.index(". .ci/venv.sh")
    installs = [n for n, line in enumerate(lines) if "pip install" in line and not line.startswith("#")]
    assert installs and min(installs) > venv, [lines[n] for n in installs if n < venv]
    floor = [lines[n] for n in installs if "--python .ci/lowest/bin/python" not in lines[n]]
    assert all(line.startswith("python3 -m pip install") for line in floor), floor  # python3: the venv's


def test_the_venv_script_gives_a_python3_of_its_own_that_git_ignores(tmp_path):
    """.ci/venv.sh run as .ci/run runs it (set -euo pipefail, in the clone): `python3` is then the
    venv's (its own prefix, not the machine's), and pip installs into it."""
    clone = tmp_path / "clone"
    (clone / ".ci").mkdir(parents=True)
    shutil.copy(ROOT / ".ci" / "venv.sh", clone / ".ci" / "venv.sh")
    machine = Path(sys.executable).parent
    script = (
        'set -euo pipefail; cd "$1"; . .ci/venv.sh; command -v python3; '
        "python3 -c 'import sys; print(sys.prefix); print(sys.base_prefix)'; python3 -m pip --version"
    )
    done = subprocess.run(
        ["bash", "-c", script, "bash", str(clone)],
        env={"PATH": f"{machine}:/usr/bin:/bin", "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    found, prefix, base, pip = done.stdout.splitlines()[:4]
    venv = clone / ".ci" / "venv"
    assert Path(found) == venv / "bin" / "python3" and Path(prefix) == venv and Path(base) != venv
    assert str(venv) in pip
    assert "/.ci/venv/" in (ROOT / ".gitignore").read_text().splitlines(), ".ci/venv is ignored by git"
