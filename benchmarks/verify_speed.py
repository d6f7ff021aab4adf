"""How much `invoke verify` costs against what it replaces, measured in one run.

    python benchmarks/verify_speed.py [--lock L] [--python PY] [--repeat N]

Times, on the same machine and environment:
  - `invoke verify --lock L` (every static check; exit status ignored: a CPU box fails checks),
  - `python -c "import X"` for each of the lock's import names, in the stack's interpreter,
  - `python -m torch.utils.collect_env` (torch's own environment report),
and prints verify's wall time, its ratio to the slowest single import (goal <= 1.5: checks run
in parallel, so verify should cost about one import) and to collect_env (goal < 1.0).
--python points a copy of the lock at another interpreter (e.g. a venv with the CPU torch).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from stackgate.models.spec import load_spec  # noqa: E402


def timed(argv: list[str], env: dict[str, str], repeat: int) -> tuple[float, int]:
    """Median wall time of `repeat` runs, and the last exit status."""
    times, code = [], 0
    for _ in range(repeat):
        started = time.perf_counter()
        code = subprocess.run(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode
        times.append(time.perf_counter() - started)
    return statistics.median(times), code


def retarget(spec_path: Path, python: str, folder: Path) -> Path:
    """A copy of the lock whose stack interpreter is `python`, at that interpreter's version."""
    version = subprocess.run(
        [python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"], capture_output=True, text=True, check=True
    ).stdout.strip()
    spec = load_spec(spec_path)
    text = spec_path.read_text()
    target = f'interpreter = "{python}"'
    text = (
        text.replace(f'interpreter = "{spec.python.interpreter}"', target)
        if spec.python.interpreter
        else text.replace(f'root = "{spec.python.root}"', target)
    )
    text = text.replace(f'version = "{spec.python.version}"', f'version = "{version}"', 1)
    out = folder / spec_path.name
    out.write_text(text)
    return out


def arguments(doc: str | None, python_help: str) -> argparse.Namespace:
    """--lock (default: the H200 profile), --python and --repeat, as the verify benchmarks take them."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lock", type=Path, default=ROOT / "lockfiles" / "hopper-sm90-cu130.toml")
    parser.add_argument("--python", help=python_help)
    parser.add_argument("--repeat", type=int, default=3)
    return parser.parse_args()


def main() -> int:
    args = arguments(__doc__, "run the stack checks against this interpreter instead of the lock's")
    paths = [str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env = {**os.environ, "NO_COLOR": "1", "PYTHONPATH": os.pathsep.join(paths)}
    with tempfile.TemporaryDirectory() as tmp:
        spec_path = retarget(args.lock, args.python, Path(tmp)) if args.python else args.lock
        spec = load_spec(spec_path)
        python = str(spec.python.target)
        imports = {name: timed([python, "-c", f"import {name}"], env, args.repeat) for name in spec.python.imports}
        collect_env, collect_code = timed([python, "-m", "torch.utils.collect_env"], env, args.repeat)
        verify, verify_code = timed(
            [sys.executable, "-m", "invoke", "verify", "--lock", str(spec_path)], env, args.repeat
        )
    print(f"lock: {args.lock.name}  interpreter: {python}  median of {args.repeat} runs each")
    for name, (seconds, code) in imports.items():
        print(f"  import {name:<14} {seconds:7.3f} s" + ("" if code == 0 else f"  (failed: exit {code}, not counted)"))
    print(f"  torch collect_env     {collect_env:7.3f} s" + ("" if collect_code == 0 else f"  (exit {collect_code})"))
    print(f"  invoke verify         {verify:7.3f} s  (exit {verify_code})")
    working = [seconds for seconds, code in imports.values() if code == 0]
    if working:
        slowest = max(working)
        print(f"verify / slowest import = {verify / slowest:.2f}  (goal <= 1.5)")
    if collect_code == 0:
        print(f"verify / collect_env    = {verify / collect_env:.2f}  (goal < 1.0)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
