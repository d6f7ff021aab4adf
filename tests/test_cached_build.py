"""The suite's shared cache (tests/support.py ``cached_build``): two runs at once, and a run
killed mid-build, never break each other. A tiny venv with a stand-in package takes the place of
the CPU-torch venv; the helper is the same."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from smoke_support import wait_for
from support import READY, ROOT, cached_build

#: A builder in its own process: waits for the go file, then builds ``home`` through the helper
#: (a venv holding ``standin.py``, slow like a real install) and imports the package from it.
BUILDER = """
import os, subprocess, sys, time, venv
from pathlib import Path
from support import cached_build
home, go, log, pause = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), float(sys.argv[4])

def build(folder):
    with open(log, "a") as out:
        out.write(f"{os.getpid()} building in {folder.name}\\n")
    venv.EnvBuilder(with_pip=False).create(folder)
    site = next((folder / "lib").glob("python3*/site-packages"))
    (site / "standin.py").write_text("NAME = 'stand-in'\\n")
    (folder / "building").touch()
    time.sleep(pause)  # the pip install of the real cache: long enough for the other run to arrive

while not go.exists():
    time.sleep(0.01)
python = cached_build(home, build) / "bin" / "python"
print(subprocess.run([str(python), "-c", "import standin; print(standin.NAME)"], capture_output=True, text=True, check=True).stdout.strip())
"""  # noqa: E501 (a script for its own process, kept as written)


def builder(home: Path, tmp_path: Path, pause: float) -> subprocess.Popen[str]:
    argv = [sys.executable, "-c", BUILDER, str(home), str(tmp_path / "go"), str(tmp_path / "builds.log"), str(pause)]
    return subprocess.Popen(
        argv,
        cwd=tmp_path,
        env={"PYTHONPATH": str(ROOT / "tests"), "PATH": "/usr/bin:/bin"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_two_runs_at_once_build_the_cache_once_and_both_use_it(tmp_path):
    home = tmp_path / "cache" / "standin-venv"
    first, second = builder(home, tmp_path, 1.0), builder(home, tmp_path, 1.0)
    (tmp_path / "go").touch()
    outcomes = [p.communicate(timeout=120) + (p.returncode,) for p in (first, second)]
    assert [(out.strip(), code) for out, _, code in outcomes] == [("stand-in", 0), ("stand-in", 0)], outcomes
    assert len((tmp_path / "builds.log").read_text().splitlines()) == 1
    assert home.is_symlink() and (home / READY).is_file()
    assert sorted(p.name for p in home.parent.iterdir()) == sorted(
        [home.name, f".{home.name}.lock", home.resolve().name]
    )


def test_a_builder_killed_mid_build_leaves_nothing_published_and_the_next_run_builds_afresh(tmp_path):
    home = tmp_path / "cache" / "standin-venv"
    (tmp_path / "go").touch()
    killed = builder(home, tmp_path, 600.0)
    wait_for(lambda: any(home.parent.glob(f".{home.name}.*.d/building")), 60)
    killed.send_signal(signal.SIGKILL)
    killed.wait(timeout=60)
    assert not home.exists()
    (unfinished,) = home.parent.glob(f".{home.name}.*.d")
    built = []
    assert cached_build(home, lambda folder: built.append(folder) or (folder / "mark").touch()) == home
    assert (home / "mark").is_file() and len(built) == 1
    assert not unfinished.exists() and not list(home.parent.glob("*.removing"))
    assert cached_build(home, built.append) == home and len(built) == 1  # built: never again


def test_a_cache_built_in_place_by_older_tests_is_used_when_complete_and_replaced_when_not(tmp_path):
    complete, unfinished = tmp_path / "complete", tmp_path / "unfinished"
    for folder in (complete, unfinished):
        (folder / "bin").mkdir(parents=True)
    (complete / READY).write_text("torch==2.13.0\n")
    assert cached_build(complete, lambda folder: (folder / "rebuilt").touch()) == complete
    assert not complete.is_symlink() and not (complete / "rebuilt").exists()
    assert cached_build(unfinished, lambda folder: (folder / "rebuilt").touch()) == unfinished
    assert unfinished.is_symlink() and (unfinished / "rebuilt").is_file()
