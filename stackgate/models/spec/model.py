"""The spec's model: frozen, typed dataclasses, each built from its TOML table beside it.

A section's ``_from_table`` reads its :class:`~stackgate.models.spec.reader.Table`, records every
problem with its key path, and returns the section (with placeholders where a value was bad: the
caller raises once all problems are known).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

from stackgate.models import engines
from stackgate.models.spec.accuracy import Accuracy
from stackgate.models.spec.reader import Table, kind_of
from stackgate.models.spec.rules import (
    check_sha256,
    check_url,
    dollar_problem,
    normal_path,
    resolve_path,
    resolve_references,
)
from stackgate.models.spec.slurm import Slurm
from stackgate.models.spec.sweep import Sweep

__all__ = [
    "CUDA_LINK_POLICIES",
    "DEFAULT_EVIDENCE",
    "DEFAULT_INDEX",
    "DEFAULT_PLATFORM",
    "FUSION_SEVERITIES",
    "INSTALLERS",
    "MANAGED_FLAGS",
    "MAX_FUSION_TOKENS",
    "MAX_JIT_TIMEOUT_S",
    "PYPI_CUDA12_REASON",
    "SPECULATIVE_ALGORITHMS",
    "STREAM_IDLE_GAPS",
    "TOOLKIT_SOURCES",
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
    "Spec",
    "Speculative",
    "Stack",
    "Toolkit",
]

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
#: Speculative algorithms SGLang 0.5.9 accepts (--speculative-algorithm choices).
SPECULATIVE_ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM")
#: Algorithms whose draft is a separate model that --speculative-draft-model-path names.
_DRAFT_MODEL_ALGORITHMS = ("EAGLE", "EAGLE3", "STANDALONE")
#: Options smoke sets itself from [smoke] and the CLI (SGLang's spellings; each engine's own are
#: :meth:`stackgate.models.engines.Engine.managed_flags`); a flag list must not repeat them.
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
#: The log line that proves a flag's path ran, for the flags whose acceptance proves nothing: a
#: flag listed here carries its evidence whatever the spec says; [smoke] evidence may replace the
#: pattern, never drop it. Each engine names its fusion flag and evidence (models/engines).
DEFAULT_EVIDENCE = MappingProxyType(
    {e.fusion_flag: e.fusion_evidence for e in engines.ENGINES.values() if e.fusion_flag and e.fusion_evidence}
)
#: Why source = "pypi" is refused for CUDA 12.x (stack/toolkit.py gives the same reason).
PYPI_CUDA12_REASON = (
    'PyPI\'s CUDA 12 nvcc wheels carry ptxas, headers and nvvm but not the nvcc driver; use source = "runfile" or "apt"'
)


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

    @classmethod
    def _from_table(cls, t: Table) -> Stack:
        name = t.get("name", str)
        if name is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
            t.error("name", f"{name!r} must be letters, digits, '.', '_' or '-'")
        cuda_link = t.get("cuda_link", str, "leave")
        t.choice("cuda_link", cuda_link, CUDA_LINK_POLICIES)
        stack = cls(name or "", t.get("description", str, ""), cuda_link or "leave")
        t.finish()
        return stack


@dataclass(frozen=True)
class Hardware:
    gpu_count: int
    compute_capability: Capability
    gpu_name: str
    min_driver: Version
    arch: str  #: the ptxas target the default toolkit must build, e.g. sm_120a

    @classmethod
    def _from_table(cls, t: Table) -> Hardware:
        count = t.positive("gpu_count", int)
        capability = t.parsed("compute_capability", Capability.parse)
        name = t.get("gpu_name", str)
        driver = t.parsed("min_driver", Version)
        arch = t.get("arch", str, capability.arch if capability else "")
        if arch is not None and not re.fullmatch(r"sm_\d+[af]?", arch):
            t.error("arch", f"invalid ptxas target {arch!r} (expected e.g. 'sm_120a')")
        t.finish()
        return cls(count or 0, capability or Capability(0, 0), name or "", driver or Version("0"), arch or "")


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

    @classmethod
    def _from_table(cls, t: Table) -> Toolkit:
        version = t.parsed("version", Version)
        prefix = t.get("prefix", str)
        if prefix is not None and not os.path.isabs(prefix):
            t.error("prefix", f"must be an absolute path, not {prefix!r}")
        keep = t.get("keep", bool, False)
        source = t.get("source", str, None)
        if source is None and not keep:
            t.error("source", f"missing: say how to install it ({', '.join(TOOLKIT_SOURCES)}) or set keep = true")
        elif source is not None:
            t.choice("source", source, TOOLKIT_SOURCES)
        if keep and source is not None:
            t.error("source", "a keep = true toolkit is never installed by stackgate; drop source")
        if source == "pypi" and version is not None and version.major < 13:
            t.error("source", f"pypi cannot provide CUDA {version}: {PYPI_CUDA12_REASON}")
        url = t.get("url", str, None)
        check_url(t, "url", url, local_path=True)
        sha256 = check_sha256(t, "sha256")
        if source == "runfile" and (url is None or sha256 is None):
            t.error("url" if url is None else "sha256", "a runfile toolkit needs both url and sha256")
        toolkit = cls(
            version=version or Version("0"),
            prefix=normal_path(prefix or "/"),
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

    @classmethod
    def _all_from_table(cls, top: Table) -> tuple[Toolkit, ...]:
        """The [[toolkit]] array: exactly one default, no two on one prefix."""
        toolkits = tuple(cls._from_table(t) for t in top.array("toolkit"))
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
                    f"{toolkit.prefix} is toolkit[{first[toolkit.prefix]}]'s prefix too: "
                    "two toolkits cannot share a prefix",
                )
            first.setdefault(toolkit.prefix, i)
        return toolkits


@dataclass(frozen=True)
class Index:
    url: str
    packages: tuple[str, ...]  #: canonical names served only from this index

    @classmethod
    def _from_table(cls, t: Table, pinned: set[str]) -> Index:
        url = t.get("url", str)
        check_url(t, "url", url)
        index = cls(url or "", tuple(canonicalize_name(n) for n in t.strings("packages")))
        # provision installs from a named index exactly the pins it maps there; an unpinned name
        # would be pulled in later, as someone's dependency, from the default index instead.
        for i, name in enumerate(index.packages):
            if name not in pinned:
                t.error(
                    f"packages[{i}]",
                    f"{name!r} has no pin in python.packages: "
                    "provision installs from this index only what the lock pins",
                )
        t.finish()
        return index


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

    @classmethod
    def _all_from_table(cls, t: Table) -> tuple[Package, ...]:
        """[python.packages]: one pin a key, no name pinned twice."""
        packages = []
        for raw_name, value in t.data.items():
            t.seen.add(raw_name)
            if not re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?", raw_name):
                t.error(raw_name, "is not a valid distribution name")
                continue
            package = cls._from_entry(t, raw_name, value)
            if package is not None:
                packages.append(package)
        names = [p.name for p in packages]
        for name in {n for n in names if names.count(n) > 1}:
            t.error(name, "is pinned twice (names compare after PEP 503 normalisation)")
        return tuple(packages)

    @classmethod
    def _from_entry(cls, t: Table, raw_name: str, value: Any) -> Package | None:
        """One pin: a specifier string, or a table with version, url and sha256."""
        name = canonicalize_name(raw_name)
        if isinstance(value, str):
            spec = _specifier(t, raw_name, value)
            return cls(name, spec) if spec is not None else None
        if not isinstance(value, dict):
            t.error(raw_name, f"must be a version specifier or a table, not {kind_of(value)}")
            return None
        table = Table(value, t.key(raw_name), t.errors)
        spec = table.parsed("version", SpecifierSet)
        url = table.get("url", str, None)
        check_url(table, "url", url)
        sha256 = check_sha256(table, "sha256")
        if sha256 is not None and url is None:
            table.error("sha256", "only a url package carries a sha256")
        table.finish()
        return cls(name, spec, url, sha256) if spec is not None else None


def _specifier(t: Table, name: str, text: str) -> SpecifierSet | None:
    try:
        spec = SpecifierSet(text)
    except InvalidSpecifier:
        t.error(name, f"invalid specifier {text!r} (expected e.g. '==2.9.1+cu130')")
        return None
    if not text.strip():
        t.error(name, "empty specifier: pin a version, e.g. '==2.9.1'")
        return None
    return spec


@dataclass(frozen=True)
class Override:
    package: str
    specifier: SpecifierSet
    reason: str

    @classmethod
    def _from_table(cls, t: Table, names: set[str]) -> Override:
        package = canonicalize_name(t.get("package", str) or "")
        if package and package not in names:
            t.error("package", f"{package!r} has no pin in python.packages")
        spec = t.parsed("version", SpecifierSet)
        reason = t.get("reason", str)
        if reason is not None and not reason.strip():
            t.error("reason", "must say why the override is needed")
        t.finish()
        return cls(package, spec or SpecifierSet(), reason or "")


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

    @classmethod
    def _from_table(cls, t: Table, toolkits: tuple[Toolkit, ...]) -> Python:
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
        t.choice("installer", installer, INSTALLERS)
        table = t.sub("packages")
        packages = Package._all_from_table(table)
        # Cross-references count a pin that failed to parse as declared: one error, not two.
        names: set[str] = {canonicalize_name(str(key)) for key in table.data}
        frozen = _frozen(t.sub("guard"), names)
        overrides = tuple(Override._from_table(o, names) for o in t.array("override"))
        default = next((tk for tk in toolkits if tk.default), None)
        torch_cuda = t.get("torch_cuda", str, default.release if default else None)
        if torch_cuda is not None and not re.fullmatch(r"\d+\.\d+", torch_cuda):
            t.error("torch_cuda", f"must be a CUDA major.minor like '13.0', not {torch_cuda!r}")
        python = cls(
            version=version or "",
            root=Path(root) if root else None,
            interpreter=Path(interpreter) if interpreter else None,
            installer=installer or "uv",
            indexes=tuple(Index._from_table(i, names) for i in t.array("index")),
            packages=packages,
            frozen=frozen,
            overrides=overrides,
            imports=t.strings("imports"),
            torch_cuda=torch_cuda,
            default_index=_default_index(t),
            platform=_platform(t),
        )
        t.finish()
        return python


def _frozen(guard: Table, names: set[str]) -> tuple[str, ...]:
    """[python.guard] frozen: canonical names, each pinned in python.packages."""
    frozen = tuple(canonicalize_name(n) for n in guard.strings("frozen"))
    for i, name in enumerate(frozen):
        if name not in names:
            guard.error(f"frozen[{i}]", f"{name!r} has no pin in python.packages: the guard needs a version to hold")
    guard.finish()
    return frozen


def _default_index(t: Table) -> str:
    url = t.get("default_index", str, DEFAULT_INDEX)
    check_url(t, "default_index", url)
    return url or DEFAULT_INDEX


def _platform(t: Table) -> str:
    value = t.get("platform", str, DEFAULT_PLATFORM) or DEFAULT_PLATFORM
    if not _PLATFORM.fullmatch(value):
        t.error(
            "platform",
            f"must be a Linux target such as {DEFAULT_PLATFORM!r} or 'aarch64-manylinux_2_28', not {value!r}",
        )
    return value


@dataclass(frozen=True)
class Patch:
    package: str
    version: Version
    file: Path
    reason: str
    sha256: str | None = None

    @classmethod
    def _from_table(cls, t: Table, folder: Path) -> Patch:
        """One [[patch]]; a relative file resolves against ``folder``, the lockfile's."""
        file = t.get("file", str)
        patch = cls(
            package=canonicalize_name(t.get("package", str) or ""),
            version=t.parsed("version", Version) or Version("0"),
            file=resolve_path(folder / file) if file else Path(),
            reason=t.get("reason", str) or "",
            sha256=check_sha256(t, "sha256"),
        )
        t.finish()
        return patch


@dataclass(frozen=True)
class Nccl:
    min_version: Version | None = None
    min_busbw_gbs: float | None = None

    @classmethod
    def _from_table(cls, t: Table) -> Nccl:
        nccl = cls(t.parsed("min_version", Version, None), t.positive("min_busbw_gbs", float, None))
        t.finish()
        return nccl


@dataclass(frozen=True)
class Speculative:
    """[smoke.speculative]: speculative decoding, turned into SGLang's --speculative-* flags."""

    algorithm: str
    draft_model: str = ""  #: the draft model's path (EAGLE, EAGLE3, STANDALONE)
    num_steps: int | None = None
    eagle_topk: int | None = None
    num_draft_tokens: int | None = None
    min_accept_length: float | None = None  #: the lowest mean acceptance length that passes (tokens per verify)

    @property
    def flags(self) -> tuple[str, ...]:
        """The launch flags, in the form SGLang 0.5.9's server_args.py spells them.

        >>> Speculative("EAGLE3", "/m/draft", num_steps=3).flags  # doctest: +NORMALIZE_WHITESPACE
        ('--speculative-algorithm', 'EAGLE3', '--speculative-draft-model-path', '/m/draft',
         '--speculative-num-steps', '3')
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

    @classmethod
    def _from_table(cls, t: Table) -> Speculative | None:
        algorithm = t.get("algorithm", str)
        if algorithm is not None:
            t.choice("algorithm", algorithm, SPECULATIVE_ALGORITHMS)
        draft = t.get("draft_model", str, "") or ""
        if algorithm in _DRAFT_MODEL_ALGORITHMS and not draft:
            t.error("draft_model", f"{algorithm} needs the draft model's path")
        speculative = cls(
            algorithm=algorithm or "",
            draft_model=draft,
            num_steps=t.positive("num_steps", int, None),
            eagle_topk=t.positive("eagle_topk", int, None),
            num_draft_tokens=t.positive("num_draft_tokens", int, None),
            min_accept_length=t.positive("min_accept_length", float, None),
        )
        t.finish()
        return speculative if algorithm else None


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

    @classmethod
    def _from_table(cls, t: Table) -> Compare:
        name = t.get("name", str, "baseline") or "baseline"
        if not re.fullmatch(r"[a-z][a-z0-9_-]*", name):
            t.error("name", f"{name!r} must be lowercase letters, digits, '_' or '-' (it names the baseline's checks)")
        flags = t.strings("flags") if "flags" in t.data else None
        if flags is not None:
            _check_flags(t, "flags", flags)
        compare = cls(
            name=name,
            flags=flags,
            attention_backend=t.get("attention_backend", str, None),
            speculative=bool(t.get("speculative", bool, True)),
            env=MappingProxyType(_strings_table(t.sub("env"))),
        )
        t.finish()
        return compare


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
    silence_s: float | None = None  #: the longest silent log while loading; None: a quarter of ready_timeout_s
    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    speculative: Speculative | None = None
    compare: Compare | None = None
    fast_layers: int = 4  #: layers that fast mode keeps of the model's own architecture
    stop_grace_s: float = 15.0  #: SIGTERM to SIGKILL; longer than SGLang's 5 s drain poll
    sweep: Sweep = field(default_factory=Sweep)  #: [smoke.sweep] (models/spec/sweep.py)

    @property
    def load_silence_s(self) -> float:
        """How long the log may stay silent while the server loads: ``silence_s``, or a quarter of
        ``ready_timeout_s`` (300 s at the default 1200 s); compiling phases get twice that.

        >>> Smoke().load_silence_s, Smoke(ready_timeout_s=60, silence_s=2).load_silence_s
        (300.0, 2)
        """
        return self.silence_s if self.silence_s is not None else self.ready_timeout_s / 4

    @property
    def serving(self) -> engines.Engine:
        """The registered engine this section names (checked when the spec loaded)."""
        return engines.get(self.engine)

    @classmethod
    def _from_table(cls, t: Table, hardware: Hardware) -> Smoke:
        name = t.get("engine", str, "sglang") or "sglang"
        if name not in engines.ENGINES:
            t.error("engine", engines.unknown(name))
            name = "sglang"
        engine = engines.get(name)
        port = t.get("port", int, engine.default_port)
        if port is not None and not 0 < port < 65536:
            t.error("port", f"must be a TCP port (1-65535), not {port}")
        evidence = t.sub("evidence")
        pairs = {flag: evidence.get(flag, str) for flag in list(evidence.data)}
        flags = t.strings("flags")
        _check_flags(t, "flags", flags, engine)
        for flag, pattern in pairs.items():
            if flag not in flags:
                evidence.error(flag, "is not one of smoke.flags: evidence is asked only of a flag that is passed")
            if pattern is not None:
                _check_evidence(evidence, flag, pattern)
        asked = {word.split("=", 1)[0] for word in flags}
        fused = engine.fusion_evidence and engine.fusion_flag in asked
        defaults = {engine.fusion_flag: engine.fusion_evidence} if fused else {}
        smoke = cls(
            engine=name,
            model=t.get("model", str, "") or "",
            tp=t.positive("tp", int, hardware.gpu_count or 1) or 1,
            host=t.get("host", str, "127.0.0.1") or "127.0.0.1",
            port=port or engine.default_port,
            attention_backend=t.get("attention_backend", str, "flashinfer") or "flashinfer",
            flags=flags,
            evidence=MappingProxyType({**defaults, **{k: v for k, v in pairs.items() if v is not None}}),
            ready_timeout_s=t.positive("ready_timeout_s", float, 1200.0) or 1200.0,
            silence_s=t.positive("silence_s", float, None),
            env=MappingProxyType(_strings_table(t.sub("env"))),
            speculative=Speculative._from_table(t.sub("speculative")) if "speculative" in t.data else None,
            compare=Compare._from_table(t.sub("compare")) if "compare" in t.data else None,
            fast_layers=t.positive("fast_layers", int, 4) or 4,
            stop_grace_s=t.positive("stop_grace_s", float, 15.0) or 15.0,
            sweep=Sweep._from_table(t.sub("sweep")),
        )
        t.finish()
        return smoke


def _check_flags(t: Table, name: str, flags: tuple[str, ...], engine: engines.Engine | None = None) -> None:
    """Flags are extra launch words; the ones smoke sets itself, or from a table, are refused."""
    managed = {**MANAGED_FLAGS, **(engine.managed_flags() if engine is not None else {})}
    for i, word in enumerate(flags):
        option = word.split("=", 1)[0]
        if option in managed:
            t.error(f"{name}[{i}]", f"{option} is set by smoke from {managed[option]}; do not repeat it in flags")
        elif option.startswith("--speculative-"):
            t.error(f"{name}[{i}]", f"{option}: describe speculative decoding in [smoke.speculative], not in flags")


def _check_evidence(t: Table, flag: str, pattern: str) -> None:
    """An evidence pattern is a regular expression that can fail: one that matches an empty line
    matches every log, and would drop the proof without a word."""
    try:
        compiled = re.compile(pattern)
    except re.error as exc:
        t.error(flag, f"invalid regular expression {pattern!r}: {exc}")
        return
    if compiled.search("") is not None:
        t.error(
            flag,
            f"{pattern!r} matches an empty line, so every log would prove the flag: give the line that shows its "
            "path ran",
        )


def _strings_table(t: Table) -> dict[str, str]:
    """An environment table: variable names to values whose ``$`` only starts a reference."""
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


#: [benchmark] api: the engine's own streaming API, or the OpenAI-compatible chat endpoint.
BENCHMARK_APIS = ("native", "chat")
#: A stream silent for this many expected inter-token gaps has stopped (see Benchmark.stream_idle_s).
STREAM_IDLE_GAPS = 100


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
    api: str = "native"  #: "native": the engine's own streaming API; "chat": /v1/chat/completions

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

    @classmethod
    def _from_table(cls, t: Table) -> Benchmark:
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
        benchmark = cls(
            output_tokens=t.positive("output_tokens", int, 2048) or 2048,
            runs=runs,
            warmup=warmup if warmup is not None else 2,
            baseline_tok_s=t.positive("baseline_tok_s", float, None),
            max_regression=float(regression if regression is not None else 0.03),
            prompt=t.get("prompt", str, cls.prompt) or cls.prompt,
            stream_idle_floor_s=t.positive("stream_idle_floor_s", float, None) or cls.stream_idle_floor_s,
            max_runs=max_runs if max_runs is not None and max_runs >= runs else None,
            api=t.get("api", str, "native") or "native",
        )
        t.choice("api", benchmark.api, BENCHMARK_APIS)
        t.finish()
        return benchmark


#: What the allreduce-fusion check reports when this machine's GPUs cannot run the fused path.
FUSION_SEVERITIES = ("fail", "warn")
#: The longest JIT timeout a lock may ask for: the deep checks' own time limits are set from it.
MAX_JIT_TIMEOUT_S = 3600.0
#: The most tokens SGLang 0.5.9 sends through the fused path (FUSE_ALLREDUCE_MAX_BATCH_SIZE).
MAX_FUSION_TOKENS = 2048


#: The causal prefill's flashinfer backends [deep.attention] prefill_backend may name.
PREFILL_BACKENDS = ("fa2", "auto")


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
    jit_timeout_s: float = 600.0  #: the cold build of the attention modules took 24.6 s on a 16-core H200 host
    #: The bandwidth-bound decode: the paged decode at this batch and KV length, 4 GiB of bf16 KV at the default
    #: heads, far beyond any L2, so reading the KV cache dominates its time.
    bandwidth_batch: int = 64
    bandwidth_kv_len: int = 16384
    #: The floor of that decode's KV rate as a fraction of the GPU's read bandwidth (see checks/deep.py).
    min_read_fraction: float = 0.6
    #: flashinfer's backend for the causal single prefill: fa2, or auto (flashinfer's choice: fa3 on sm90a, whose
    #: module, which SGLang does not load, took 74-80 s per kernel file to compile on a 16-core H200 host).
    prefill_backend: str = "fa2"

    @classmethod
    def _from_table(cls, t: Table) -> DeepAttention:
        given = {
            name: t.positive(name, int, getattr(cls, name))
            for name in (
                "q_heads",
                "kv_heads",
                "head_dim",
                "kv_len",
                "prefill_len",
                "page_size",
                "batch",
                "bandwidth_batch",
                "bandwidth_kv_len",
            )
        }
        fraction = t.positive("min_read_fraction", float, cls.min_read_fraction)
        if fraction is not None and fraction > 1:
            t.error("min_read_fraction", f"must be a fraction of the read bandwidth, at most 1, not {fraction:g}")
            fraction = None
        backend = t.get("prefill_backend", str, cls.prefill_backend)
        if backend is not None:
            t.choice("prefill_backend", backend, PREFILL_BACKENDS)
        shapes = cls(
            **{k: v or getattr(cls, k) for k, v in given.items()},
            jit_timeout_s=_jit_timeout(t, cls.jit_timeout_s),
            min_read_fraction=fraction or cls.min_read_fraction,
            prefill_backend=backend if backend in PREFILL_BACKENDS else cls.prefill_backend,
        )
        if shapes.q_heads % shapes.kv_heads:
            t.error(
                "q_heads",
                f"{shapes.q_heads} query heads do not group over {shapes.kv_heads} KV heads "
                "(q_heads must be a multiple of kv_heads)",
            )
        if shapes.kv_len % shapes.page_size:
            t.error(
                "kv_len",
                f"{shapes.kv_len} KV tokens do not fill whole pages of {shapes.page_size} "
                "(kv_len must be a multiple of page_size)",
            )
        if shapes.bandwidth_kv_len % shapes.page_size:
            t.error(
                "bandwidth_kv_len",
                f"{shapes.bandwidth_kv_len} KV tokens do not fill whole pages of {shapes.page_size} "
                "(bandwidth_kv_len must be a multiple of page_size)",
            )
        if shapes.prefill_len > shapes.kv_len:
            t.error(
                "prefill_len", f"{shapes.prefill_len} query tokens exceed the {shapes.kv_len} KV tokens they attend to"
            )
        t.finish()
        return shapes


@dataclass(frozen=True)
class DeepFusion:
    """[deep.fusion]: what deep.allreduce_fusion runs when [smoke] flags enable the fusion."""

    hidden: int = 7168  #: the hidden size of the reference deployment's model (Kimi K2.5, DeepSeek-V3)
    tokens: tuple[int, ...] = (1, 4, 16, 64, 128, 256, 512)  #: decode batches up to a small prefill
    unsupported: str = "fail"  #: fail | warn when the GPUs' arch cannot run the fused path
    jit_timeout_s: float = 600.0  #: the comm module's cold JIT took 94-137 s on 2x H200

    @classmethod
    def _from_table(cls, t: Table) -> DeepFusion:
        tokens = t.get("tokens", list, list(cls.tokens)) or []
        bad = [
            i
            for i, n in enumerate(tokens)
            if isinstance(n, bool) or not isinstance(n, int) or not 0 < n <= MAX_FUSION_TOKENS
        ]
        for i in bad:
            t.error(
                f"tokens[{i}]",
                f"must be a token count from 1 to {MAX_FUSION_TOKENS} (SGLang's largest fused batch), "
                f"not {tokens[i]!r}",
            )
        if not bad and (not tokens or sorted(set(tokens)) != tokens):
            t.error("tokens", f"must be distinct token counts in increasing order, not {tokens}")
        unsupported = t.get("unsupported", str, cls.unsupported)
        if unsupported is not None:
            t.choice("unsupported", unsupported, FUSION_SEVERITIES)
        fusion = cls(
            hidden=t.positive("hidden", int, cls.hidden) or cls.hidden,
            tokens=tuple(tokens) if not bad else cls.tokens,
            unsupported=unsupported or cls.unsupported,
            jit_timeout_s=_jit_timeout(t, cls.jit_timeout_s),
        )
        t.finish()
        return fusion


def _jit_timeout(t: Table, default: float) -> float:
    """A JIT timeout: seconds, at most :data:`MAX_JIT_TIMEOUT_S` (the deep checks' own limit)."""
    value = t.positive("jit_timeout_s", float, default)
    if value is not None and value > MAX_JIT_TIMEOUT_S:
        t.error("jit_timeout_s", f"must be at most {MAX_JIT_TIMEOUT_S:g} s, not {value:g}")
        return default
    return value or default


@dataclass(frozen=True)
class Deep:
    attention: DeepAttention = field(default_factory=DeepAttention)
    fusion: DeepFusion = field(default_factory=DeepFusion)

    @classmethod
    def _from_table(cls, t: Table) -> Deep:
        deep = cls(DeepAttention._from_table(t.sub("attention")), DeepFusion._from_table(t.sub("fusion")))
        t.finish()
        return deep


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
    slurm: Slurm = field(default_factory=Slurm)
    accuracy: Accuracy = field(default_factory=Accuracy)

    @property
    def name(self) -> str:
        return self.stack.name

    @property
    def default_toolkit(self) -> Toolkit | None:
        return next((t for t in self.toolkits if t.default), None)

    @classmethod
    def _from_table(cls, top: Table, path: Path, sha256: str) -> Spec | None:
        """The whole document, one section at a time; None once any problem is recorded."""
        if not top.ok:
            return None
        stack = Stack._from_table(top.sub("stack", required=True))
        hardware = Hardware._from_table(top.sub("hardware", required=True))
        toolkits = Toolkit._all_from_table(top)
        python = Python._from_table(top.sub("python", required=True), toolkits)
        patches = tuple(Patch._from_table(t, path.parent) for t in top.array("patch"))
        nccl = Nccl._from_table(top.sub("nccl"))
        smoke = Smoke._from_table(top.sub("smoke"), hardware)
        benchmark = Benchmark._from_table(top.sub("benchmark"))
        deep = Deep._from_table(top.sub("deep"))
        slurm = Slurm._from_table(top.sub("slurm"))
        accuracy = Accuracy._from_table(top.sub("accuracy"))
        env = _env(top.sub("env"), stack, toolkits, python)
        top.finish()
        if top.errors:
            return None
        return cls(
            path, sha256, stack, hardware, toolkits, python, patches, env, nccl, smoke, benchmark, deep, slurm, accuracy
        )


def _env(t: Table, stack: Stack, toolkits: tuple[Toolkit, ...], python: Python) -> Mapping[str, str]:
    """[env] with its ``{stack.name}``-style references resolved."""
    default = next((tk for tk in toolkits if tk.default), None)
    references = {"stack.name": stack.name}
    if default is not None:
        references["toolkit.default"] = str(default.prefix)
        references["toolkit.default.version"] = str(default.version)
    if python.root is not None:
        references["python.root"] = str(python.root)
    resolved = {}
    for name, value in _strings_table(t).items():
        resolved[name] = resolve_references(t, name, value, references)
    return MappingProxyType(resolved)
