"""`invoke lock` of the cu128 profile against the real PyPI, cold and warm, and `lock --check`.

Each lock is a whole `invoke lock` in its own process, as a person runs it, against a copy of
lockfiles/blackwell-sm120-cu128.toml in a temporary folder. The reference is the bare resolution
it wraps: the same `uv pip compile` command (same inputs, flags and preferences), run directly, in
the same run, alternating with it. Cold: an empty uv cache; warm: the cache the cold run left,
and the pylock already there (its versions are preferences); a warm lock is `lock --refresh`,
which resolves again although the spec did not change. Then a lock of the unchanged spec (answered
from its pylock, no index asked) against that warm `lock --refresh`, as a ratio. `lock --check` is
timed against `python -m invoke --list`, the floor of any task (an interpreter and invoke starting).

    python benchmarks/lock_speed.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import functools
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _stack import ROOT, environ

from stackgate.models import pylock
from stackgate.models.spec import load_spec
from stackgate.stack import pyenv, resolve

SPEC = ROOT / "lockfiles" / "blackwell-sm120-cu128.toml"
CHECK_GOAL_S = 1.0


def timed(argv: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:6])} ... failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return time.perf_counter() - started


def lock_s(spec: Path, env: dict[str, str], *flags: str) -> float:
    return timed([sys.executable, "-m", "invoke", "lock", "--lock", str(spec), *flags], env)


def compile_s(spec: Path, work: Path, env: dict[str, str]) -> float:
    """The reference: the uv command `invoke lock` runs, run bare (its inputs written first)."""
    uv = pyenv.find_uv()
    assert uv is not None
    work.mkdir(parents=True, exist_ok=True)
    command = resolve.compile_command(load_spec(spec), uv, work, work / "pylock.toml")
    return timed(list(command.argv), env)


def in_process_overhead(spec_path: Path, work: Path, env: dict[str, str]) -> float:
    """resolve()'s wall time minus the bare uv command's, both warm, in this process: what loading
    the old pylock, validating, stamping and writing add (no interpreter start in either)."""
    uv = pyenv.find_uv()
    assert uv is not None
    spec = load_spec(spec_path)
    work.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(pylock.path_for(spec_path), work / "pylock.toml")  # the same preferences
    command = resolve.compile_command(spec, uv, work, work / "pylock.toml")
    started = time.perf_counter()
    pyenv.run(command, log=work / "uv.log", environ=env)
    bare = time.perf_counter() - started
    started = time.perf_counter()
    resolve.resolve(spec, uv=uv, environ=env)
    return time.perf_counter() - started - bare


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    rows: dict[str, list[float]] = {key: [] for key in ("lock cold", "uv cold", "lock warm", "uv warm")}
    with tempfile.TemporaryDirectory(prefix="stackgate-lock-") as tmp:
        base = Path(tmp)
        for repeat in range(args.repeats):
            order = ("lock", "uv") if repeat % 2 == 0 else ("uv", "lock")
            for who in order:
                folder = base / f"{who}-{repeat}"
                folder.mkdir()
                spec = folder / SPEC.name
                shutil.copyfile(SPEC, spec)
                env = environ(folder / "caches")
                if who == "lock":
                    run = functools.partial(lock_s, spec, env, "--refresh")
                else:
                    run = functools.partial(compile_s, spec, folder / "work", env)
                rows[f"{who} cold"].append(run())
                rows[f"{who} warm"].append(run())
        spec = base / "lock-0" / SPEC.name
        env = environ(base / "lock-0" / "caches")
        unchanged, refreshed = [], []
        for _ in range(5):  # alternating: the unchanged spec answered from its pylock, and --refresh
            unchanged.append(lock_s(spec, env))
            refreshed.append(lock_s(spec, env, "--refresh"))
        checks = [
            timed([sys.executable, "-m", "invoke", "lock", "--check", "--lock", str(spec)], env) for _ in range(5)
        ]
        floor = [timed([sys.executable, "-m", "invoke", "--list"], env) for _ in range(5)]
        started = time.perf_counter()
        for _ in range(20):
            resolution, differences = resolve.current(load_spec(spec))
        in_process = (time.perf_counter() - started) / 20
        assert resolution is not None and not differences
        own = statistics.median(in_process_overhead(spec, base / "lock-0" / "again", env) for _ in range(args.repeats))
    median = {key: statistics.median(values) for key, values in rows.items()}
    print(
        f"invoke lock of {SPEC.name} against PyPI ({len(resolution.packages)} distributions, "
        f"{len(resolution.files)} files), median of {args.repeats}:"
    )
    for state in ("cold", "warm"):
        ours, bare = median[f"lock {state}"], median[f"uv {state}"]
        print(
            f"  {state}: invoke lock {ours:.2f} s, bare uv pip compile {bare:.2f} s: {ours / bare:.2f}x "
            f"({ours - bare:+.2f} s: Python and invoke starting, and stackgate's own part below)"
        )
    fast, slow = statistics.median(unchanged), statistics.median(refreshed)
    print(
        f"  unchanged spec: invoke lock {fast:.3f} s (from the pylock, no index asked) against "
        f"invoke lock --refresh {slow:.2f} s (resolved again, warm): {slow / fast:.1f}x faster"
    )
    check, start = statistics.median(checks), statistics.median(floor)
    verdict = "met" if check < CHECK_GOAL_S else "MISSED"
    print(
        f"  in one process, warm: resolve() minus the same uv command run bare just before it: {own * 1000:+.0f} ms "
        "(stackgate's own part of a lock)"
    )
    print(
        f"  invoke lock --check: median {check:.3f} s (goal < {CHECK_GOAL_S:.0f} s: {verdict}); "
        f"`python -m invoke --list` {start:.3f} s: {check / start:.2f}x; in-process load + compare "
        f"{in_process * 1000:.0f} ms"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
