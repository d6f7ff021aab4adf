"""Extractors: read more out of an event than one pattern's groups can hold.

A signature names one in its ``extract`` field; the scanner hands it the event's text (the
window of lines the match belongs to) and the stack's context, and the values it returns join
the match's groups, so that causes and fixes can quote them. Provision reads resolver output
through the same values (``package``, ``requirers``, ``culprit``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Mapping

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

__all__ = [
    "CUDA_INIT_ERRORS",
    "EXTRACTORS",
    "NCCL_CLASSES",
    "Extractor",
    "Requirement",
    "demangle",
    "first_error",
    "requirers",
    "torch_requirers",
]

_NAME = r"[A-Za-z0-9][A-Za-z0-9._\-]*(?:\[[^\]\s]*\])?"
#: pip: "    sglang[srt] 0.4.9.post3 depends on torch==2.7.1; extra == "srt""
_PIP_DEPENDS = re.compile(
    rf"^\s*(?P<req>{_NAME}) (?P<ver>\S+) depends on (?P<pkg>{_NAME})(?P<spec>[^;\s]*)", re.MULTILINE
)
#: pip: "    The user requested torch==2.1.1"
_PIP_USER = re.compile(rf"^\s*The user requested (?P<pkg>{_NAME})(?P<spec>[^;\s]*)", re.MULTILINE)
#: uv (after unwrapping): "Because sglang==0.5.9 depends on torch==2.9.1 and ...", "Because all
#: versions of eager-upgrader depend on torch>=2.10 and ..."
_UV_DEPENDS = re.compile(
    rf"(?P<req>{_NAME})(?:(?:==|>=|<=|~=|>|<)(?P<ver>[^\s,{{}}]+))?(?:\{{[^}}]*\}})? depends? on "
    rf"(?P<pkg>{_NAME})(?:\{{[^}}]*\}})?(?P<spec>[^\s,]*)"
)
_UV_USER = re.compile(rf"(?:you require|your project depends on) (?P<pkg>{_NAME})(?P<spec>[^\s,]*)")
_UV_DECORATION = re.compile(r"^[\s│╰─▶×]+", re.MULTILINE)
#: "ImportError: libnvrtc.so.12: ...", "fatal error: curand_kernel.h: ...", "error : Feature ..."
_ERROR_LINE = re.compile(r"(?:\b\w*Error|\bfatal error|\berror)\s*:\s*\S")


@dataclass(frozen=True)
class Requirement:
    """One requirer of a package, as a resolver report states it."""

    requirer: str  #: "sglang[srt]", or "you" for the user's own requirement
    version: str  #: the requirer's version ("" when the report does not say)
    package: str
    specifier: str  #: "==2.7.1", "" for an unbounded requirement

    def __str__(self) -> str:
        who = f"{self.requirer} {self.version}".strip()
        return f"{who} ({self.package}{self.specifier})"


@dataclass(frozen=True)
class Extractor:
    provides: tuple[str, ...]
    function: Callable[[str, Mapping[str, str]], dict[str, str]]

    def __call__(self, text: str, context: Mapping[str, str]) -> dict[str, str]:
        return self.function(text, context)


def requirers(text: str) -> list[Requirement]:
    """Every "X depends on Y<spec>" a pip or uv resolver report states, in order.

    >>> report = "    sglang 0.5.9 depends on torch==2.9.1\\n    flashinfer-python 0.6.4 depends on torch"
    >>> [str(r) for r in requirers(report)]
    ['sglang 0.5.9 (torch==2.9.1)', 'flashinfer-python 0.6.4 (torch)']
    """
    found = [Requirement(m["req"], m["ver"], m["pkg"], _spec(m["spec"])) for m in _PIP_DEPENDS.finditer(text)]
    found += [Requirement("you", "", m["pkg"], _spec(m["spec"])) for m in _PIP_USER.finditer(text)]
    if not found:
        flat = " ".join(_UV_DECORATION.sub("", text).split())  # uv wraps its sentences anywhere
        found += [Requirement(m["req"], m["ver"] or "", m["pkg"], _spec(m["spec"])) for m in _UV_DEPENDS.finditer(flat)]
        found += [Requirement("you", "", m["pkg"], _spec(m["spec"])) for m in _UV_USER.finditer(flat)]
    return list(dict.fromkeys(found))


def torch_requirers(text: str, context: Mapping[str, str]) -> dict[str, str]:
    """The contested package, who requires what of it, and whose requirement excludes the lock's pin.

    The contested package is the one with the most requirers (among equals a pinned one, then
    torch). The culprit is a requirer whose specifier excludes the lock's pin of it; without a
    pin, the requirers that bound the package at all.
    """
    found = requirers(text)
    if not found:
        return {}
    pins = _pins(context.get("lock_pins", ""))
    names = [canonicalize_name(r.package.split("[")[0]) for r in found]
    # The contested package: the most required one; among equals a pinned one, then torch.
    package = max(dict.fromkeys(names), key=lambda n: (names.count(n), n in pins, n == "torch"))
    mine = [r for r, n in zip(found, names, strict=True) if n == package]
    return {"package": package, "requirers": "; ".join(map(str, mine)), "culprit": _culprit(mine, pins.get(package))}


def _culprit(mine: list[Requirement], pinned: str | None) -> str:
    others = [r for r in mine if r.requirer != "you"]
    if pinned:
        version = _version(pinned)
        excluding = [r for r in others if version is not None and not _allows(r.specifier, version)]
        return "; ".join(map(str, excluding)) or f"no requirer in the report excludes {pinned}"
    bounded = [r for r in others if r.specifier]
    return "; ".join(map(str, bounded)) or "no requirer in the report bounds it"


def first_error(text: str, context: Mapping[str, str]) -> dict[str, str]:
    """The first line after the event's first line that names an error (a compiler's, an import's)."""
    for line in text.splitlines()[1:]:
        if _ERROR_LINE.search(line):
            return {"first_error": line.strip(" -\t")}
    return {"first_error": "(no error line in the output that followed)"}


def _spec(text: str) -> str:
    return text.strip().rstrip(".;")


def _pins(text: str) -> dict[str, str]:
    """``"torch==2.9.1+cu130 triton==3.5.1"`` -> ``{"torch": "2.9.1+cu130", "triton": "3.5.1"}``."""
    pins: dict[str, str] = {}
    for requirement in text.split():
        name, sep, version = requirement.partition("==")
        if sep:
            pins[canonicalize_name(name)] = version
    return pins


def _version(text: str) -> Version | None:
    try:
        return Version(text)
    except InvalidVersion:
        return None


def _allows(specifier: str, version: Version) -> bool:
    if not specifier:
        return True
    try:
        return SpecifierSet(specifier).contains(version, prereleases=True)
    except InvalidSpecifier:
        return True  # a specifier we cannot read is not evidence against it


# -- families: what a match's variables mean -------------------------------------------------

#: Namespaces of mangled C++ names, and C symbol prefixes -> the library that exports them.
_PROVIDERS = (
    (("c10", "at", "torch", "caffe2"), "torch (libc10.so / libtorch*.so)", "torch"),
    (("flashinfer",), "flashinfer", "flashinfer"),
    (("nccl",), "NCCL (libnccl.so)", "nccl"),
    (("cublas", "cublasLt"), "cuBLAS (libcublas.so)", "cuda toolkit"),
    (("curand",), "cuRAND (libcurand.so)", "cuda toolkit"),
    (("cudnn",), "cuDNN (libcudnn.so)", "cuda toolkit"),
    (("cuda",), "the CUDA runtime (libcudart.so)", "cuda toolkit"),
    (("nvrtc",), "NVRTC (libnvrtc.so)", "cuda toolkit"),
    (("cu", "cuGreen", "cuMem"), "the NVIDIA driver (libcuda.so)", "driver"),
    (("std", "__cxx11", "GLIBCXX"), "the C++ runtime (libstdc++.so)", "python"),
    (("Py", "_Py"), "Python (libpython)", "python"),
)
#: The packages of this stack whose extensions the lock's torch pin is the answer for.
_STACK_PACKAGES = ("sgl_kernel", "flashinfer", "sglang", "torch", "flash_attn")
_PACKAGE_DIR = re.compile(r"(?:site|dist)-packages/(?P<package>[A-Za-z_]\w*)/")
_SOURCE_NAME = re.compile(r"(?P<n>\d+)")


def demangle(symbol: str) -> str:
    """A readable name for an Itanium-mangled C++ symbol: its qualified name, without the
    argument types; a name that is not mangled comes back as it is.

    >>> demangle("_ZN3c104cuda9SetDeviceEa"), demangle("_ZNK3c105Error4whatEv"), demangle("cuGreenCtxStreamCreate")
    ('c10::cuda::SetDevice', 'c10::Error::what', 'cuGreenCtxStreamCreate')
    >>> demangle("_ZN5torch3jit17parseSchemaOrNameERKSsb"), demangle(
    ...     "c10::MessageLogger::MessageLogger(char const*, int)"
    ... )
    ('torch::jit::parseSchemaOrName', 'c10::MessageLogger::MessageLogger')
    """
    if not symbol.startswith("_Z"):
        return symbol.split("(")[0]
    rest = symbol[2:]
    nested = rest.startswith("N")
    rest = rest[1:] if nested else rest
    while rest[:1] in ("K", "V", "r"):
        rest = rest[1:]
    parts = []
    while rest[:1].isdigit():
        count = _SOURCE_NAME.match(rest)
        assert count is not None
        length, start = int(count["n"]), count.end()
        parts.append(rest[start : start + length])
        rest = rest[start + length :]
        if rest.startswith("C1") or rest.startswith("C2"):
            parts.append(parts[-1])
            break
        if not nested:
            break
    return "::".join(parts) if parts else symbol


def _exports(prefixes: tuple[str, ...], name: str, head: str) -> bool:
    """A C++ name by its namespace, a C name by its prefix followed by a capital (cuMemAlloc)."""
    if "::" in name:
        return head in prefixes
    return any(head.startswith(p) and head[len(p) : len(p) + 1].isupper() for p in prefixes)


def symbol_provider(text: str, context: Mapping[str, str]) -> dict[str, str]:
    """The undefined symbol's readable name, the library that exports it, what that means, and the
    package the log names as the extension's owner (never this stack's pin for another project's log)."""
    match = re.search(r"undefined symbol:\s*(?P<s>[^\s`'\"]+(?:\([^)\n]*\)(?: const)?)?)", text)
    symbol = match["s"] if match else ""
    name = demangle(symbol)
    head = name.split("::")[0] if "::" in name else name
    provider, component = next(
        ((provider, component) for prefixes, provider, component in _PROVIDERS if _exports(prefixes, name, head)),
        ("the library it was built against", "torch"),
    )
    library = re.search(r"(?P<lib>[\w.\-]+\.so(?:\.[\w.]+)?)(?:: error: symbol lookup error)?: undefined symbol", text)
    reason = {
        "driver": (
            "the extension calls a driver function this NVIDIA driver does not have: the driver is older than the "
            "CUDA the extension was built with"
        ),
        "python": f"the extension was built for another build of {provider.split(' (')[0]} than the one running it",
        "cuda toolkit": (
            f"the extension was linked without {provider} (a build that left out its -l flag) or against another "
            "version of it"
        ),
    }.get(component, f"the extension was built against another version of {provider}")
    owner = _PACKAGE_DIR.search(text)
    package = owner["package"] if owner else ""
    if component == "torch":
        pin = context.get("locked_torch", "") if (not package or package in _STACK_PACKAGES) else ""
        rebuild = (
            f"Reinstall {package or 'the extension'} built for the torch installed here, or install the torch it "
            f"was built for{pin}; never move torch alone under a compiled extension"
        )
    elif component == "driver":
        rebuild = (
            "Install a driver new enough for the CUDA the extension was built with, or its build for an older CUDA"
        )
    else:
        library_name = provider.split(" (")[0]
        rebuild = f"Rebuild or reinstall {package or 'the extension'} against the {library_name} installed here"
    return {
        "name": name,
        "provider": provider,
        "extension": library["lib"] if library else "a compiled extension",
        "reason": reason,
        "package": package or "the extension's package",
        "rebuild": rebuild,
        COMPONENT: component,
    }


#: CUDA shared objects -> (what they are, how their soname's number reads).
_CUDA_LIBRARIES = {
    "cudart": "the CUDA runtime",
    "cublas": "cuBLAS",
    "cublasLt": "cuBLASLt",
    "nvrtc": "NVRTC (runtime compilation)",
    "nvrtc-builtins": "NVRTC's builtins",
    "cusparse": "cuSPARSE",
    "cufft": "cuFFT",
    "curand": "cuRAND",
    "cusolver": "cuSOLVER",
    "nvJitLink": "nvJitLink",
    "cupti": "CUPTI",
    "nvToolsExt": "NVTX",
    "cudnn": "cuDNN",
    "nccl": "NCCL",
    "cuda": "the NVIDIA driver's CUDA library",
    "nvidia-ml": "NVML (the driver's management library)",
    "cufile": "cuFile",
    "cusparseLt": "cuSPARSELt",
}


def shared_object(text: str, context: Mapping[str, str]) -> dict[str, str]:
    """What a missing ``lib*.so.N`` belongs to and which CUDA (or component) major its number names."""
    match = re.search(r"(?P<lib>lib(?P<library>[A-Za-z][\w\-]*?)(?:\.alt)?[.,]so[.,](?P<major>\d+)(?:\.\d+)*)", text)
    if not match:
        return {}
    library, major = match["library"], match["major"]
    what = _CUDA_LIBRARIES.get(library, f"lib{library}")
    stack = (context.get("torch_cuda") or "13.0").split(" ")[0]
    if library in ("cuda", "nvidia-ml"):
        belongs = (
            "it comes with the NVIDIA driver: no driver is installed, or the container was started without the GPU "
            "(no --gpus, no NVIDIA container toolkit)"
        )
    elif library.startswith("cudnn"):
        belongs = f"its number is cuDNN's major: a package was built against cuDNN {major}"
    elif library == "nccl":
        belongs = "it comes from the nvidia-nccl wheel of this CUDA, which is missing"
    elif stack.startswith(major + "."):
        belongs = (
            f"CUDA {major} is the stack's major, so its nvidia-*-cu{major} wheel or the toolkit's lib folder is not "
            "on the library path"
        )
    else:
        belongs = f"it is its package's build for another CUDA than the stack's ({stack})"
    return {"what": what, "belongs": belongs, "lib": match["lib"], "major": major}


def missing_library(text: str, context: Mapping[str, str]) -> dict[str, str]:
    """Any shared object the loader could not open: the name the log gives, the major its soname asks
    for, and what that means: a file given by path (a build that did not produce it) or a soname the
    loader looked for on its search path."""
    match = re.search(r"(?P<lib>[\w./+\-]+?\.so(?P<tail>(?:\.\d+)*))[:,] cannot open shared object file", text)
    if not match:
        return {}
    lib = match["lib"]
    stem = lib.rsplit("/", 1)[-1].split(".so")[0]
    major = (match["tail"] or ".").split(".")[1] if match["tail"] else ""
    if "/" in lib:
        return {
            "lib": lib,
            "stem": stem,
            "major": major,
            "meaning": (
                f"the file {lib} does not exist: the build or install that should have put it there failed or was "
                "removed (an extension built on first use: its build's first error, earlier in the log, says why)"
            ),
            "remedy": (
                f"Read the first error of the build that should have made {stem}.so; remove that build's folder "
                f"({lib.rsplit('/', 1)[0]}) and run again so it is rebuilt, or install the package's prebuilt wheel"
            ),
        }
    wanted = f" at major {major}" if major else ""
    return {
        "lib": lib,
        "stem": stem,
        "major": major,
        "meaning": (
            f"the program or a module it imports was linked against {lib}, and the dynamic loader found no file of "
            f"that name on its search path: the library's package is not installed{wanted}, or it is installed "
            "where the loader does not look (LD_LIBRARY_PATH, /etc/ld.so.conf.d)"
        ),
        "remedy": (
            f"Find what provides {lib} (`ldconfig -p | grep {stem}`, `find / -name '{stem}.so*'`), install that "
            f"library{wanted} or add its folder to LD_LIBRARY_PATH (or ld.so.conf.d, then ldconfig); a package "
            f"built against another major of {stem} needs its build for the one installed"
        ),
    }


#: CUDA error codes of device discovery and initialisation -> (name, what it means here, what to do).
CUDA_INIT_ERRORS = {
    "3": (
        "initialization error",
        "the driver and runtime could not be initialised: the kernel module is not loaded, the device files are "
        "missing (a container without the GPU) or the GPU is in a bad state",
        "Check `nvidia-smi` and `dmesg` (stackgate diagnose --kernel); in a container pass the GPUs (--gpus all / "
        "the NVIDIA container toolkit).",
    ),
    "35": (
        "insufficient driver",
        "the driver is older than the CUDA runtime",
        "Install a driver that supports this CUDA (stackgate verify --check gpu.driver_cuda).",
    ),
    "100": (
        "no CUDA-capable device is detected",
        "no GPU is visible to the process: CUDA_VISIBLE_DEVICES is empty or wrong, or the container got no GPU",
        "Check CUDA_VISIBLE_DEVICES and the container's GPU options; `nvidia-smi -L` lists what the driver sees.",
    ),
    "101": (
        "invalid device ordinal",
        "CUDA_VISIBLE_DEVICES (or the code) names a GPU index that does not exist",
        "Set CUDA_VISIBLE_DEVICES to indexes `nvidia-smi -L` lists.",
    ),
    "802": (
        "system not yet initialized",
        "on NVSwitch systems (HGX) the fabric manager is not running, so no GPU can be used",
        "Start nvidia-fabricmanager at the driver's exact version (systemctl status nvidia-fabricmanager).",
    ),
    "803": (
        "system has unsupported display driver / cuda driver combination",
        "the user-space driver library does not match the loaded kernel module (a driver upgrade without reboot, or "
        "a container's compat libraries)",
        "Reboot after a driver upgrade, or remove mismatched libcuda from LD_LIBRARY_PATH.",
    ),
    "804": (
        "forward compatibility was attempted on non supported HW",
        "a cuda-compat (forward compatibility) libcuda is used on a GPU that does not support it (GeForce/RTX "
        "workstation cards)",
        "Remove the cuda-compat libraries from LD_LIBRARY_PATH (or the image) and install a driver new enough for "
        "this CUDA.",
    ),
    "999": (
        "unknown error",
        "often the nvidia-uvm module is not loaded or the GPU did not come back from suspend",
        "Load the UVM module (sudo modprobe nvidia-uvm) or reboot; check dmesg (stackgate diagnose --kernel) for "
        "Xid events.",
    ),
}
_CUDA_NAMES = {name: code for code, (name, _, _) in CUDA_INIT_ERRORS.items()}


def cuda_error(text: str, context: Mapping[str, str]) -> dict[str, str]:
    """The CUDA error's code and name, what they mean and what to do."""
    codes = [
        m["code"]
        for m in re.finditer(r"(?:\bError |error=|error |returned |failure: |\()\(?(?P<code>\d{1,3})(?!\d)", text)
    ]
    found = next((c for c in codes if c in CUDA_INIT_ERRORS), None)
    if found is None:
        lowered = text.lower()
        found = next((c for name, c in _CUDA_NAMES.items() if name.lower() in lowered), None)
    if found is None and re.search(r"driver initialization failed|InitializationError|NOT_INITIALIZED", text):
        found = "3"
    if found is None:
        return {
            "code": "?",
            "name": "unknown",
            "meaning": "CUDA could not be initialised",
            "action": CUDA_INIT_ERRORS["3"][2],
        }
    name, meaning, action = CUDA_INIT_ERRORS[found]
    return {"code": found, "name": name, "meaning": meaning, "action": action}


#: NCCL's result classes -> what they usually mean on a serving node.
NCCL_CLASSES = {
    "unhandled cuda error": (
        "a CUDA call inside NCCL failed (the CUDA error is in the NCCL WARN lines: out of memory, an invalid "
        "argument from a P2P mapping the platform refuses, a GPU fault)"
    ),
    "system error": (
        "a system call failed: sockets (a firewall, the wrong interface: NCCL_SOCKET_IFNAME), shared memory "
        "(/dev/shm too small) or a device error"
    ),
    "internal error": (
        "NCCL hit an internal check, often after another rank died or with mismatched NCCL versions across ranks"
    ),
    "invalid argument": (
        "NCCL was called with an invalid value (a bad communicator setting, or a buffer on the wrong device)"
    ),
    "invalid usage": (
        "NCCL was used wrongly: two ranks on one GPU (more ranks than GPUs, or CUDA_VISIBLE_DEVICES repeating a "
        "GPU), or ranks calling different collectives"
    ),
    "remote error": "a peer rank failed or exited; its own error is in its log",
    "cuda failure": "a CUDA call NCCL made failed",
    "connection closed": "a peer closed its connection: it died or its network path broke",
}


def nccl_class(text: str, context: Mapping[str, str]) -> dict[str, str]:
    """The NCCL error's class and what it usually means."""
    lowered = text.lower()
    named = {
        "ncclunhandledcudaerror": "unhandled cuda error",
        "ncclsystemerror": "system error",
        "ncclinternalerror": "internal error",
        "ncclinvalidargument": "invalid argument",
        "ncclinvalidusage": "invalid usage",
        "ncclremoteerror": "remote error",
    }
    found = next((c for c in NCCL_CLASSES if c in lowered), None) or next(
        (c for n, c in named.items() if n in lowered), None
    )
    if found is None and "connection closed" in lowered:
        found = "connection closed"
    found = found or "cuda failure"
    return {"nccl_class": found, "meaning": NCCL_CLASSES[found]}


_KERNEL_OWNERS = (
    (re.compile(r"deep_?gemm|jit_kernels|csrc/(?:utils|apis|jit)/", re.I), "DeepGEMM", "deepgemm"),
    (re.compile(r"flashinfer", re.I), "flashinfer", "flashinfer"),
    (re.compile(r"sgl[_-]kernel", re.I), "sgl-kernel", "sgl-kernel"),
    (
        re.compile(r"unknown:0: unknown:|\btmp\d+\b|triton", re.I),
        "a Triton kernel (triton, or torch.compile's generated code)",
        "triton",
    ),
    (re.compile(r"aten/src|ATen|IndexKernel|c10/cuda", re.I), "a torch (ATen) kernel", "torch"),
)


def kernel_assert(text: str, context: Mapping[str, str]) -> dict[str, str]:
    """Which library's kernel asserted, from the assert's file and condition."""
    for pattern, owner, component in _KERNEL_OWNERS:
        if pattern.search(text):
            return {"owner": owner, COMPONENT: component}
    return {"owner": "a CUDA kernel", COMPONENT: "torch"}


def moe_config(text: str, context: Mapping[str, str]) -> dict[str, str]:
    """The missing tuned MoE config's shape and GPU, from its file name."""
    match = re.search(
        r"E=(?P<experts>\d+),N=(?P<n>\d+),device_name=(?P<device>[^,.\]'\s]+)(?:,dtype=(?P<dtype>[^,.\]'\s]+))?", text
    )
    if not match:
        return {"shape": "this model's", "device": "this GPU", "dtype": ""}
    dtype = f", {match['dtype']}" if match["dtype"] else ""
    return {
        "shape": f"E={match['experts']} N={match['n']}{dtype}",
        "device": match["device"],
        "dtype": match["dtype"] or "",
    }


_WHEEL = re.compile(r"(?P<package>[A-Za-z0-9][\w.]*?)-(?P<version>\d[^-\s]*)-(?:cp|py)\d")
_REQUIRED = re.compile(
    r"(?:Collecting|\+|Installing|Downloading|Would "
    r"install|Downloaded)\s+(?P<package>[A-Za-z0-9][\w.\-]*?)(?:\[[^\]]*\])?==(?P<version>[^\s,;)]+)"
)
_CUDA_WHEEL = re.compile(r"^nvidia-[\w-]+-cu(?P<major>\d+)$")


def installed_version(text: str, context: Mapping[str, str]) -> dict[str, str]:
    """An installer line that takes a frozen package at another version than the lock's, or a
    CUDA-specific wheel of another CUDA; any other line is dropped (``_drop``)."""
    match = _WHEEL.search(text) or _REQUIRED.search(text)
    if not match:
        return {DROP: "no package"}
    package, version = canonicalize_name(match["package"]), match["version"].rstrip(".")
    pins = _pins(context.get("lock_pins", ""))
    if not pins:
        return {DROP: "no lock to read it against (--lock)"}
    stack_major = (context.get("torch_cuda") or "13.0").split(".")[0]
    cuda = _CUDA_WHEEL.match(package)
    local = re.search(r"\+cu(?P<major>\d+?)\d$", version)
    if cuda and cuda["major"] != stack_major:
        reason = f"{package} is a CUDA {cuda['major']} library wheel; the stack runs CUDA {stack_major}"
    elif package in pins and local and local["major"] != stack_major:
        reason = f"{package} {version} is a build for CUDA {local['major']}; the stack runs CUDA {stack_major}"
    elif package in pins and _version(version) is not None and _version(version) != _version(pins[package]):
        plain = _version(pins[package])
        if plain is not None and _version(version) == Version(plain.public) and not local:
            reason = (
                f"{package} {version} is the plain build of the locked {pins[package]}: without its local +cu tag it "
                "is PyPI's, another CUDA"
            )
        else:
            reason = f"the lock pins {package}=={pins[package]}; this installs {version}"
    else:
        return {DROP: "at the locked version, or not frozen"}
    return {
        "package": package,
        "version": version,
        "locked": pins.get(package, "its CUDA " + stack_major + " build"),
        "reason": reason,
    }


#: An engine's memory knobs, as its own log names it: (KV cache fraction, CUDA graph batch, concurrent requests).
_ENGINE_KNOBS = {
    "vllm": ("--gpu-memory-utilization", "--max-num-seqs, or run with --enforce-eager", "--max-num-seqs"),
    "sglang": ("--mem-fraction-static", "--cuda-graph-max-bs", "--max-running-requests"),
    "": (
        "the engine's memory fraction",
        "the largest batch captured in CUDA graphs (or run eager)",
        "how many requests it runs at once",
    ),
}
_ENGINES = (
    (re.compile(r"\bvllm\b|Vllm|EngineCore"), "vllm"),
    (re.compile(r"\bsglang\b|sgl_kernel|\bTP\d+\]"), "sglang"),
)
#: When the GPU ran out of memory, by the event's words: (pattern, phase, what helps, given the engine's knobs).
_OOM_PHASES = (
    (
        re.compile(r"captur(?:e|ing)|cuda_graph|CudaGraph|CUDA graph", re.I),
        "while capturing CUDA graphs",
        "lower {graph} (or leave more memory: lower {fraction})",
    ),
    (
        re.compile(r"init_memory_pool|KV ?[Cc]ache|kv_cache|token_to_kv|mem_fraction", re.I),
        "while allocating the KV cache",
        "lower {fraction}",
    ),
    (
        re.compile(r"load_model|load_weights|weight_loader|from_pretrained|Loading|safetensors", re.I),
        "while loading the weights",
        "raise the TP size or use a smaller (quantised) checkpoint",
    ),
)


def oom_phase(text: str, context: Mapping[str, str]) -> dict[str, str]:
    """When the GPU ran out of memory (weights, KV cache, CUDA graph capture, serving) and what helps then,
    in the knobs of the engine the log names (this stack's SGLang when a lock is given and the log names none)."""
    engine = next(
        (name for pattern, name in _ENGINES if pattern.search(text)), "sglang" if context.get("lock_flag") else ""
    )
    fraction, graph, requests = _ENGINE_KNOBS[engine]
    for pattern, phase, action in _OOM_PHASES:
        if pattern.search(text):
            return {"phase": phase, "action": action.format(graph=graph, fraction=fraction), "fraction": fraction}
    return {
        "phase": "while serving",
        "action": f"lower {fraction} or {requests}",
        "fraction": fraction,
    }


#: Extractor keys the scanner acts on (see scanner): drop the match, name the component.
DROP = "_drop"
COMPONENT = "component"

EXTRACTORS: Mapping[str, Extractor] = {
    "torch_requirers": Extractor(("package", "requirers", "culprit"), torch_requirers),
    "first_error": Extractor(("first_error",), first_error),
    "symbol_provider": Extractor(("name", "provider", "extension", "reason", "package", "rebuild"), symbol_provider),
    "missing_library": Extractor(("lib", "stem", "major", "meaning", "remedy"), missing_library),
    "shared_object": Extractor(("what", "belongs", "lib", "major"), shared_object),
    "cuda_error": Extractor(("code", "name", "meaning", "action"), cuda_error),
    "nccl_class": Extractor(("nccl_class", "meaning"), nccl_class),
    "kernel_assert": Extractor(("owner",), kernel_assert),
    "moe_config": Extractor(("shape", "device", "dtype"), moe_config),
    "installed_version": Extractor(("package", "version", "locked", "reason"), installed_version),
    "oom_phase": Extractor(("phase", "action", "fraction"), oom_phase),
}
