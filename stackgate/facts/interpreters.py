"""The stack's own interpreter, asked about itself (the probe, import tests), and the search
for a base interpreter of the locked Python version that provisioning builds environments from.

stackgate never imports torch: the target interpreter runs :mod:`stackgate.edges.probe` as a
file and one ``python -c "import NAME"`` per locked import, and reports back.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable, Mapping

from stackgate.edges import runner
from stackgate.facts.toolkits import TOOL_TIMEOUT_S
from stackgate.facts.values import BasePython, Distribution, ImportOutcome, Missing, ProbeFacts
from stackgate.models import settings
from stackgate.models.spec import Spec

__all__ = ["PROBE", "base_python", "demangle", "describe", "dists", "imports", "probe", "target_missing"]

PROBE = Path(__file__).resolve().parents[1] / "edges" / "probe.py"  # run by the target interpreter, as a file


def target_missing(spec: Spec) -> Missing | None:
    """Why the lock's interpreter cannot be asked (it does not exist), or None."""
    target = spec.python.target
    if target.exists():
        return None
    if spec.python.root is not None:
        return Missing(f"no stack environment at {target}: run `stackgate provision`")
    return Missing(f"the lock's interpreter {target} does not exist")


def probe(spec: Spec, env: Mapping[str, str], dists: Callable[[], ProbeFacts | Missing]) -> ProbeFacts | Missing:
    """The target interpreter's account of itself, its distributions and torch, run in ``env``:
    torch's part here, the distributions from ``dists`` (the facts' own part, read beside torch's
    import, which dominates: one reading of every distribution's metadata serves both)."""
    missing = target_missing(spec)
    if missing is not None:
        return missing
    torch_run = _run_probe(spec.python.target, {"torch": True, "distributions": False}, env)
    if isinstance(torch_run, Missing):
        return torch_run
    found = dists()
    if isinstance(found, Missing):
        return found
    torch_part, torch_s = torch_run
    return dataclasses.replace(found, torch=torch_part["torch"], duration_s=max(torch_s, found.duration_s))


def _run_probe(
    python: Path, request: Mapping[str, Any], env: Mapping[str, str]
) -> tuple[dict[str, Any], float] | Missing:
    with tempfile.TemporaryDirectory(prefix="stackgate-probe-") as tmp:
        out = Path(tmp) / "facts.json"
        done = runner.run(
            [python, PROBE, out, json.dumps(request)], timeout_s=settings.PROBE_TIMEOUT_S.value(), env=env
        )
        if not out.exists():
            return Missing(f"the probe failed in {python} ({done.ended}): {' / '.join(done.tail(3))}")
        return json.loads(out.read_text()), done.duration_s


def _probe_facts(raw: Mapping[str, Any], duration_s: float) -> ProbeFacts:
    dists = {
        key: Distribution(
            d["name"],
            d["version"],
            tuple(d["requires"]),
            d["location"],
            tuple(d.get("shared_objects", ())),
            tuple(d.get("wheel_tags", ())),
            d.get("direct_url"),
            d.get("object_sizes") or {},
        )
        for key, d in raw["distributions"].items()
    }
    python = raw["python"]
    return ProbeFacts(python["executable"], python["version"], python["markers"], dists, raw.get("torch"), duration_s)


def dists(spec: Spec, env: Mapping[str, str]) -> ProbeFacts | Missing:
    """The probe without importing torch: the installed distributions, each with its shared objects and the sizes
    its RECORD gives them (the ELF scan's and the evidence sweep's). What provision plans from, so that a no-op
    provision does not pay for torch's import, and the distributions half of :func:`probe`."""
    missing = target_missing(spec)
    if missing is not None:
        return missing
    request = {"torch": False, "files_of": [p.name for p in spec.python.packages], "every_file": True}
    found = _run_probe(spec.python.target, request, env)
    if isinstance(found, Missing):
        return found
    raw, seconds = found
    return _probe_facts(raw, seconds)


def describe(python: Path, env: Mapping[str, str], *, torch: bool) -> ProbeFacts | Missing:
    """Any interpreter's account of itself and its distributions (with ``torch``: torch's facts too,
    importing it there), with no lock: what `stackgate init` writes a spec from."""
    found = _run_probe(python, {"torch": torch, "files_of": []}, env)
    if isinstance(found, Missing):
        return found
    raw, seconds = found
    return _probe_facts(raw, seconds)


def base_python(spec: Spec, environ: Mapping[str, str]) -> BasePython | Missing:
    """An interpreter of the locked Python version on this machine, searched in ``environ``."""
    want = spec.python.version
    tried: list[str] = []
    for path, where in _python_candidates(want, environ):
        found = _ask_python(path, want)
        if isinstance(found, Missing):
            tried.append(f"{where}: {found.reason}")
            continue
        real, version, pip = found
        return BasePython(real, version, where, pip)
    places = (
        f"searched ${settings.BASE_PYTHON.env}, python{want} on PATH, pyenv's versions/{want}.*, uv's "
        f"cpython-{want}.*, /usr/local/bin, /usr/bin"
    )
    rejected = f"; rejected: {'; '.join(tried)}" if tried else ""
    return Missing(
        f"no Python {want} on this machine ({places}{rejected}). uv cannot download Python here: install "
        f"Python {want} (e.g. `pyenv install {want}` or `apt-get install python{want}-venv`) or set "
        f"{settings.BASE_PYTHON.env} to its interpreter"
    )


def _python_candidates(want: str, environ: Mapping[str, str]) -> list[tuple[Path, str]]:
    """Where an interpreter of version ``want`` may be: $STACKGATE_BASE_PYTHON, PATH, pyenv, uv, /usr."""
    named = settings.BASE_PYTHON.lookup(environ)
    if named.value is not None:
        return [(named.value, named.source)]
    found: list[tuple[Path, str]] = []
    for directory in environ.get("PATH", "").split(os.pathsep):
        if directory and (Path(directory) / f"python{want}").exists():
            found.append((Path(directory) / f"python{want}", f"python{want} on PATH ({directory})"))
    pyenv = Path(environ.get("PYENV_ROOT") or Path(environ.get("HOME", "/root")) / ".pyenv") / "versions"
    # pyenv's shims answer only for the selected version; its installs answer for themselves.
    for home in sorted(pyenv.glob(f"{want}.*"), key=lambda p: _patch_level(p.name), reverse=True):
        found.append((home / "bin" / f"python{want}", f"pyenv ({home})"))
    uv_home = Path(
        environ.get("UV_PYTHON_INSTALL_DIR") or Path(environ.get("HOME", "/root")) / ".local/share/uv/python"
    )
    for home in sorted(uv_home.glob(f"cpython-{want}.*"), reverse=True):
        found.append((home / "bin" / f"python{want}", f"uv-managed ({home})"))
    for directory in ("/usr/local/bin", "/usr/bin"):
        found.append((Path(directory) / f"python{want}", directory))
    unique: dict[Path, str] = {}
    for path, where in found:
        unique.setdefault(path, where)
    return [(path, where) for path, where in unique.items() if path.exists()]


def _patch_level(name: str) -> tuple[int, ...]:
    """3.12.10 sorts above 3.12.9.

    >>> _patch_level("3.12.10") > _patch_level("3.12.9")
    True
    """
    return tuple(int(p) if p.isdigit() else -1 for p in name.split("."))


#: The interpreter, its version, and the pip wheel its ensurepip carries (empty: none; Debian's
#: Python keeps it in python3-venv): installing that wheel takes well under a second, where
#: ``python -m ensurepip`` takes seconds.
_ASK = (
    "import glob, os, platform, sys, sysconfig; print(sys.executable); print(platform.python_version()); "
    "print((sorted(glob.glob(os.path.join(sysconfig.get_path('stdlib'), 'ensurepip', '_bundled', 'pip-*.whl'))) or "
    "[''])[-1])"
)


def _ask_python(path: Path, want: str) -> tuple[Path, str, Path | None] | Missing:
    done = runner.run([path, "-c", _ASK], timeout_s=TOOL_TIMEOUT_S)
    lines = done.stdout.splitlines()
    if not done.ok or len(lines) != 3:
        return Missing(f"does not run ({done.ended}: {' '.join(done.tail(1))})")
    executable, version, pip = lines
    if ".".join(version.split(".")[:2]) != want:
        return Missing(f"is Python {version}")
    return Path(executable), version, Path(pip) if pip else None


def imports(
    spec: Spec, env: Mapping[str, str], probed: Callable[[], ProbeFacts | Missing]
) -> dict[str, ImportOutcome] | Missing:
    """Each locked import tried in its own process, beside the probe; torch's outcome is the probe's (``probed()``,
    awaited last)."""
    missing = target_missing(spec)
    if missing is not None:
        return missing
    names = list(spec.python.imports)
    if not names:
        return {}
    # The probe imports torch already: its outcome is torch's import test.
    own = [n for n in names if n != "torch"]
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, len(own))) as pool:
        tested = dict(zip(own, pool.map(lambda n: _import_one(spec.python.target, n, env), own), strict=True))
    if "torch" in names:
        tested["torch"] = _torch_import(probed())
    return {n: tested[n] for n in names}


def _import_one(python: Path, name: str, env: Mapping[str, str]) -> ImportOutcome:
    done = runner.run([python, "-c", f"import {name}"], timeout_s=settings.IMPORT_TIMEOUT_S.value(), env=env)
    output = "" if done.ok else (done.stderr or done.stdout)
    return ImportOutcome(name, done.ok, done.duration_s, output, done.timed_out, demangle(output))


_UNDEFINED = re.compile(r"undefined symbol: ([A-Za-z0-9_.$@]+)")


def demangle(text: str) -> dict[str, str]:
    """Readable names of the C++ symbols an import error calls undefined (c++filt, if present)."""
    symbols = sorted(set(_UNDEFINED.findall(text)))
    tool = shutil.which("c++filt")
    if not symbols or tool is None:
        return {}
    done = runner.run([tool, *symbols], timeout_s=TOOL_TIMEOUT_S)
    names = done.stdout.splitlines() if done.ok else []
    return dict(zip(symbols, names, strict=True)) if len(names) == len(symbols) else {}


def _torch_import(probe: ProbeFacts | Missing) -> ImportOutcome:
    if isinstance(probe, Missing):
        return ImportOutcome("torch", False, 0.0, probe.reason)
    torch = probe.torch
    if torch is None:
        return ImportOutcome("torch", False, 0.0, "ModuleNotFoundError: No module named 'torch'")
    output = torch.get("traceback", "")
    return ImportOutcome("torch", bool(torch["imported"]), float(torch["import_s"]), output, False, demangle(output))
