"""Gather the facts about this machine once, in parallel, for the checks to judge.

Facts come in parts (NVML, the toolkits, the environment, the target interpreter's probe, the
import tests, the ELF scan); only the parts the selected checks need are gathered. A part that
cannot be gathered is a :class:`Missing` value with its reason, never an exception in a check.
The stack's own interpreter is asked about the stack: stackgate never imports torch itself.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import shutil
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Iterable, Mapping

from packaging.utils import canonicalize_name
from packaging.version import Version

from stackgate.edges import runner
from stackgate.edges import elf, nvml
from stackgate.models import envfile
from stackgate.stack import patches
from stackgate.models.spec import Lock, Toolkit

__all__ = [
    "PARTS",
    "ArchBuild",
    "BasePython",
    "Distribution",
    "ElfFile",
    "EnvFacts",
    "Facts",
    "ImportOutcome",
    "Missing",
    "ProbeFacts",
    "ToolVersion",
    "ToolkitFacts",
    "gather",
]

PROBE = Path(__file__).resolve().parents[1] / "edges" / "probe.py"  # run by the target interpreter, as a file
PROBE_TIMEOUT_S = float(os.environ.get("STACKGATE_PROBE_TIMEOUT_S", "180"))
IMPORT_TIMEOUT_S = float(os.environ.get("STACKGATE_IMPORT_TIMEOUT_S", "180"))
TOOL_TIMEOUT_S = 60.0
CUDA_LINK = Path("/usr/local/cuda")
_RELEASE = re.compile(r"release (\d+\.\d+), V(\d+\.\d+\.\d+)")


@dataclass(frozen=True)
class Missing:
    """A fact that could not be gathered, and why."""

    reason: str

    def __bool__(self) -> bool:
        return False


@dataclass(frozen=True)
class ToolVersion:
    path: Path
    release: str  #: "13.0"
    build: Version  #: 13.0.88


@dataclass(frozen=True)
class ArchBuild:
    arch: str
    ok: bool
    output: str


@dataclass(frozen=True)
class ToolkitFacts:
    toolkit: Toolkit
    exists: bool
    nvcc: ToolVersion | Missing
    ptxas: ToolVersion | Missing
    version_json: str | None  #: the release a runfile install records in version.json
    arch_build: ArchBuild | Missing

    @property
    def detected(self) -> ToolVersion | Missing:
        """nvcc's version, else ptxas's (PyPI's CUDA 12 wheels carry ptxas but no nvcc)."""
        return self.nvcc if isinstance(self.nvcc, ToolVersion) else self.ptxas


@dataclass(frozen=True)
class EnvFacts:
    """The environment the stack runs in: this shell's, with the live stackgate.env applied."""

    environ: Mapping[str, str]
    from_file: Mapping[str, str]
    env_file: Path | None
    env_file_error: str | None
    nvcc_on_path: Path | None
    cuda_link: Path | None  #: where /usr/local/cuda resolves, if it exists
    jit_home: Path  #: the CUDA home flashinfer's JIT and sgl-kernel would pick
    jit_home_by: str  #: which rule picked it

    def source(self, name: str) -> str:
        if name in self.from_file:
            return f"set by {self.env_file}"
        return "set in the shell" if name in self.environ else "not set"


@dataclass(frozen=True)
class Distribution:
    name: str
    version: str
    requires: tuple[str, ...]
    location: str
    shared_objects: tuple[str, ...] = ()


@dataclass(frozen=True)
class ProbeFacts:
    executable: str
    python_version: str
    markers: Mapping[str, str]
    distributions: Mapping[str, Distribution]
    torch: Mapping[str, Any] | None  #: None when torch is not installed
    duration_s: float

    def dist(self, name: str) -> Distribution | None:
        return self.distributions.get(canonicalize_name(name))


@dataclass(frozen=True)
class ImportOutcome:
    name: str
    ok: bool
    duration_s: float
    output: str = ""  #: the failure's stderr, or the import error text
    timed_out: bool = False
    demangled: Mapping[str, str] = field(default_factory=dict)  #: undefined symbols, readable

    @property
    def error_line(self) -> str:
        lines = [line for line in self.output.strip().splitlines() if line.strip()]
        return lines[-1] if lines else ""


@dataclass(frozen=True)
class ElfFile:
    path: str
    distribution: str
    needed: tuple[str, ...]
    cuda: tuple[elf.CudaNeed, ...]


@dataclass(frozen=True)
class ElfScan:
    files: tuple[ElfFile, ...]
    unreadable: tuple[str, ...] = ()


Gatherer = Callable[[Lock, "Facts"], Any]


class Facts:
    """The parts gathered for one run; each is awaited on first use."""

    def __init__(self, lock: Lock, *, environ: Mapping[str, str] | None = None, nvml_lib: ModuleType | None = None) -> None:
        self.lock = lock
        self.base_environ = dict(os.environ if environ is None else environ)
        self.nvml_lib = nvml_lib
        self._futures: dict[str, concurrent.futures.Future[Any]] = {}
        self._guard = threading.Lock()
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=len(PARTS), thread_name_prefix="facts")

    def start(self, parts: Iterable[str]) -> Facts:
        for part in _with_dependencies(parts):
            self._submit(part)
        return self

    def provide(self, part: str, value: Any) -> Facts:
        """Use a value already known for a part instead of gathering it (tests use this)."""
        if part not in PARTS:
            raise KeyError(f"unknown fact part {part!r}")
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        future.set_result(value)
        with self._guard:
            self._futures[part] = future
        return self

    def get(self, part: str) -> Any:
        return self._submit(part).result()

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _submit(self, part: str) -> concurrent.futures.Future[Any]:
        with self._guard:
            if part not in self._futures:
                if part not in PARTS:
                    raise KeyError(f"unknown fact part {part!r}")
                self._futures[part] = self._pool.submit(_gather_part, part, self.lock, self)
            return self._futures[part]

    # Typed accessors, so that checks read like prose.
    @property
    def nvml(self) -> nvml.NvmlSnapshot | Missing:
        return self.get("nvml")

    @property
    def toolkits(self) -> tuple[ToolkitFacts, ...]:
        return self.get("toolkits")

    @property
    def env(self) -> EnvFacts:
        return self.get("env")

    @property
    def probe(self) -> ProbeFacts | Missing:
        return self.get("probe")

    @property
    def imports(self) -> Mapping[str, ImportOutcome] | Missing:
        return self.get("imports")

    @property
    def dists(self) -> ProbeFacts | Missing:
        return self.get("dists")

    @property
    def base_python(self) -> BasePython | Missing:
        return self.get("base_python")

    @property
    def elf(self) -> ElfScan | Missing:
        return self.get("elf")

    @property
    def patches(self) -> tuple[patches.PatchStatus, ...] | Missing:
        return self.get("patches")

    def toolkit(self, toolkit: Toolkit) -> ToolkitFacts:
        return next(t for t in self.toolkits if t.toolkit == toolkit)


def gather(lock: Lock, parts: Iterable[str], **kwargs: Any) -> Facts:
    """Start gathering ``parts`` (and what they depend on) in parallel."""
    return Facts(lock, **kwargs).start(parts)


def _gather_part(part: str, lock: Lock, facts: Facts) -> Any:
    try:
        return PARTS[part](lock, facts)
    except Exception as exc:  # a fact that cannot be gathered is a fact
        return Missing(f"could not gather {part}: {type(exc).__name__}: {exc}")


def _with_dependencies(parts: Iterable[str]) -> list[str]:
    ordered: list[str] = []
    for part in parts:
        for dependency in (*DEPENDS.get(part, ()), part):
            if dependency not in ordered:
                ordered.append(dependency)
    return ordered


# --- NVML -------------------------------------------------------------------------------------


def _nvml(lock: Lock, facts: Facts) -> nvml.NvmlSnapshot | Missing:
    try:
        return nvml.snapshot(facts.nvml_lib)
    except nvml.NvmlError as exc:
        return Missing(str(exc))


# --- CUDA toolkits ----------------------------------------------------------------------------


def _toolkits(lock: Lock, facts: Facts) -> tuple[ToolkitFacts, ...]:
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, len(lock.toolkits))) as pool:
        return tuple(pool.map(lambda t: inspect_toolkit(t, lock.hardware.arch), lock.toolkits))


def inspect_toolkit(toolkit: Toolkit, arch: str) -> ToolkitFacts:
    """What is at a toolkit's prefix: versions of nvcc and ptxas, and whether ptxas builds ``arch``."""
    prefix = toolkit.prefix
    if not prefix.is_dir():
        gone = Missing(f"{prefix} does not exist")
        return ToolkitFacts(toolkit, False, gone, gone, None, gone)
    ptxas = tool_version(prefix / "bin" / "ptxas")
    return ToolkitFacts(
        toolkit,
        True,
        tool_version(prefix / "bin" / "nvcc"),
        ptxas,
        _version_json(prefix),
        build_for_arch(prefix / "bin" / "ptxas", arch) if ptxas else Missing(ptxas.reason),
    )


def tool_version(path: Path) -> ToolVersion | Missing:
    """The "release X.Y, VX.Y.Z" that nvcc and ptxas print."""
    if not path.exists():
        return Missing(f"{path} does not exist")
    done = runner.run([path, "--version"], timeout_s=TOOL_TIMEOUT_S)
    if not done.ok:
        return Missing(f"{path} --version failed ({_ended(done)}): {' '.join(done.tail(2))}")
    match = _RELEASE.search(done.stdout)
    if not match:
        return Missing(f"{path} --version printed no 'release X.Y, VX.Y.Z' line")
    return ToolVersion(path, match[1], Version(match[2]))


# The lowest PTX ISA that knows each arch, so that an older ptxas is not refused for the .version.
_PTX_ISA = {"sm_120": "8.7", "sm_121": "8.8", "sm_100": "8.6", "sm_101": "8.6", "sm_103": "8.8", "sm_90": "8.0", "sm_89": "7.8"}
_PTX = ".version {isa}\n.target {arch}\n.address_size 64\n.visible .entry stackgate_probe() {{ ret; }}\n"


def build_for_arch(ptxas: Path, arch: str) -> ArchBuild:
    """Assemble a one-instruction kernel for ``arch`` (no GPU needed)."""
    isa = _PTX_ISA.get(arch.rstrip("af"), "7.0")
    with tempfile.TemporaryDirectory(prefix="stackgate-ptxas-") as tmp:
        source = Path(tmp) / "probe.ptx"
        source.write_text(_PTX.format(isa=isa, arch=arch))
        done = runner.run([ptxas, f"-arch={arch}", source, "-o", Path(tmp) / "probe.cubin"], timeout_s=TOOL_TIMEOUT_S)
    return ArchBuild(arch, done.ok, (done.stderr or done.stdout).strip())


def _version_json(prefix: Path) -> str | None:
    try:
        data = json.loads((prefix / "version.json").read_text())
        return str(data["cuda"]["version"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


# --- the environment --------------------------------------------------------------------------


def _env(lock: Lock, facts: Facts) -> EnvFacts:
    env_file = lock.python.env_file
    error = None
    try:
        environ, from_file = envfile.apply(env_file, facts.base_environ)
    except envfile.EnvFileError as exc:
        environ, from_file, error = dict(facts.base_environ), {}, str(exc)
    on_path = shutil.which("nvcc", path=environ.get("PATH", ""))
    home, by = jit_cuda_home(environ, on_path)
    link = CUDA_LINK.resolve() if CUDA_LINK.exists() else None
    return EnvFacts(environ, from_file, env_file if env_file and env_file.is_file() else None, error, Path(on_path) if on_path else None, link, home, by)


def jit_cuda_home(environ: Mapping[str, str], nvcc_on_path: str | None) -> tuple[Path, str]:
    """The CUDA home flashinfer's JIT and sgl-kernel pick: CUDA_HOME, CUDA_PATH, nvcc on PATH, /usr/local/cuda.

    >>> jit_cuda_home({"CUDA_PATH": "/opt/cuda"}, "/usr/bin/nvcc")
    (PosixPath('/opt/cuda'), 'CUDA_PATH')
    """
    for name in ("CUDA_HOME", "CUDA_PATH"):
        if environ.get(name):
            return Path(environ[name]), name
    if nvcc_on_path:
        # flashinfer takes dirname(dirname(`which nvcc`)) without resolving links.
        return Path(nvcc_on_path).parent.parent, "the nvcc on PATH"
    return CUDA_LINK, "the /usr/local/cuda fallback"


# --- the target interpreter -------------------------------------------------------------------


def _target_missing(lock: Lock) -> Missing | None:
    target = lock.python.target
    if target.exists():
        return None
    if lock.python.root is not None:
        return Missing(f"no stack environment at {target}: run `invoke provision`")
    return Missing(f"the lock's interpreter {target} does not exist")


def _probe(lock: Lock, facts: Facts) -> ProbeFacts | Missing:
    missing = _target_missing(lock)
    if missing is not None:
        return missing
    env = facts.get("env").environ
    # torch's import dominates; reading every distribution's metadata runs beside it.
    requests = ({"torch": True, "distributions": False}, {"torch": False, "files_of": [p.name for p in lock.python.packages]})
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        parts = list(pool.map(lambda request: _run_probe(lock.python.target, request, env), requests))
    for part in parts:
        if isinstance(part, Missing):
            return part
    (torch_part, torch_s), (dists_part, dists_s) = parts
    return _probe_facts({**dists_part, "torch": torch_part["torch"]}, max(torch_s, dists_s))


def _run_probe(python: Path, request: Mapping[str, Any], env: Mapping[str, str]) -> tuple[dict[str, Any], float] | Missing:
    with tempfile.TemporaryDirectory(prefix="stackgate-probe-") as tmp:
        out = Path(tmp) / "facts.json"
        done = runner.run([python, PROBE, out, json.dumps(request)], timeout_s=PROBE_TIMEOUT_S, env=env)
        if not out.exists():
            return Missing(f"the probe failed in {python} ({_ended(done)}): {' / '.join(done.tail(3))}")
        return json.loads(out.read_text()), done.duration_s


def _probe_facts(raw: Mapping[str, Any], duration_s: float) -> ProbeFacts:
    dists = {
        key: Distribution(d["name"], d["version"], tuple(d["requires"]), d["location"], tuple(d.get("shared_objects", ())))
        for key, d in raw["distributions"].items()
    }
    python = raw["python"]
    return ProbeFacts(python["executable"], python["version"], python["markers"], dists, raw.get("torch"), duration_s)


def _dists(lock: Lock, facts: Facts) -> ProbeFacts | Missing:
    """The probe without importing torch: the installed distributions only. What provision plans
    from, so that a no-op provision does not pay for torch's import."""
    missing = _target_missing(lock)
    if missing is not None:
        return missing
    found = _run_probe(lock.python.target, {"torch": False}, facts.get("env").environ)
    if isinstance(found, Missing):
        return found
    raw, seconds = found
    return _probe_facts(raw, seconds)


# --- an interpreter to build the stack's environment from -------------------------------------


@dataclass(frozen=True)
class BasePython:
    """An interpreter of the locked Python version found on this machine (what `uv venv` gets)."""

    path: Path  #: the real executable (never a pyenv shim)
    version: str  #: its full version, e.g. 3.12.1
    found_by: str  #: where it was found, for -v and the plan


def _base_python(lock: Lock, facts: Facts) -> BasePython | Missing:
    want = lock.python.version
    environ = facts.base_environ
    tried: list[str] = []
    for path, where in _python_candidates(want, environ):
        found = _ask_python(path, want)
        if isinstance(found, Missing):
            tried.append(f"{where}: {found.reason}")
            continue
        real, version = found
        return BasePython(real, version, where)
    places = f"searched $STACKGATE_PYTHON, python{want} on PATH, pyenv's versions/{want}.*, uv's cpython-{want}.*, /usr/local/bin, /usr/bin"
    rejected = f"; rejected: {'; '.join(tried)}" if tried else ""
    return Missing(
        f"no Python {want} on this machine ({places}{rejected}). uv cannot download Python here: install "
        f"Python {want} (e.g. `pyenv install {want}` or `apt-get install python{want}-venv`) or set "
        f"STACKGATE_PYTHON to its interpreter"
    )


def _python_candidates(want: str, environ: Mapping[str, str]) -> list[tuple[Path, str]]:
    """Where an interpreter of version ``want`` may be: $STACKGATE_PYTHON, PATH, pyenv, uv, /usr."""
    if environ.get("STACKGATE_PYTHON"):
        return [(Path(environ["STACKGATE_PYTHON"]), "$STACKGATE_PYTHON")]
    found: list[tuple[Path, str]] = []
    for directory in environ.get("PATH", "").split(os.pathsep):
        if directory and (Path(directory) / f"python{want}").exists():
            found.append((Path(directory) / f"python{want}", f"python{want} on PATH ({directory})"))
    pyenv = Path(environ.get("PYENV_ROOT") or Path(environ.get("HOME", "/root")) / ".pyenv") / "versions"
    # pyenv's shims answer only for the selected version; its installs answer for themselves.
    for home in sorted(pyenv.glob(f"{want}.*"), key=lambda p: _patch_level(p.name), reverse=True):
        found.append((home / "bin" / f"python{want}", f"pyenv ({home})"))
    uv_home = Path(environ.get("UV_PYTHON_INSTALL_DIR") or Path(environ.get("HOME", "/root")) / ".local/share/uv/python")
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


_ASK = "import sys, platform; print(sys.executable); print(platform.python_version())"


def _ask_python(path: Path, want: str) -> tuple[Path, str] | Missing:
    done = runner.run([path, "-c", _ASK], timeout_s=TOOL_TIMEOUT_S)
    lines = done.stdout.split()
    if not done.ok or len(lines) != 2:
        return Missing(f"does not run ({_ended(done)}: {' '.join(done.tail(1))})")
    executable, version = lines
    if ".".join(version.split(".")[:2]) != want:
        return Missing(f"is Python {version}")
    return Path(executable), version


def _imports(lock: Lock, facts: Facts) -> dict[str, ImportOutcome] | Missing:
    missing = _target_missing(lock)
    if missing is not None:
        return missing
    names = list(lock.python.imports)
    if not names:
        return {}
    env = facts.get("env").environ
    # The probe imports torch already: its outcome is torch's import test.
    own = [n for n in names if n != "torch"]
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, len(own))) as pool:
        tested = dict(zip(own, pool.map(lambda n: _import_one(lock.python.target, n, env), own), strict=True))
    if "torch" in names:
        tested["torch"] = _torch_import(facts.get("probe"))
    return {n: tested[n] for n in names}


def _import_one(python: Path, name: str, env: Mapping[str, str]) -> ImportOutcome:
    done = runner.run([python, "-c", f"import {name}"], timeout_s=IMPORT_TIMEOUT_S, env=env)
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


# --- ELF scan ---------------------------------------------------------------------------------


def _elf(lock: Lock, facts: Facts) -> ElfScan | Missing:
    probe = facts.get("probe")
    if isinstance(probe, Missing):
        return probe
    files, unreadable = [], []
    for package in lock.python.packages:
        dist = probe.dist(package.name)
        for path in dist.shared_objects if dist else ():
            try:
                sonames = elf.needed(path)
            except elf.ElfError as exc:
                unreadable.append(str(exc))
                continue
            files.append(ElfFile(path, package.name, sonames, elf.cuda_majors(sonames)))
    return ElfScan(tuple(files), tuple(unreadable))


# --- patches ----------------------------------------------------------------------------------


def _patches(lock: Lock, facts: Facts) -> tuple[patches.PatchStatus, ...] | Missing:
    """Each locked patch as found in the package's site-packages (read there, never imported)."""
    probe = facts.get("probe")
    if isinstance(probe, Missing):
        return probe
    found = []
    for patch in lock.patches:
        dist = probe.dist(patch.package)
        found.append(patches.inspect_patch(patch, Path(dist.location) if dist else None))
    return tuple(found)


def _ended(done: runner.Completed) -> str:
    return "timed out" if done.timed_out else f"exit {done.returncode}"


#: How each part is gathered, and what it needs first.
PARTS: dict[str, Gatherer] = {
    "nvml": _nvml,
    "toolkits": _toolkits,
    "env": _env,
    "probe": _probe,
    "dists": _dists,
    "base_python": _base_python,
    "imports": _imports,
    "elf": _elf,
    "patches": _patches,
}
DEPENDS: dict[str, tuple[str, ...]] = {"probe": ("env",), "imports": ("env", "probe"), "elf": ("probe",), "patches": ("probe",)}
