"""The spec `stackgate init` writes: this machine (:class:`stackgate.facts.machine.Machine`) as a
lockfile, each value with a comment saying where it came from. The text loads with
:func:`stackgate.models.spec.loads_spec` and `stackgate lock` takes it as it is."""

from __future__ import annotations

import json
import re
from collections import Counter
from typing import Any, Mapping, Sequence

from packaging.utils import canonicalize_name
from packaging.version import Version

from stackgate.checks.deep import FUSION_FLAG
from stackgate.checks.fusiongate import engine_refusal, fusion_arch_problem, majors_of
from stackgate.edges.nvml import NvmlSnapshot
from stackgate.facts.compare import conflicts
from stackgate.facts.machine import FoundPython, Machine
from stackgate.facts.values import ArchBuild, Missing, ProbeFacts
from stackgate.models.spec import DEFAULT_EVIDENCE, Capability
from stackgate.models.verdict import hostname

__all__ = ["PINNED", "Line", "machine_spec", "stack_name"]

#: The distributions pinned and frozen when installed, with the name each is imported by.
PINNED = {
    "torch": "torch",
    "triton": "triton",
    "nvidia-nccl-cu13": None,
    "nvidia-nccl-cu12": None,
    "flashinfer-python": "flashinfer",
    "flashinfer-cubin": None,
    "sgl-kernel": "sgl_kernel",
    "sglang-kernel": "sgl_kernel",  #: sgl-kernel's successor (0.4.x): the same import name
    "sglang": "sglang",
}
#: The column comments start at, as the shipped profiles align them.
_COMMENT_AT = 40

#: One line of the spec: the TOML text, and where its value came from (None: no comment).
Line = tuple[str, "str | None"]


def _toml(value: object) -> str:
    """A TOML value: strings as basic strings (JSON's escapes are TOML's), lists inline.

    >>> _toml(["torch", 'a"b']), _toml(8)
    ('["torch", "a\\\\"b"]', '8')
    """
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return json.dumps(value) if isinstance(value, str) else str(value)


def _lines(lines: Sequence[Line]) -> str:
    out = []
    for text, why in lines:
        out.append(f"{text:<{_COMMENT_AT - 1}} # {why}" if why else text)
    return "\n".join(out) + "\n"


def stack_name(host: str) -> str:
    """A spec name from the host's name (letters, digits, '.', '_', '-').

    >>> stack_name("gpu-node_7.lab"), stack_name("!!")
    ('gpu-node_7.lab', 'this-machine')
    """
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", host).strip("-._")
    return name or "this-machine"


def _hardware(snapshot: NvmlSnapshot) -> tuple[list[Line], Capability]:
    gpus = snapshot.gpus
    first = gpus[0]
    capabilities = Counter(g.capability for g in gpus if g.capability)
    major, minor = first.capability or capabilities.most_common(1)[0][0]
    capability = Capability(major, minor)
    mixed = f"; NOT all alike: {dict(capabilities)}" if len(capabilities) > 1 else ""
    names = {g.name for g in gpus}
    driver = Version(snapshot.driver_version) if re.fullmatch(r"\d+(\.\d+)*", snapshot.driver_version) else None
    floor = str(driver.major) if driver else snapshot.driver_version
    return [
        ("[hardware]", None),
        (f"gpu_count = {len(gpus)}", "NVML: the GPUs this driver shows"),
        (
            f"gpu_name = {_toml(first.name)}",
            "NVML: GPU 0's name (matched as a substring)"
            + ("" if len(names) == 1 else f"; also {sorted(names - {first.name})}"),
        ),
        (f'compute_capability = "{capability}"', f"NVML: GPU 0{mixed}"),
        (f'arch = "{capability.arch}"', f"the ptxas target of compute capability {capability}"),
        (f'min_driver = "{floor}"', f"NVML: driver {snapshot.driver_version}; its series is the floor"),
    ], capability


def _toolkits(machine: Machine) -> list[Line]:
    lines: list[Line] = []
    default = machine.default[0] if machine.default else None
    for toolkit in machine.toolkits:
        version = toolkit.version
        lines += [
            ("", None),
            ("[[toolkit]]", None),
            (
                f'version = "{version.release}"',
                f"{version.path} --version: release {version.release}, V{version.build}",
            ),
            (f'nvcc = "{version.build}"', f"the build {version.path.name} prints"),
            (f"prefix = {_toml(str(toolkit.prefix))}", f"found by {toolkit.found_by}"),
            ("keep = true", "found here: present and working, never written by stackgate"),
        ]
        if toolkit is default and machine.default is not None:
            lines.append(("default = true", f"{machine.default[1]}: flashinfer's JIT and Triton use it ([env])"))
    return lines


def _python(found: FoundPython) -> list[Line]:
    facts = found.facts
    torch = facts.torch or {}
    installed = {name: facts.dist(name) for name in PINNED}
    pins = {name: dist.version for name, dist in installed.items() if dist is not None}
    imports = list(dict.fromkeys(module for name, module in PINNED.items() if module and name in pins))
    lines: list[Line] = [
        ("[python]", None),
        (
            f'version = "{".".join(facts.python_version.split(".")[:2])}"',
            f"the interpreter's own: {facts.python_version}",
        ),
        (
            f"interpreter = {_toml(str(found.path))}",
            f"found by {found.found_by}: stackgate inspects it, never changes it",
        ),
        (f"imports = {_toml(imports)}", "the stack's modules installed there: abi.imports imports each"),
    ]
    if torch.get("imported") and torch.get("cuda"):
        lines.append((f'torch_cuda = "{torch["cuda"]}"', f"torch.version.cuda of torch {torch.get('version')}"))
    machine = facts.markers.get("platform_machine", "x86_64")
    if machine in ("x86_64", "aarch64") and machine != "x86_64":
        lines.append(
            (
                f'platform = "{machine}-manylinux_2_28"',
                "the interpreter's platform_machine: what `stackgate lock` resolves for",
            )
        )
    lines += _indexes(pins)
    lines += [("", None), ("[python.packages]", None)]
    lines += [(f'{name} = "=={version}"', "installed there (its metadata's version)") for name, version in pins.items()]
    if pins:
        lines += [
            ("", None),
            ("[python.guard]", None),
            (f"frozen = {_toml(list(pins))}", "pinned above: no install may move them"),
        ]
    return [*lines, *_overrides(facts, pins)]


def _overrides(facts: ProbeFacts, pins: Mapping[str, str]) -> list[Line]:
    """A pinned package installed against another's requirement (sglang 0.5.9 pins flashinfer 0.6.3,
    0.6.4 is installed): the override that states it, so python.consistency reports it as accepted,
    with the requirement it overrides as its reason. One override per package."""
    lines: list[Line] = []
    seen: set[str] = set()
    for conflict in conflicts(facts.distributions, facts.markers):
        name = canonicalize_name(conflict.package)
        if name not in pins or name in seen or conflict.installed is None:
            continue
        seen.add(name)
        needs = f"{conflict.requirer} {conflict.requirer_version} requires {conflict.requirement}"
        lines += [
            ("", None),
            ("[[python.override]]", "found installed so by `stackgate init`: keep it only if it is meant"),
            (f"package = {_toml(name)}", None),
            (f'version = "=={pins[name]}"', None),
            (f"reason = {_toml(f'{needs}; {conflict.installed} is installed here')}", None),
        ]
    return lines


def _indexes(pins: dict[str, str]) -> list[Line]:
    """The PyTorch index of a torch whose version carries a CUDA label (+cu130): PyPI has no such build."""
    label = Version(pins["torch"]).local if "torch" in pins else None
    if not label or not re.fullmatch(r"cu\d+|cpu", label):
        return []
    return [
        ("", None),
        ("[[python.index]]", None),
        (
            f'url = "https://download.pytorch.org/whl/{label}"',
            f"torch {pins['torch']} is a {label} build: PyPI has none",
        ),
        ('packages = ["torch"]', "served only from this index"),
    ]


def _smoke(machine: Machine, gpus: int, capabilities: list[str]) -> list[Line]:
    gate: Mapping[str, Any] = (
        machine.gate.flashinfer if machine.gate is not None else {"error": "no interpreter to read it with"}
    )
    lines: list[Line] = [
        ("[smoke]", None),
        (f"tp = {gpus}", "one tensor-parallel rank per GPU"),
        ('model = ""', "set the model directory smoke launches"),
    ]
    if "error" in gate and gate.get("version") is None:
        return [*lines, ('attention_backend = "triton"', f"flashinfer is not usable here: {gate['error']}")]
    lines.append(
        ('attention_backend = "flashinfer"', f"flashinfer {gate.get('version')} is installed ({gate.get('file')})")
    )
    supported = gate.get("supported_majors")
    if not supported:
        return [
            *lines,
            ("flags = []", f"no fusion flag: flashinfer's fusion arch gate could not be read: {gate.get('error')}"),
        ]
    majors = majors_of(capabilities)
    problem = fusion_arch_problem(majors, supported, machine.environ.get("FLASHINFER_CUDA_ARCH_LIST"))
    if problem is not None:
        return [*lines, ("flags = []", f"no fusion flag: {problem}")]
    refusal = engine_refusal(machine.gate.sglang if machine.gate is not None else None, majors)
    if refusal is not None:
        return [*lines, ("flags = []", f"no fusion flag: {refusal}")]
    if gpus < 2:
        return [*lines, ("flags = []", f"no fusion flag at tp = 1: one rank has no all-reduce to fuse ({FUSION_FLAG})")]
    return [
        *lines,
        (
            f'flags = ["{FUSION_FLAG}"]',
            f"flashinfer's fusion arch gate admits majors {supported}{_engine_admits(machine)}: "
            "`verify --deep` proves it",
        ),
        (
            f"# smoke proves the fused path ran from the log line {DEFAULT_EVIDENCE[FUSION_FLAG]!r} (the flag's",
            None,
        ),
        ("# default evidence: `evidence = { ... }` here may replace the pattern, never remove it)", None),
    ]


def _engine_admits(machine: Machine) -> str:
    """ ", sglang 0.5.23 admits [9, 10]" where sglang's own gate was read, else ""."""
    sglang = machine.gate.sglang if machine.gate is not None else None
    if not sglang or "supported_majors" not in sglang:
        return ""
    return f", sglang {sglang.get('version')} admits {sglang['supported_majors']}"


def _triton_env(machine: Machine, capability: Capability) -> list[Line]:
    """TRITON_PTXAS_PATH at the default toolkit, unless Triton's own ptxas builds this arch (and
    the shell does not set it): then it is left out, and the comment says why."""
    build = machine.triton_ptxas
    if isinstance(build, ArchBuild) and build.ok and not machine.environ.get("TRITON_PTXAS_PATH"):
        return [(f"# TRITON_PTXAS_PATH unset: Triton's bundled ptxas builds {build.arch}", None)]
    if isinstance(build, ArchBuild):
        why = f"Triton's bundled ptxas cannot build {capability.arch}" if not build.ok else "this shell sets it"
    else:
        why = build.reason if isinstance(build, Missing) else "no Triton to ask: its ptxas may not know this arch"
    return [('TRITON_PTXAS_PATH = "{toolkit.default}/bin/ptxas"', why)]


def machine_spec(machine: Machine, when: str) -> str:
    """This machine as a spec (``machine.nvml`` must be a snapshot with a GPU)."""
    assert isinstance(machine.nvml, NvmlSnapshot) and machine.nvml.gpus
    hardware, capability = _hardware(machine.nvml)
    capabilities = [
        f"{g.capability[0]}.{g.capability[1]}" if g.capability else str(capability) for g in machine.nvml.gpus
    ]
    found = machine.python if isinstance(machine.python, FoundPython) else None
    torch = (found.facts.torch or {}) if found else {}
    gpus = len(machine.nvml.gpus)
    describe = f"{gpus}x {machine.nvml.gpus[0].name} ({capability.arch})" + (
        f", torch {torch['version']}" if torch.get("version") else ""
    )
    host = hostname()
    lines: list[Line] = [
        (f"# This machine ({host}) as `stackgate init` saw it at {when}. Each value says where it came", None),
        ("# from; change what should differ, then `stackgate verify` (docs/init.md tells each key).", None),
        ("", None),
        ("[stack]", None),
        (f"name = {_toml(stack_name(host))}", "this host's name"),
        (f"description = {_toml(describe)}", None),
        ("", None),
        *hardware,
        *_toolkits(machine),
        ("", None),
    ]
    if found is not None:
        lines += [*_python(found), ("", None)]
    if machine.default is not None:
        lines += [
            ("[env]", None),
            ('CUDA_HOME = "{toolkit.default}"', "flashinfer's JIT and sgl-kernel build with this toolkit"),
            *_triton_env(machine, capability),
            ("", None),
        ]
    nccl = torch.get("nccl_version")
    if isinstance(nccl, list):
        lines += [
            ("[nccl]", None),
            (f'min_version = "{".".join(map(str, nccl))}"', "the NCCL torch loads here: the floor"),
            ("", None),
        ]
    return _lines([*lines, *_smoke(machine, gpus, capabilities)])
