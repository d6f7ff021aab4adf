"""The lockfile model: TOML -> frozen, typed dataclasses.

Every error is collected with its key path and reported at once, so that a user fixes a bad
lockfile in one pass. Loading never raises anything but :class:`LockError`, whatever the bytes
in the file: a bad lockfile must fail before anything on the machine is touched.
"""

from __future__ import annotations

import difflib
import hashlib
import ipaddress
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Callable, Iterator, Mapping
from urllib.parse import urlsplit

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from stackgate.models import inputfile, settings
from stackgate.models.exitcodes import UsageError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

__all__ = [
    "Spec",
    "SpecError",
    "DEFAULT_LOCK",
    "DEFAULT_PLATFORM",
    "FUSION_SEVERITIES",
    "MAX_JIT_TIMEOUT_S",
    "PYPI_CUDA12_REASON",
    "SHELL_REFERENCE",
    "STREAM_IDLE_GAPS",
    "Benchmark",
    "Capability",
    "Compare",
    "Deep",
    "DeepAttention",
    "DeepFusion",
    "Hardware",
    "Index",
    "Nccl",
    "Override",
    "Package",
    "Patch",
    "Python",
    "Smoke",
    "Speculative",
    "Stack",
    "Toolkit",
    "control_problems",
    "default_lock_path",
    "edit_hint",
    "is_shipped",
    "read_only_problem",
    "dollar_problem",
    "load_spec",
    "loads_spec",
    "patch_location_problem",
    "read_toml",
    "url_problem",
]

#: The installed package: the lockfiles and the patches they name ship inside it (package data), so
#: the default profile is found without a checkout (the checkout's lockfiles/ and patches/ link here).
_PACKAGE = Path(__file__).resolve().parents[1]
#: The profile used when nothing else names one (:func:`default_lock_path`).
DEFAULT_LOCK = _PACKAGE / "lockfiles" / "blackwell-sm120-cu130.toml"
#: The spec of the current folder, as `stackgate init` writes it.
LOCAL_LOCK = "stackgate.toml"
#: The machine's spec, in $STACKGATE_SYSTEM_DIR (`stackgate init --system` writes it).
SYSTEM_LOCK = "stack.toml"
#: Where packages not mapped to a [[python.index]] come from, unless python.default_index says.
DEFAULT_INDEX = "https://pypi.org/simple"
#: The platform `stackgate lock` resolves for (uv's --python-platform), unless python.platform says:
#: the x86_64 Linux servers the profiles describe, glibc 2.28 or newer (torch's own wheels' floor).
DEFAULT_PLATFORM = "x86_64-manylinux_2_28"
#: What python.platform may name: uv's Linux targets (a GPU server runs Linux).
_PLATFORM = re.compile(r"(x86_64|aarch64)-(unknown-linux-gnu|manylinux_2_\d{2})")

TOOLKIT_SOURCES = ("pypi", "runfile", "apt")
INSTALLERS = ("uv", "pip")
CUDA_LINK_POLICIES = ("leave", "default")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
#: Speculative algorithms SGLang 0.5.9 accepts (--speculative-algorithm choices).
SPECULATIVE_ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM")
#: Algorithms whose draft is a separate model that --speculative-draft-model-path names.
_DRAFT_MODEL_ALGORITHMS = ("EAGLE", "EAGLE3", "STANDALONE")
#: Options smoke sets itself from [smoke] and the CLI; a flag list must not repeat them.
MANAGED_FLAGS = {
    "--model-path": "smoke.model",
    "--model": "smoke.model",
    "--tp-size": "smoke.tp",
    "--tp": "smoke.tp",
    "--tensor-parallel-size": "smoke.tp",
    "--host": "smoke.host",
    "--port": "smoke.port",
    "--attention-backend": "smoke.attention_backend",
    "--load-format": "fast mode (--fast)",
    "--json-model-override-args": "fast mode (--fast)",
}
#: A lock reference such as {toolkit.default}; ``${NAME}`` is the shell's, not ours.
_REFERENCE = re.compile(r"(?<!\$)\{([A-Za-z_][A-Za-z0-9_.]*)\}")
#: The only use of ``$`` an environment value may make: a plain variable reference, which
#: stackgate.env leaves to the shell (and envfile.parse expands the same way).
SHELL_REFERENCE = re.compile(r"\$(?:\{[A-Za-z_][A-Za-z0-9_]*\}|[A-Za-z_][A-Za-z0-9_]*)")
#: Refused in every key and string of a lockfile: C0 controls (NUL, newline, ESC ...), DEL, C1
#: controls, and the Unicode line and paragraph separators (Python's splitlines breaks there).
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
#: Free text that may hold a tab (and the benchmark prompt, sent as JSON, may hold newlines).
#: Nothing else may: every other string can reach a shell file, a command line or a log line.
_FREE_TEXT = {
    "stack.description": "\t",
    "python.override[].reason": "\t",
    "patch[].reason": "\t",
    "benchmark.prompt": "\t\n",
}
#: The shipped patches (patches/ beside lockfiles/ in the package): any lockfile may name one of them.
SHIPPED_PATCHES = _PACKAGE / "patches"
#: Why source = "pypi" is refused for CUDA 12.x (stack/toolkit.py gives the same reason).
PYPI_CUDA12_REASON = (
    'PyPI\'s CUDA 12 nvcc wheels carry ptxas, headers and nvvm but not the nvcc driver; use source = "runfile" or "apt"'
)


class SpecError(UsageError):
    """A lockfile that cannot be used, with every problem found and its key path."""

    def __init__(self, path: Path | str, problems: list[str]) -> None:
        self.path = Path(path)
        self.problems = list(problems)
        lines = "\n".join(f"  {problem}" for problem in self.problems)
        noun = "problem" if len(self.problems) == 1 else "problems"
        super().__init__(f"{self.path}: {len(self.problems)} {noun} in the lockfile:\n{lines}")


@dataclass(frozen=True, order=True)
class Capability:
    """A CUDA compute capability such as 12.0.

    >>> Capability.parse("12.0").arch
    'sm_120a'
    >>> str(Capability(9, 0))
    '9.0'
    """

    major: int
    minor: int

    @classmethod
    def parse(cls, text: str) -> Capability:
        match = re.fullmatch(r"(\d{1,2})\.(\d)", text.strip())
        if not match:
            raise ValueError(f"invalid compute capability {text!r} (expected e.g. '12.0')")
        return cls(int(match[1]), int(match[2]))

    @property
    def arch(self) -> str:
        # Hopper and newer have arch-specific ("a") targets that the stack's kernels build for.
        suffix = "a" if self.major >= 9 else ""
        return f"sm_{self.major}{self.minor}{suffix}"

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}"


@dataclass(frozen=True)
class Stack:
    name: str
    description: str = ""
    cuda_link: str = "leave"  #: what provision does with /usr/local/cuda: leave | default


@dataclass(frozen=True)
class Hardware:
    gpu_count: int
    compute_capability: Capability
    gpu_name: str
    min_driver: Version
    arch: str  #: the ptxas target the default toolkit must build, e.g. sm_120a


@dataclass(frozen=True)
class Toolkit:
    version: Version  #: the CUDA release, e.g. 13.0.1
    prefix: Path
    source: str | None = None  #: pypi | runfile | apt; None for a toolkit that is only kept
    default: bool = False  #: CUDA_HOME and TRITON_PTXAS_PATH point here
    keep: bool = False  #: must exist and stay untouched
    nvcc: Version | None = None  #: the nvcc build that release ships, e.g. 13.0.88
    components: tuple[str, ...] = ()  #: pypi extras of cuda-toolkit
    url: str | None = None  #: runfile location (URL or local path)
    sha256: str | None = None

    @property
    def release(self) -> str:
        """The major.minor that ``nvcc --version`` prints as "release X.Y"."""
        return f"{self.version.major}.{self.version.minor}"

    @property
    def label(self) -> str:
        return f"CUDA {self.version} at {self.prefix}"


@dataclass(frozen=True)
class Index:
    url: str
    packages: tuple[str, ...]  #: canonical names served only from this index


@dataclass(frozen=True)
class Package:
    name: str  #: canonical name (PEP 503)
    specifier: SpecifierSet
    url: str | None = None
    sha256: str | None = None

    @property
    def requirement(self) -> str:
        """The requirement line an installer takes for this pin."""
        if self.url:
            return f"{self.name} @ {self.url}"
        return f"{self.name}{self.specifier}"

    @property
    def pinned_version(self) -> str | None:
        """The exact version of an ``==`` pin, local label included."""
        specs = list(self.specifier)
        if len(specs) == 1 and specs[0].operator in ("==", "==="):
            return specs[0].version
        return None


@dataclass(frozen=True)
class Override:
    package: str
    specifier: SpecifierSet
    reason: str


@dataclass(frozen=True)
class Python:
    version: str  #: major.minor of the target interpreter
    root: Path | None  #: stackgate-managed generations live here; <root>/current is live
    interpreter: Path | None  #: an existing interpreter to inspect instead of a managed root
    installer: str
    indexes: tuple[Index, ...]
    packages: tuple[Package, ...]
    frozen: tuple[str, ...]
    overrides: tuple[Override, ...]
    imports: tuple[str, ...]
    torch_cuda: str | None  #: torch.version.cuda the stack needs, e.g. "13.0"
    #: where every package not mapped to a [[python.index]] comes from (PyPI, or a mirror of it)
    default_index: str = DEFAULT_INDEX
    #: the platform `stackgate lock` resolves for, e.g. x86_64-manylinux_2_28 (not this machine's)
    platform: str = DEFAULT_PLATFORM

    @property
    def target(self) -> Path:
        """The interpreter whose environment is the stack."""
        if self.interpreter is not None:
            return self.interpreter
        assert self.root is not None
        return self.root / "current" / "bin" / "python"

    @property
    def env_file(self) -> Path | None:
        """The environment file provision writes into the live generation; for a generation
        looked at before it is live (``interpreter`` set beside ``root``, as provision's checks
        and an upgrade's A/B do), that generation's own."""
        if self.root is None:
            return None
        if self.interpreter is not None:
            return self.interpreter.parent.parent / "stackgate.env"
        return self.root / "current" / "stackgate.env"

    def package(self, name: str) -> Package | None:
        wanted = canonicalize_name(name)
        return next((p for p in self.packages if p.name == wanted), None)

    def override(self, name: str) -> Override | None:
        wanted = canonicalize_name(name)
        return next((o for o in self.overrides if o.package == wanted), None)


@dataclass(frozen=True)
class Patch:
    package: str
    version: Version
    file: Path
    reason: str
    sha256: str | None = None


@dataclass(frozen=True)
class Nccl:
    min_version: Version | None = None
    min_busbw_gbs: float | None = None


@dataclass(frozen=True)
class Speculative:
    """[smoke.speculative]: speculative decoding, turned into SGLang's --speculative-* flags."""

    algorithm: str
    draft_model: str = ""  #: the draft model's path (EAGLE, EAGLE3, STANDALONE)
    num_steps: int | None = None
    eagle_topk: int | None = None
    num_draft_tokens: int | None = None

    @property
    def flags(self) -> tuple[str, ...]:
        """The launch flags, in the form SGLang 0.5.9's server_args.py spells them.

        >>> Speculative("EAGLE3", "/m/draft", num_steps=3).flags
        ('--speculative-algorithm', 'EAGLE3', '--speculative-draft-model-path', '/m/draft', '--speculative-num-steps', '3')
        """
        words = ["--speculative-algorithm", self.algorithm]
        if self.draft_model:
            words += ["--speculative-draft-model-path", self.draft_model]
        for option, value in (
            ("--speculative-num-steps", self.num_steps),
            ("--speculative-eagle-topk", self.eagle_topk),
            ("--speculative-num-draft-tokens", self.num_draft_tokens),
        ):
            if value is not None:
                words += [option, str(value)]
        return tuple(words)


@dataclass(frozen=True)
class Compare:
    """[smoke.compare]: the baseline configuration that `smoke --compare` launches beside the lock's.

    Unset fields follow the lock's [smoke]; ``flags`` unset means the lock's flags without the
    allreduce-fusion flags.
    """

    name: str = "baseline"
    flags: tuple[str, ...] | None = None
    attention_backend: str | None = None
    speculative: bool = True  #: keep the lock's speculative decoding in the baseline
    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True)
class Smoke:
    engine: str = "sglang"
    model: str = ""  #: the user's model path; smoke refuses to start without one
    tp: int = 1
    host: str = "127.0.0.1"
    port: int = 30000
    attention_backend: str = "flashinfer"
    flags: tuple[str, ...] = ()
    evidence: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    ready_timeout_s: float = 1200.0
    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    speculative: Speculative | None = None
    compare: Compare | None = None
    fast_layers: int = 4  #: layers that fast mode keeps of the model's own architecture
    stop_grace_s: float = 15.0  #: SIGTERM to SIGKILL; longer than SGLang's 5 s drain poll


@dataclass(frozen=True)
class Benchmark:
    output_tokens: int = 2048
    runs: int = 5
    warmup: int = 2
    baseline_tok_s: float | None = None
    max_regression: float = 0.03
    prompt: str = "Write a long story about a lighthouse keeper."
    stream_idle_floor_s: float = 15.0  #: the shortest silence inside a stream that ends it
    max_runs: int | None = None  #: the cap on runs while the 95% interval spans the floor (default: twice runs)

    @property
    def floor_tok_s(self) -> float | None:
        """The lowest decode rate that passes: baseline_tok_s less max_regression."""
        return self.baseline_tok_s * (1 - self.max_regression) if self.baseline_tok_s else None

    @property
    def run_cap(self) -> int:
        return self.max_runs or 2 * self.runs

    @property
    def stream_idle_s(self) -> float:
        """The longest silence accepted inside a stream: STREAM_IDLE_GAPS expected inter-token
        gaps at baseline_tok_s, never less than stream_idle_floor_s.

        >>> Benchmark(baseline_tok_s=92.6).stream_idle_s, Benchmark(baseline_tok_s=2.0).stream_idle_s
        (15.0, 50.0)
        """
        expected = STREAM_IDLE_GAPS / self.baseline_tok_s if self.baseline_tok_s else 0.0
        return max(self.stream_idle_floor_s, expected)


#: A stream silent for this many expected inter-token gaps has stopped (see Benchmark.stream_idle_s).
STREAM_IDLE_GAPS = 100


#: What the allreduce-fusion check reports when this machine's GPUs cannot run the fused path.
FUSION_SEVERITIES = ("fail", "warn")
#: The longest JIT timeout a lock may ask for: the deep checks' own time limits are set from it.
MAX_JIT_TIMEOUT_S = 3600.0
#: The most tokens SGLang 0.5.9 sends through the fused path (FUSE_ALLREDUCE_MAX_BATCH_SIZE).
MAX_FUSION_TOKENS = 2048


@dataclass(frozen=True)
class DeepAttention:
    """[deep.attention]: the shapes deep.flashinfer_attention runs, per GPU (one TP rank's share).

    The defaults are the reference deployment's model family where it has the number (64 query
    heads, as Kimi K2.5 / DeepSeek-V3-style models at TP 1) and the common grouped-query layout
    where it has none (8 KV heads of 128: that family uses MLA, which these GQA kernels are not).
    """

    q_heads: int = 64
    kv_heads: int = 8
    head_dim: int = 128
    kv_len: int = 16384  #: KV tokens per request (decode, prefill and each paged request)
    prefill_len: int = 2048  #: query tokens of the causal prefill, the last ones of kv_len
    page_size: int = 16  #: KV tokens per page of the paged decode (SGLang's --page-size defaults to 1)
    batch: int = 8  #: requests in the paged batch decode
    jit_timeout_s: float = 600.0  #: the cold JIT of the four kernels took 70 s on an H200 (16 cores)


@dataclass(frozen=True)
class DeepFusion:
    """[deep.fusion]: what deep.allreduce_fusion runs when [smoke] flags enable the fusion."""

    hidden: int = 7168  #: the hidden size of the reference deployment's model (Kimi K2.5, DeepSeek-V3)
    tokens: tuple[int, ...] = (1, 4, 16, 64, 128, 256, 512)  #: decode batches up to a small prefill
    unsupported: str = "fail"  #: fail | warn when the GPUs' arch cannot run the fused path
    jit_timeout_s: float = 600.0  #: the comm module's cold JIT took 94-137 s on 2x H200


@dataclass(frozen=True)
class Deep:
    attention: DeepAttention = field(default_factory=DeepAttention)
    fusion: DeepFusion = field(default_factory=DeepFusion)


@dataclass(frozen=True)
class Spec:
    path: Path
    sha256: str  #: of the file's bytes: what the reports name
    stack: Stack
    hardware: Hardware
    toolkits: tuple[Toolkit, ...]
    python: Python
    patches: tuple[Patch, ...]
    env: Mapping[str, str]  #: [env] with references resolved
    nccl: Nccl
    smoke: Smoke
    benchmark: Benchmark
    deep: Deep = field(default_factory=Deep)

    @property
    def name(self) -> str:
        return self.stack.name

    @property
    def default_toolkit(self) -> Toolkit | None:
        return next((t for t in self.toolkits if t.default), None)


def default_lock_path(environ: Mapping[str, str] | None = None, cwd: Path | None = None) -> Path:
    """The lock a command uses without ``--lock``: ``$STACKGATE_LOCK``, ``./stackgate.toml``,
    ``/etc/stackgate/stack.toml`` (``$STACKGATE_SYSTEM_DIR``), then the shipped default profile."""
    named = settings.LOCK.value(environ)
    if named is not None:
        return named
    here = (Path.cwd() if cwd is None else cwd) / LOCAL_LOCK
    system = settings.SYSTEM_DIR.value(environ) / SYSTEM_LOCK
    return next((p for p in (here, system) if p.is_file()), DEFAULT_LOCK)


def is_shipped(path: Path) -> bool:
    """Whether ``path`` is one of the profiles shipped inside the stackgate package."""
    try:
        return Path(path).resolve().parent == DEFAULT_LOCK.parent.resolve()
    except OSError:
        return False


def read_only_problem(path: Path, action: str) -> str | None:
    """Why ``action`` must not write beside ``path``: it is a profile inside the INSTALLED package
    (site-packages: an upgrade replaces it, another user shares it). In a source checkout (a
    pyproject.toml beside the package) the shipped profiles are the project's own files."""
    if not is_shipped(path) or (_PACKAGE.parent / "pyproject.toml").is_file():
        return None
    return (
        f"{path} is a profile shipped inside the installed stackgate package: {action} would write there. "
        f"Copy it out first: `stackgate init --profile {Path(path).stem}` (./{LOCAL_LOCK}, which every command "
        "then uses; --system for /etc/stackgate), then run it again"
    )


def edit_hint(lock: Spec) -> str:
    """Where a user changes a value of ``lock``: the file, or for a profile inside the installed
    package, the copy `stackgate init --profile` makes (nothing is ever written into the package)."""
    if read_only_problem(lock.path, "an edit") is None:
        return f"in {lock.path}"
    return f"in a copy of the shipped profile (`stackgate init --profile {lock.path.stem}` writes ./{LOCAL_LOCK})"


def load_spec(path: Path | str | None = None) -> Spec:
    """Read and validate a lockfile; raise :class:`LockError` listing every problem."""
    path = default_lock_path() if path is None else Path(path)
    try:
        data = inputfile.read_capped(path, inputfile.MAX_SPEC_BYTES)
    except FileNotFoundError:
        raise SpecError(path, ["no such file"]) from None
    except IsADirectoryError:
        raise SpecError(path, ["is a directory, not a lockfile"]) from None
    except OSError as exc:
        raise SpecError(path, [f"cannot read: {exc.strerror or exc}"]) from None
    return loads_spec(data, path=path)


def loads_spec(data: bytes | str, path: Path | str = "<lockfile>") -> Spec:
    """Validate lockfile text; relative patch paths resolve against the file's folder."""
    path = Path(path)
    raw = data.encode("utf-8", "surrogateescape") if isinstance(data, str) else data
    document = read_toml(raw, path, SpecError)
    errors: list[str] = []
    lock = _Builder(errors, path).lock(_Table(document, "", errors), hashlib.sha256(raw).hexdigest())
    if errors or lock is None:
        raise SpecError(path, errors or ["invalid lockfile"])
    return lock


def read_toml(raw: bytes, path: Path, error: type[SpecError]) -> dict[str, Any]:
    """TOML bytes as a document, or ``error`` with the problem: not UTF-8, not TOML, or holding a
    control character anywhere (:func:`control_problems`). The spec and its pylock read this way."""
    try:
        document = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise error(path, [f"not UTF-8 text (byte {exc.start})"]) from None
    except tomllib.TOMLDecodeError as exc:
        raise error(path, [f"not valid TOML: {exc}"]) from None
    except RecursionError:
        raise error(path, ["not valid TOML: nested too deeply"]) from None
    # Control characters are refused before any value is read: nothing downstream (a path, an
    # env file, a command line, a terminal) ever sees one, so no check below needs to care.
    hostile = control_problems(document)
    if hostile:
        raise error(path, hostile)
    return document


_REQUIRED = object()


def control_problems(document: Mapping[str, Any]) -> list[str]:
    """Every key and string holding a control character, by key path (tab and newline only
    where :data:`_FREE_TEXT` allows them).

    >>> control_problems({"patch": [{"file": "a\\x00b"}], "stack": {"description": "a\\tb"}})
    ['patch[0].file: contains a control character (U+0000)']
    """
    problems = []
    for where, key, value in _walk(document):
        if key is not None and _CONTROL.search(key):
            problems.append(f"{where}: the key contains a control character ({_codepoint(key)})")
        if isinstance(value, str):
            allowed = _FREE_TEXT.get(re.sub(r"\[\d+\]", "[]", where), "")
            if any(c not in allowed for c in _CONTROL.findall(value)):
                problems.append(f"{where}: contains a control character ({_codepoint(value, allowed)})")
    return problems


def _walk(document: Mapping[str, Any]) -> Iterator[tuple[str, str | None, Any]]:
    """(key path, key or None for an array item, value) of every value, depth first, without
    recursion (a deeply nested document must not end in RecursionError)."""
    stack: list[tuple[str, str | None, Any]] = [("", None, document)]
    while stack:
        where, key, value = stack.pop()
        if where:
            yield where, key, value
        if isinstance(value, dict):
            stack.extend((_join(where, k), k, v) for k, v in reversed(list(value.items())))
        elif isinstance(value, list):
            stack.extend((f"{where}[{i}]", None, v) for i, v in reversed(list(enumerate(value))))


def _join(path: str, name: str) -> str:
    name = _printable(name)
    return f"{path}.{name}" if path else name


def _printable(text: str) -> str:
    r"""``text`` with control characters written as escapes, safe to print in an error.

    >>> _printable("A\x1b[2JB")
    'A\\x1b[2JB'
    """
    return _CONTROL.sub(lambda m: repr(m[0])[1:-1], text)


def _codepoint(text: str, allowed: str = "") -> str:
    return next(f"U+{ord(c):04X}" for c in _CONTROL.findall(text) if c not in allowed)


class _Table:
    """One TOML table being read: typed getters that record errors with their key path."""

    def __init__(self, data: Any, path: str, errors: list[str]) -> None:
        self.path = path
        self.errors = errors
        self.ok = isinstance(data, dict)
        if not self.ok:
            self.error("", f"must be a table, not {_kind(data)}")
        self.data: dict[str, Any] = data if self.ok else {}
        self.seen: set[str] = set()

    def key(self, name: str) -> str:
        return _join(self.path, name)

    def error(self, name: str, message: str) -> None:
        where = self.key(name) if name else (self.path or "(top level)")
        self.errors.append(f"{where}: {message}")

    def get(self, name: str, kind: type | tuple[type, ...], default: Any = _REQUIRED) -> Any:
        self.seen.add(name)
        if name not in self.data:
            if default is _REQUIRED:
                self.error(name, "missing (required)")
                return None
            return default
        value = self.data[name]
        # bool is an int in Python; a lockfile's `gpu_count = true` is still a mistake.
        if isinstance(value, bool) and bool not in _as_tuple(kind):
            self.error(name, f"must be {_names(kind)}, not a boolean")
            return None
        if not isinstance(value, kind):
            self.error(name, f"must be {_names(kind)}, not {_kind(value)}")
            return None
        return value

    def parsed(self, name: str, parse: Callable[[str], Any], default: Any = _REQUIRED) -> Any:
        text = self.get(name, str, default)
        if text is None or text is default:
            return text
        try:
            return parse(text)
        except (ValueError, InvalidVersion, InvalidSpecifier) as exc:
            self.error(name, str(exc))
            return None

    def strings(self, name: str, default: tuple[str, ...] = ()) -> tuple[str, ...]:
        items = self.get(name, list, list(default))
        if items is None:
            return ()
        bad = [i for i, item in enumerate(items) if not isinstance(item, str)]
        for i in bad:
            self.error(f"{name}[{i}]", f"must be a string, not {_kind(items[i])}")
        return tuple(item for item in items if isinstance(item, str))

    def positive(self, name: str, kind: type, default: Any = _REQUIRED) -> Any:
        value = self.get(name, (int, float) if kind is float else kind, default)
        if value is not None and value is not default and value <= 0:
            self.error(name, f"must be greater than 0, not {value}")
            return None
        return float(value) if kind is float and value is not None else value

    def sub(self, name: str, required: bool = False) -> _Table:
        value = self.get(name, dict, _REQUIRED if required else {})
        return _Table(value if value is not None else {}, self.key(name), self.errors)

    def array(self, name: str) -> list[_Table]:
        items = self.get(name, list, [])
        return [_Table(item, f"{self.key(name)}[{i}]", self.errors) for i, item in enumerate(items or [])]

    def finish(self, known: tuple[str, ...] = ()) -> None:
        """Reject keys nobody read, with a "did you mean" from the known ones."""
        for name in self.data:
            if name in self.seen:
                continue
            choices = difflib.get_close_matches(name, tuple(self.seen) + known, n=1)
            hint = f" (did you mean {choices[0]!r}?)" if choices else ""
            self.error(name, f"unknown key{hint}")


class _Builder:
    """Turns the TOML document into a :class:`Spec`, one section at a time."""

    def __init__(self, errors: list[str], path: Path) -> None:
        self.errors = errors
        self.path = path

    def lock(self, top: _Table, sha256: str) -> Spec | None:
        if not top.ok:
            return None
        stack = self.stack(top.sub("stack", required=True))
        hardware = self.hardware(top.sub("hardware", required=True))
        toolkits = self.toolkits(top)
        python = self.python(top.sub("python", required=True), toolkits)
        patches = tuple(self.patch(t) for t in top.array("patch"))
        nccl = self.nccl(top.sub("nccl"))
        smoke = self.smoke(top.sub("smoke"), hardware)
        benchmark = self.benchmark(top.sub("benchmark"))
        deep = self.deep(top.sub("deep"))
        env = self.env(top.sub("env"), stack, toolkits, python)
        top.finish()
        if self.errors:
            return None
        return Spec(self.path, sha256, stack, hardware, toolkits, python, patches, env, nccl, smoke, benchmark, deep)

    def stack(self, t: _Table) -> Stack:
        name = t.get("name", str)
        if name is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
            t.error("name", f"{name!r} must be letters, digits, '.', '_' or '-'")
        cuda_link = t.get("cuda_link", str, "leave")
        if cuda_link not in CUDA_LINK_POLICIES:
            t.error("cuda_link", f"must be one of {', '.join(CUDA_LINK_POLICIES)}, not {cuda_link!r}")
        stack = Stack(name or "", t.get("description", str, ""), cuda_link or "leave")
        t.finish()
        return stack

    def hardware(self, t: _Table) -> Hardware:
        count = t.positive("gpu_count", int)
        capability = t.parsed("compute_capability", Capability.parse)
        name = t.get("gpu_name", str)
        driver = t.parsed("min_driver", Version)
        arch = t.get("arch", str, capability.arch if capability else "")
        if arch is not None and not re.fullmatch(r"sm_\d+[af]?", arch):
            t.error("arch", f"invalid ptxas target {arch!r} (expected e.g. 'sm_120a')")
        t.finish()
        return Hardware(count or 0, capability or Capability(0, 0), name or "", driver or Version("0"), arch or "")

    def toolkits(self, top: _Table) -> tuple[Toolkit, ...]:
        toolkits = tuple(self.toolkit(t) for t in top.array("toolkit"))
        defaults = [i for i, t in enumerate(toolkits) if t.default]
        if toolkits and not defaults:
            top.error("toolkit", "exactly one toolkit must have default = true, found none")
        for i in defaults[1:]:
            top.error(
                f"toolkit[{i}].default",
                f"toolkit[{defaults[0]}] is the default already: exactly one toolkit may have default = true",
            )
        first: dict[Path, int] = {}
        for i, toolkit in enumerate(toolkits):
            if toolkit.prefix in first:
                top.error(
                    f"toolkit[{i}].prefix",
                    f"{toolkit.prefix} is toolkit[{first[toolkit.prefix]}]'s prefix too: two toolkits cannot share a prefix",
                )
            first.setdefault(toolkit.prefix, i)
        return toolkits

    def toolkit(self, t: _Table) -> Toolkit:
        version = t.parsed("version", Version)
        prefix = t.get("prefix", str)
        if prefix is not None and not os.path.isabs(prefix):
            t.error("prefix", f"must be an absolute path, not {prefix!r}")
        keep = t.get("keep", bool, False)
        source = t.get("source", str, None)
        if source is None and not keep:
            t.error("source", f"missing: say how to install it ({', '.join(TOOLKIT_SOURCES)}) or set keep = true")
        elif source is not None and source not in TOOLKIT_SOURCES:
            t.error("source", f"must be one of {', '.join(TOOLKIT_SOURCES)}, not {source!r}")
        if keep and source is not None:
            t.error("source", "a keep = true toolkit is never installed by stackgate; drop source")
        if source == "pypi" and version is not None and version.major < 13:
            t.error(
                "source",
                f"pypi cannot provide CUDA {version}: {PYPI_CUDA12_REASON}",
            )
        url = t.get("url", str, None)
        _check_url(t, "url", url, local_path=True)
        sha256 = self.sha256(t, "sha256")
        if source == "runfile" and (url is None or sha256 is None):
            t.error("url" if url is None else "sha256", "a runfile toolkit needs both url and sha256")
        toolkit = Toolkit(
            version=version or Version("0"),
            prefix=_normal_path(prefix or "/"),
            source=source,
            default=t.get("default", bool, False) or False,
            keep=keep or False,
            nvcc=t.parsed("nvcc", Version, None),
            components=t.strings("components"),
            url=url,
            sha256=sha256,
        )
        t.finish()
        return toolkit

    def python(self, t: _Table, toolkits: tuple[Toolkit, ...]) -> Python:
        version = t.get("version", str)
        if version is not None and not re.fullmatch(r"3\.\d{1,2}", version):
            t.error("version", f"must be a major.minor like '3.12', not {version!r}")
        root = t.get("root", str, None)
        interpreter = t.get("interpreter", str, None)
        if (root is None) == (interpreter is None):
            t.error(
                "root", "set exactly one of root (a stackgate-managed environment) or interpreter (an existing one)"
            )
        for name, value in (("root", root), ("interpreter", interpreter)):
            if value is not None and not os.path.isabs(value):
                t.error(name, f"must be an absolute path, not {value!r}")
        installer = t.get("installer", str, "uv")
        if installer not in INSTALLERS:
            t.error("installer", f"must be one of {', '.join(INSTALLERS)}, not {installer!r}")
        table = t.sub("packages")
        packages = self.packages(table)
        # Cross-references count a pin that failed to parse as declared: one error, not two.
        names: set[str] = {canonicalize_name(str(key)) for key in table.data}
        guard = t.sub("guard")
        frozen = tuple(canonicalize_name(n) for n in guard.strings("frozen"))
        for i, name in enumerate(frozen):
            if name not in names:
                guard.error(
                    f"frozen[{i}]", f"{name!r} has no pin in python.packages: the guard needs a version to hold"
                )
        guard.finish()
        overrides = tuple(self.override(o, names) for o in t.array("override"))
        default = next((tk for tk in toolkits if tk.default), None)
        torch_cuda = t.get("torch_cuda", str, default.release if default else None)
        if torch_cuda is not None and not re.fullmatch(r"\d+\.\d+", torch_cuda):
            t.error("torch_cuda", f"must be a CUDA major.minor like '13.0', not {torch_cuda!r}")
        python = Python(
            version=version or "",
            root=Path(root) if root else None,
            interpreter=Path(interpreter) if interpreter else None,
            installer=installer or "uv",
            indexes=tuple(self.index(i, names) for i in t.array("index")),
            packages=packages,
            frozen=frozen,
            overrides=overrides,
            imports=t.strings("imports"),
            torch_cuda=torch_cuda,
            default_index=self.default_index(t),
            platform=self.platform(t),
        )
        t.finish()
        return python

    def index(self, t: _Table, pinned: set[str]) -> Index:
        url = t.get("url", str)
        _check_url(t, "url", url)
        index = Index(url or "", tuple(canonicalize_name(n) for n in t.strings("packages")))
        # provision installs from a named index exactly the pins it maps there; an unpinned name
        # would be pulled in later, as someone's dependency, from the default index instead.
        for i, name in enumerate(index.packages):
            if name not in pinned:
                t.error(
                    f"packages[{i}]",
                    f"{name!r} has no pin in python.packages: provision installs from this index only what the lock pins",
                )
        t.finish()
        return index

    def default_index(self, t: _Table) -> str:
        url = t.get("default_index", str, DEFAULT_INDEX)
        _check_url(t, "default_index", url)
        return url or DEFAULT_INDEX

    def platform(self, t: _Table) -> str:
        value = t.get("platform", str, DEFAULT_PLATFORM) or DEFAULT_PLATFORM
        if not _PLATFORM.fullmatch(value):
            t.error(
                "platform",
                f"must be a Linux target such as {DEFAULT_PLATFORM!r} or 'aarch64-manylinux_2_28', not {value!r}",
            )
        return value

    def packages(self, t: _Table) -> tuple[Package, ...]:
        packages = []
        for raw_name, value in t.data.items():
            t.seen.add(raw_name)
            if not re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?", raw_name):
                t.error(raw_name, "is not a valid distribution name")
                continue
            package = self.package(t, raw_name, value)
            if package is not None:
                packages.append(package)
        names = [p.name for p in packages]
        for name in {n for n in names if names.count(n) > 1}:
            t.error(name, "is pinned twice (names compare after PEP 503 normalisation)")
        return tuple(packages)

    def package(self, t: _Table, raw_name: str, value: Any) -> Package | None:
        name = canonicalize_name(raw_name)
        if isinstance(value, str):
            spec = _specifier(t, raw_name, value)
            return Package(name, spec) if spec is not None else None
        if not isinstance(value, dict):
            t.error(raw_name, f"must be a version specifier or a table, not {_kind(value)}")
            return None
        table = _Table(value, t.key(raw_name), self.errors)
        spec = table.parsed("version", SpecifierSet)
        url = table.get("url", str, None)
        _check_url(table, "url", url)
        sha256 = self.sha256(table, "sha256")
        if sha256 is not None and url is None:
            table.error("sha256", "only a url package carries a sha256")
        table.finish()
        return Package(name, spec, url, sha256) if spec is not None else None

    def override(self, t: _Table, names: set[str]) -> Override:
        package = canonicalize_name(t.get("package", str) or "")
        if package and package not in names:
            t.error("package", f"{package!r} has no pin in python.packages")
        spec = t.parsed("version", SpecifierSet)
        reason = t.get("reason", str)
        if reason is not None and not reason.strip():
            t.error("reason", "must say why the override is needed")
        t.finish()
        return Override(package, spec or SpecifierSet(), reason or "")

    def patch(self, t: _Table) -> Patch:
        file = t.get("file", str)
        patch = Patch(
            package=canonicalize_name(t.get("package", str) or ""),
            version=t.parsed("version", Version) or Version("0"),
            file=_resolve_path(self.path.parent / file) if file else Path(),
            reason=t.get("reason", str) or "",
            sha256=self.sha256(t, "sha256"),
        )
        t.finish()
        return patch

    def nccl(self, t: _Table) -> Nccl:
        nccl = Nccl(t.parsed("min_version", Version, None), t.positive("min_busbw_gbs", float, None))
        t.finish()
        return nccl

    def smoke(self, t: _Table, hardware: Hardware) -> Smoke:
        port = t.get("port", int, 30000)
        if port is not None and not 0 < port < 65536:
            t.error("port", f"must be a TCP port (1-65535), not {port}")
        evidence = t.sub("evidence")
        pairs = {flag: evidence.get(flag, str) for flag in list(evidence.data)}
        flags = t.strings("flags")
        _check_flags(t, "flags", flags)
        for flag, pattern in pairs.items():
            if flag not in flags:
                evidence.error(flag, "is not one of smoke.flags: evidence is asked only of a flag that is passed")
            if pattern is not None:
                _check_pattern(evidence, flag, pattern)
        smoke = Smoke(
            engine=t.get("engine", str, "sglang") or "sglang",
            model=t.get("model", str, "") or "",
            tp=t.positive("tp", int, hardware.gpu_count or 1) or 1,
            host=t.get("host", str, "127.0.0.1") or "127.0.0.1",
            port=port or 30000,
            attention_backend=t.get("attention_backend", str, "flashinfer") or "flashinfer",
            flags=flags,
            evidence=MappingProxyType({k: v for k, v in pairs.items() if v is not None}),
            ready_timeout_s=t.positive("ready_timeout_s", float, 1200.0) or 1200.0,
            env=MappingProxyType(self.strings_table(t.sub("env"))),
            speculative=self.speculative(t.sub("speculative")) if "speculative" in t.data else None,
            compare=self.compare(t.sub("compare")) if "compare" in t.data else None,
            fast_layers=t.positive("fast_layers", int, 4) or 4,
            stop_grace_s=t.positive("stop_grace_s", float, 15.0) or 15.0,
        )
        t.finish()
        return smoke

    def speculative(self, t: _Table) -> Speculative | None:
        algorithm = t.get("algorithm", str)
        if algorithm is not None and algorithm not in SPECULATIVE_ALGORITHMS:
            t.error("algorithm", f"must be one of {', '.join(SPECULATIVE_ALGORITHMS)}, not {algorithm!r}")
        draft = t.get("draft_model", str, "") or ""
        if algorithm in _DRAFT_MODEL_ALGORITHMS and not draft:
            t.error("draft_model", f"{algorithm} needs the draft model's path")
        speculative = Speculative(
            algorithm=algorithm or "",
            draft_model=draft,
            num_steps=t.positive("num_steps", int, None),
            eagle_topk=t.positive("eagle_topk", int, None),
            num_draft_tokens=t.positive("num_draft_tokens", int, None),
        )
        t.finish()
        return speculative if algorithm else None

    def compare(self, t: _Table) -> Compare:
        name = t.get("name", str, "baseline") or "baseline"
        if not re.fullmatch(r"[a-z][a-z0-9_-]*", name):
            t.error("name", f"{name!r} must be lowercase letters, digits, '_' or '-' (it names the baseline's checks)")
        flags = t.strings("flags") if "flags" in t.data else None
        if flags is not None:
            _check_flags(t, "flags", flags)
        compare = Compare(
            name=name,
            flags=flags,
            attention_backend=t.get("attention_backend", str, None),
            speculative=bool(t.get("speculative", bool, True)),
            env=MappingProxyType(self.strings_table(t.sub("env"))),
        )
        t.finish()
        return compare

    def benchmark(self, t: _Table) -> Benchmark:
        regression = t.get("max_regression", (int, float), 0.03)
        if regression is not None and not 0 <= regression < 1:
            t.error("max_regression", f"must be a fraction in [0, 1), not {regression}")
        warmup = t.get("warmup", int, 2)
        if warmup is not None and warmup < 0:
            t.error("warmup", f"must be 0 or more, not {warmup}")
        runs = t.positive("runs", int, 5) or 5
        max_runs = t.get("max_runs", int, None)
        if max_runs is not None and max_runs < runs:
            t.error("max_runs", f"must be at least runs ({runs}), not {max_runs}")
        benchmark = Benchmark(
            output_tokens=t.positive("output_tokens", int, 2048) or 2048,
            runs=runs,
            warmup=warmup if warmup is not None else 2,
            baseline_tok_s=t.positive("baseline_tok_s", float, None),
            max_regression=float(regression if regression is not None else 0.03),
            prompt=t.get("prompt", str, Benchmark.prompt) or Benchmark.prompt,
            stream_idle_floor_s=t.positive("stream_idle_floor_s", float, None) or Benchmark.stream_idle_floor_s,
            max_runs=max_runs if max_runs is not None and max_runs >= runs else None,
        )
        t.finish()
        return benchmark

    def deep(self, t: _Table) -> Deep:
        deep = Deep(self.attention(t.sub("attention")), self.fusion(t.sub("fusion")))
        t.finish()
        return deep

    def attention(self, t: _Table) -> DeepAttention:
        given = {
            name: t.positive(name, int, getattr(DeepAttention, name))
            for name in ("q_heads", "kv_heads", "head_dim", "kv_len", "prefill_len", "page_size", "batch")
        }
        shapes = DeepAttention(
            **{k: v or getattr(DeepAttention, k) for k, v in given.items()},
            jit_timeout_s=_jit_timeout(t, DeepAttention.jit_timeout_s),
        )
        if shapes.q_heads % shapes.kv_heads:
            t.error(
                "q_heads",
                f"{shapes.q_heads} query heads do not group over {shapes.kv_heads} KV heads (q_heads must be a multiple of kv_heads)",
            )
        if shapes.kv_len % shapes.page_size:
            t.error(
                "kv_len",
                f"{shapes.kv_len} KV tokens do not fill whole pages of {shapes.page_size} (kv_len must be a multiple of page_size)",
            )
        if shapes.prefill_len > shapes.kv_len:
            t.error(
                "prefill_len", f"{shapes.prefill_len} query tokens exceed the {shapes.kv_len} KV tokens they attend to"
            )
        t.finish()
        return shapes

    def fusion(self, t: _Table) -> DeepFusion:
        tokens = t.get("tokens", list, list(DeepFusion.tokens)) or []
        bad = [
            i
            for i, n in enumerate(tokens)
            if isinstance(n, bool) or not isinstance(n, int) or not 0 < n <= MAX_FUSION_TOKENS
        ]
        for i in bad:
            t.error(
                f"tokens[{i}]",
                f"must be a token count from 1 to {MAX_FUSION_TOKENS} (SGLang's largest fused batch), not {tokens[i]!r}",
            )
        if not bad and (not tokens or sorted(set(tokens)) != tokens):
            t.error("tokens", f"must be distinct token counts in increasing order, not {tokens}")
        unsupported = t.get("unsupported", str, DeepFusion.unsupported)
        if unsupported is not None and unsupported not in FUSION_SEVERITIES:
            t.error("unsupported", f"must be one of {', '.join(FUSION_SEVERITIES)}, not {unsupported!r}")
        fusion = DeepFusion(
            hidden=t.positive("hidden", int, DeepFusion.hidden) or DeepFusion.hidden,
            tokens=tuple(tokens) if not bad else DeepFusion.tokens,
            unsupported=unsupported or DeepFusion.unsupported,
            jit_timeout_s=_jit_timeout(t, DeepFusion.jit_timeout_s),
        )
        t.finish()
        return fusion

    def env(self, t: _Table, stack: Stack, toolkits: tuple[Toolkit, ...], python: Python) -> Mapping[str, str]:
        default = next((tk for tk in toolkits if tk.default), None)
        references = {"stack.name": stack.name}
        if default is not None:
            references["toolkit.default"] = str(default.prefix)
            references["toolkit.default.version"] = str(default.version)
        if python.root is not None:
            references["python.root"] = str(python.root)
        resolved = {}
        for name, value in self.strings_table(t).items():
            resolved[name] = _resolve(t, name, value, references)
        return MappingProxyType(resolved)

    def strings_table(self, t: _Table) -> dict[str, str]:
        values = {}
        for name in list(t.data):
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                t.seen.add(name)
                t.error(name, "is not a valid environment variable name")
                continue
            value = t.get(name, str)
            problem = dollar_problem(value) if value is not None else None
            if problem:
                t.error(name, problem)
            elif value is not None:
                values[name] = value
        return values

    def sha256(self, t: _Table, name: str) -> str | None:
        value = t.get(name, str, None)
        if value is not None and not _SHA256.fullmatch(value):
            t.error(name, f"must be 64 lowercase hex digits, not {value!r}")
            return None
        return value


def _resolve(t: _Table, name: str, value: str, references: Mapping[str, str]) -> str:
    """Replace ``{toolkit.default}`` style references.

    >>> _resolve(None, "X", "{a}/bin", {"a": "/opt"})
    '/opt/bin'
    """

    def replace(match: re.Match[str]) -> str:
        key = match[1]
        if key in references:
            return references[key]
        t.error(name, f"unknown reference {{{key}}} (known: {', '.join(sorted(references))})")
        return match[0]

    return _REFERENCE.sub(replace, value)


def dollar_problem(value: str) -> str | None:
    """Why an environment value may not be written into a file that shells source, or None:
    a ``$`` may only start a plain ``$NAME`` or ``${NAME}`` reference.

    >>> dollar_problem("{toolkit.default}/bin:$PATH:${HOME}") is None
    True
    >>> print(dollar_problem("$(touch /tmp/x)"))
    '$(' at character 1: a '$' may only start a variable reference, $NAME or ${NAME} (no command substitution, arithmetic, ${NAME:-default} or $1); stackgate.env is sourced by shells
    """
    for i in (i for i, c in enumerate(value) if c == "$"):
        if not SHELL_REFERENCE.match(value, i):
            return (
                f"{value[i : i + 2]!r} at character {i + 1}: a '$' may only start a variable reference, $NAME or ${{NAME}} "
                "(no command substitution, arithmetic, ${NAME:-default} or $1); stackgate.env is sourced by shells"
            )
    return None


def _normal_path(text: str) -> Path:
    """An absolute path as the filesystem reads it: ``//``, ``.``, ``..`` and a trailing ``/`` gone.

    >>> _normal_path("//usr/local//cuda-13.0/../cuda-13.0/")
    PosixPath('/usr/local/cuda-13.0')
    """
    return Path("/" + os.path.normpath(text).lstrip("/")) if text.startswith("/") else Path(os.path.normpath(text))


def patch_location_problem(lock: Spec, patch: Patch) -> str | None:
    """Why ``patch``'s file cannot be the lock's patch, or None: it must exist, after ``..`` and
    symlinks, inside the lockfile's checkout or stackgate's shipped patches. Only provision reads
    the file, so provision asks (before it plans to apply it); other commands need only its name.
    """
    try:
        path = patch.file.resolve()
        folder = lock.path.parent.resolve()
        bases = (_checkout(folder), SHIPPED_PATCHES.resolve())
        found = "a file" if path.is_file() else "not a file" if path.exists() else "no such file"
    except (OSError, RuntimeError) as exc:  # a name too long, a symlink loop (RuntimeError before 3.13)
        return f"{patch.file} cannot be resolved: {getattr(exc, 'strerror', None) or exc}"
    if not any(path.is_relative_to(base) for base in bases):
        return f"{patch.file} resolves to {path}, outside the lockfile's checkout ({bases[0]}) and stackgate's patches ({bases[1]}): keep the patch beside the lock"
    return None if found == "a file" else f"{path}: {found}"


def _resolve_path(path: Path) -> Path:
    """``path`` made absolute with symlinks and ``..`` resolved, as far as that can be done."""
    try:
        return path.resolve()
    except (OSError, RuntimeError):  # checked, with the reason, by patch_location_problem
        return Path(os.path.abspath(path))


def _checkout(folder: Path) -> Path:
    """The git checkout that holds ``folder`` (the nearest folder above with a .git), else ``folder``."""
    return next((parent for parent in (folder, *folder.parents) if (parent / ".git").exists()), folder)


def _check_url(t: _Table, name: str, url: str | None, *, local_path: bool = False) -> None:
    problem = url_problem(url, local_path=local_path) if url is not None else None
    if problem:
        t.error(name, problem)


def url_problem(url: str, *, local_path: bool = False) -> str | None:
    """Why ``url`` may not be fetched from, or None: https to any host; http only to this machine
    (``localhost`` or a loopback IP literal: nothing on the way can change the bytes); file:// on
    this machine; with ``local_path``, an absolute path too (a runfile already on disk).

    >>> url_problem("http://127.0.0.1:8080/simple") is None, url_problem("https://[::1]/x") is None
    (True, True)
    >>> print(url_problem("http://download.pytorch.org/whl/cu130"))
    plain http to download.pytorch.org: use https (http only to localhost or a loopback IP such as 127.0.0.1 or [::1])
    """
    where = f"must be an https:// URL{', a file:// URL or an absolute path' if local_path else ' or a file:// URL'}"
    if local_path and url.startswith("/"):
        return None
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        parts.port  # noqa: B018 - an out-of-range port raises here, not later in a download
    except ValueError as exc:
        return f"{where}, not {url!r}: {exc}"
    if parts.scheme == "https" and host:
        return None
    if parts.scheme == "file" and parts.netloc in ("", "localhost"):
        return None
    if parts.scheme == "http" and host:
        return (
            None
            if _loopback(host)
            else f"plain http to {host}: use https (http only to localhost or a loopback IP such as 127.0.0.1 or [::1])"
        )
    return f"{where} (http:// only to localhost or a loopback IP), not {url!r}"


def _loopback(host: str) -> bool:
    """``localhost`` or a loopback IP literal, written out: 127.0.0.1.evil.com, localhost.evil
    and the inet_aton shorthands (0x7f.1, 2130706433) are names or guesses, not loopback.

    >>> [_loopback(h) for h in ("localhost", "127.0.0.1", "::1", "127.0.0.1.evil.com", "0x7f.1", "localhost.evil")]
    [True, True, True, False, False, False]
    """
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _jit_timeout(t: _Table, default: float) -> float:
    """A JIT timeout: seconds, at most :data:`MAX_JIT_TIMEOUT_S` (the deep checks' own limit)."""
    value = t.positive("jit_timeout_s", float, default)
    if value is not None and value > MAX_JIT_TIMEOUT_S:
        t.error("jit_timeout_s", f"must be at most {MAX_JIT_TIMEOUT_S:g} s, not {value:g}")
        return default
    return value or default


def _check_flags(t: _Table, name: str, flags: tuple[str, ...]) -> None:
    """Flags are extra launch words; the ones smoke sets itself, or from a table, are refused."""
    for i, word in enumerate(flags):
        option = word.split("=", 1)[0]
        if option in MANAGED_FLAGS:
            t.error(f"{name}[{i}]", f"{option} is set by smoke from {MANAGED_FLAGS[option]}; do not repeat it in flags")
        elif option.startswith("--speculative-"):
            t.error(f"{name}[{i}]", f"{option}: describe speculative decoding in [smoke.speculative], not in flags")


def _check_pattern(t: _Table, name: str, pattern: str) -> None:
    try:
        re.compile(pattern)
    except re.error as exc:
        t.error(name, f"invalid regular expression {pattern!r}: {exc}")


def _specifier(t: _Table, name: str, text: str) -> SpecifierSet | None:
    try:
        spec = SpecifierSet(text)
    except InvalidSpecifier:
        t.error(name, f"invalid specifier {text!r} (expected e.g. '==2.9.1+cu130')")
        return None
    if not text.strip():
        t.error(name, "empty specifier: pin a version, e.g. '==2.9.1'")
        return None
    return spec


def _as_tuple(kind: type | tuple[type, ...]) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)


def _names(kind: type | tuple[type, ...]) -> str:
    words = {
        str: "a string",
        int: "an integer",
        float: "a number",
        bool: "true or false",
        list: "an array",
        dict: "a table",
    }
    return " or ".join(words.get(k, k.__name__) for k in _as_tuple(kind))


def _kind(value: Any) -> str:
    return _names(type(value)) if type(value) in (str, int, float, bool, list, dict) else type(value).__name__
