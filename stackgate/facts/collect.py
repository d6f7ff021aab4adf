"""Gather the facts about this machine once, in parallel, for the checks to judge.

Facts come in parts (NVML, the toolkits, the environment, the target interpreter's probe, the
import tests, the ELF scan, the root's generations); only the parts the selected checks need are
gathered. A part that
cannot be gathered is a :class:`Missing` value with its reason, never an exception in a check.
The stack's own interpreter is asked about the stack: stackgate never imports torch itself.
"""

from __future__ import annotations

import concurrent.futures
import os
import shutil
import threading
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping

from stackgate.edges import kernellog, nvml
from stackgate.facts.values import (
    BasePython,
    ElfFile,
    ElfScan,
    EnvFacts,
    ImportOutcome,
    KernelEvents,
    Missing,
    ProbeFacts,
    ToolkitFacts,
)
from stackgate.models import kernelevents as kernelmodel
from stackgate.models.spec import Spec, Toolkit

if TYPE_CHECKING:
    from stackgate.facts import generationstate
    from stackgate.facts.evidencesweep import EvidenceSweep
    from stackgate.facts.patchstate import PatchStatus
    from stackgate.models import pylock

# Each part's own machinery (the interpreters' probes, the ELF scanner, the patches' and the
# pylock's readers) is imported by its gatherer: `verify --cached` gathers only NVML and the
# kernel log, and starts without the rest.

__all__ = ["CUDA_LINK", "DEPENDS", "PARTS", "Facts", "gather", "jit_cuda_home"]

CUDA_LINK = Path("/usr/local/cuda")

Gatherer = Callable[[Spec, "Facts"], Any]


class Facts:
    """The parts gathered for one run; each is awaited on first use."""

    def __init__(
        self, spec: Spec, *, environ: Mapping[str, str] | None = None, nvml_lib: ModuleType | None = None
    ) -> None:
        self.spec = spec
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

    @property
    def started(self) -> frozenset[str]:
        """The parts asked for so far (gathered, or being gathered)."""
        with self._guard:
            return frozenset(self._futures)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _submit(self, part: str) -> concurrent.futures.Future[Any]:
        with self._guard:
            if part not in self._futures:
                if part not in PARTS:
                    raise KeyError(f"unknown fact part {part!r}")
                self._futures[part] = self._pool.submit(_gather_part, part, self.spec, self)
            return self._futures[part]

    # Typed accessors, so that checks read like prose.
    @property
    def nvml(self) -> nvml.NvmlSnapshot | Missing:
        return self.get("nvml")

    @property
    def kernel(self) -> KernelEvents | Missing:
        return self.get("kernel")

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
    def patches(self) -> tuple[PatchStatus, ...] | Missing:
        return self.get("patches")

    @property
    def generation(self) -> generationstate.RootState | Missing:
        return self.get("generation")

    @property
    def pylock(self) -> pylock.Resolution | Missing:
        return self.get("pylock")

    @property
    def sweep(self) -> EvidenceSweep:
        """The evidence sweep's observations, gathered only when a failure's own output does not say why."""
        return self.get("sweep")

    def toolkit(self, toolkit: Toolkit) -> ToolkitFacts:
        return next(t for t in self.toolkits if t.toolkit == toolkit)


def gather(spec: Spec, parts: Iterable[str], **kwargs: Any) -> Facts:
    """Start gathering ``parts`` (and what they depend on) in parallel."""
    return Facts(spec, **kwargs).start(parts)


def _gather_part(part: str, spec: Spec, facts: Facts) -> Any:
    try:
        return PARTS[part](spec, facts)
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


def _nvml(spec: Spec, facts: Facts) -> nvml.NvmlSnapshot | Missing:
    try:
        return nvml.snapshot(facts.nvml_lib)
    except nvml.NvmlError as exc:
        return Missing(str(exc))


# --- CUDA toolkits ----------------------------------------------------------------------------


def _toolkits(spec: Spec, facts: Facts) -> tuple[ToolkitFacts, ...]:
    from stackgate.facts.toolkits import inspect_toolkit

    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, len(spec.toolkits))) as pool:
        return tuple(pool.map(lambda t: inspect_toolkit(t, spec.hardware.arch), spec.toolkits))


# --- the environment --------------------------------------------------------------------------


def _env(spec: Spec, facts: Facts) -> EnvFacts:
    from stackgate.models import envfile

    env_file = spec.python.env_file
    error = None
    try:
        environ, from_file = envfile.apply(env_file, facts.base_environ)
    except envfile.EnvFileError as exc:
        environ, from_file, error = dict(facts.base_environ), {}, str(exc)
    on_path = shutil.which("nvcc", path=environ.get("PATH", ""))
    home, by = jit_cuda_home(environ, on_path)
    link = CUDA_LINK.resolve() if CUDA_LINK.exists() else None
    return EnvFacts(
        environ,
        from_file,
        env_file if env_file and env_file.is_file() else None,
        error,
        Path(on_path) if on_path else None,
        link,
        home,
        by,
    )


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


# --- the target interpreter (stackgate.facts.interpreters) ------------------------------------


def _probe(spec: Spec, facts: Facts) -> ProbeFacts | Missing:
    from stackgate.facts import interpreters

    facts.start(["dists"])  # read beside torch's import, not after it
    return interpreters.probe(spec, facts.get("env").environ, lambda: facts.get("dists"))


def _dists(spec: Spec, facts: Facts) -> ProbeFacts | Missing:
    from stackgate.facts import interpreters

    return interpreters.dists(spec, facts.get("env").environ)


def _base_python(spec: Spec, facts: Facts) -> BasePython | Missing:
    from stackgate.facts import interpreters

    return interpreters.base_python(spec, facts.base_environ)


def _imports(spec: Spec, facts: Facts) -> dict[str, ImportOutcome] | Missing:
    from stackgate.facts import interpreters

    # The probe is awaited only for torch's outcome, after the other imports ran beside it.
    return interpreters.imports(spec, facts.get("env").environ, lambda: facts.get("probe"))


# --- ELF scan ---------------------------------------------------------------------------------


def _elf(spec: Spec, facts: Facts) -> ElfScan | Missing:
    from stackgate.edges import elf

    probe = facts.get("probe")
    if isinstance(probe, Missing):
        return probe
    files, unreadable = [], []
    for package in spec.python.packages:
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


def _patches(spec: Spec, facts: Facts) -> tuple[PatchStatus, ...] | Missing:
    """Each locked patch as found in the package's site-packages (read there, never imported)."""
    from stackgate.facts.patchstate import inspect_patch

    probe = facts.get("probe")
    if isinstance(probe, Missing):
        return probe
    found = []
    for patch in spec.patches:
        dist = probe.dist(patch.package)
        found.append(inspect_patch(patch, Path(dist.location) if dist else None))
    return tuple(found)


# --- the root's generations ------------------------------------------------------------------


def _generation(spec: Spec, facts: Facts) -> generationstate.RootState | Missing:
    """What provision built under the lock's root, and which generation is live."""
    from stackgate.facts import generationstate

    if spec.python.root is None:
        return Missing(
            f"python.interpreter names an existing environment ({spec.python.interpreter}): there are no generations"
        )
    return generationstate.read(spec.python.root)


# --- the pylock -------------------------------------------------------------------------------


def _pylock(spec: Spec, facts: Facts) -> pylock.Resolution | Missing:
    """The spec's resolution (``pylock.<name>.toml`` beside it), as the files say now."""
    from stackgate.models import pylock

    path = pylock.path_for(spec.path)
    if not path.exists():
        return Missing(f"the spec has no pylock: {path} does not exist (`{pylock.lock_command(spec.path)}` makes it)")
    try:
        return pylock.load_beside(spec)
    except pylock.PylockError as exc:
        return Missing(str(exc))


# --- the kernel log ------------------------------------------------------------------------------


def _kernel(spec: Spec, facts: Facts) -> KernelEvents | Missing:
    """The GPU events (Xid, AER, NVRM) of this boot's kernel log."""
    try:
        log = kernellog.read()
    except kernellog.KernelLogError as exc:
        return Missing(str(exc))
    return KernelEvents(log.source, tuple(kernelmodel.parse(log.text)), log.text.count("\n"))


# --- the evidence sweep --------------------------------------------------------------------------


def _sweep(spec: Spec, facts: Facts) -> EvidenceSweep:
    """What the evidence sweep sees of the environment the stack runs in (stackgate.facts.evidencesweep)."""
    from stackgate.facts import evidencesweep

    env = facts.get("env")
    return evidencesweep.observe(env.environ, facts.get("dists"), facts.get("kernel"), python=str(spec.python.target))


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
    "generation": _generation,
    "pylock": _pylock,
    "kernel": _kernel,
    "sweep": _sweep,
}
DEPENDS: dict[str, tuple[str, ...]] = {
    "probe": ("env", "dists"),
    "imports": ("env", "probe"),
    "elf": ("probe",),
    "patches": ("probe",),
    "sweep": ("env", "dists", "kernel"),
}
