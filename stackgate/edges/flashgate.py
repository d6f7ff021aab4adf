"""The fused all-reduce's arch gate, read from the INSTALLED code with ast (nothing is imported, torch
not even present): which compute capability majors flashinfer builds its allreduce-fusion (TRT-LLM
comm) module for, and which majors sglang's fused path admits. Run by the stack's own interpreter as
part of flashwork.py (its ``gate`` mode, and the fusion's records), which imports it as a sibling the
way it imports deepwork.py; stdlib only.
"""

import ast
import importlib.metadata
import importlib.util
import re
from pathlib import Path

#: The TRT-LLM allreduce-fusion module's generator in flashinfer/jit/comm.py, and its keyword.
COMM_GATE = ("jit/comm.py", "gen_trtllm_comm_module", "supported_major_versions")
#: Where sglang gates its fused path, one entry per layout, newest first: (the file, the function
#: that refuses, the file that maps ``get_platform()``'s names to probes or "" where the function reads
#: module-level ``_is_smNN_supported`` names, the file that defines the probes, and their keyword).
SGLANG_GATES = (
    # sglang 0.5.23: _resolve_backend raises ValueError unless get_platform().is_sm90 or .is_sm100
    (
        "srt/layers/flashinfer_comm_fusion.py",
        "_resolve_backend",
        "srt/runtime_context.py",
        "srt/utils/common.py",
        "device_capability_majors",
    ),
    # sglang 0.5.9: apply_flashinfer_allreduce_fusion returns False unless _is_sm90_supported or _is_sm100_supported
    (
        "srt/layers/communicator.py",
        "apply_flashinfer_allreduce_fusion",
        "",
        "srt/utils/common.py",
        "device_capability_majors",
    ),
)
#: The table in runtime_context.py that maps each ``get_platform()`` name to its probe in utils/common.py.
PLATFORM_PROBES = "_PLATFORM_PROBES"


def keyword_value(source, owner, keyword):
    """The literal ``keyword=`` argument of a call inside ``owner`` (a function, or a module-level
    assignment of that name) in Python ``source``, read with ast: nothing is run.

    >>> keyword_value("def gen():\\n    flags(supported_major_versions=[9, 10])\\n", "gen", "supported_major_versions")
    [9, 10]
    >>> keyword_value(
    ...     "is_sm90 = cache(partial(check, device_capability_majors=[9]))", "is_sm90", "device_capability_majors"
    ... )
    [9]
    """
    for node in ast.walk(ast.parse(source)):
        named = isinstance(node, ast.FunctionDef) and node.name == owner
        assigned = isinstance(node, ast.Assign) and any(getattr(t, "id", None) == owner for t in node.targets)
        if named or assigned:
            for call in ast.walk(node):
                for kw in call.keywords if isinstance(call, ast.Call) else ():
                    if kw.arg == keyword:
                        return ast.literal_eval(kw.value)
    raise ValueError(f"no {keyword}= in {owner}")


def referenced(source, function, pattern):
    """The names matching ``pattern`` that ``function`` reads, in order of first use.

    >>> referenced(
    ...     "def f(n):\\n    return (_is_sm90_supported or _is_sm100_supported) and n\\n", "f", r"_is_sm\\d+_supported"
    ... )
    ['_is_sm90_supported', '_is_sm100_supported']
    """
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef) and node.name == function:
            names = [n.id for n in ast.walk(node) if isinstance(n, ast.Name) and re.fullmatch(pattern, n.id)]
            return list(dict.fromkeys(names))
    raise ValueError(f"no function {function}")


def package_dir(name):
    """The folder of top-level package ``name``, found the way `import` would find it, without importing it."""
    spec = importlib.util.find_spec(name)
    locations = list(spec.submodule_search_locations or ()) if spec is not None else []
    return Path(locations[0]) if locations else None


def dist_version(name):
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def flashinfer_gate():
    """The majors flashinfer's comm module JIT-builds for (its get_nvcc_flags_list raises
    "No supported CUDA architectures found for major versions [...]" for any other)."""
    where = package_dir("flashinfer")
    if where is None:
        return {"error": "flashinfer is not installed in this interpreter (no 'flashinfer' package on its sys.path)"}
    relative, function, keyword = COMM_GATE
    record = {"version": dist_version("flashinfer-python"), "file": str(where / relative), "function": function}
    try:
        return {**record, "supported_majors": keyword_value((where / relative).read_text(), function, keyword)}
    except (OSError, SyntaxError, ValueError) as exc:
        return {**record, "error": f"{type(exc).__name__}: {exc}"}


def assigned(source, name):
    """The literal value of the module-level assignment ``name = ...`` (annotated or not) in ``source``.

    >>> assigned("_PROBES: Dict[str, str] = {'is_sm90': 'is_sm90_supported'}", "_PROBES")
    {'is_sm90': 'is_sm90_supported'}
    """
    for node in ast.parse(source).body:
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        )
        if any(getattr(t, "id", None) == name for t in targets) and node.value is not None:
            return ast.literal_eval(node.value)
    raise ValueError(f"no {name} = ... at module level")


def raised(source, function):
    """How ``function`` refuses: the first ``if TEST: raise E("...")`` in it, as (the attribute names
    TEST reads, E's name, the message); None where it raises nothing (it refuses by returning False).

    >>> raised(
    ...     "def r(b):\\n    if not (p().is_sm90 or p().is_sm100):\\n        raise ValueError('needs SM90')\\n", "r"
    ... )
    (['is_sm90', 'is_sm100'], 'ValueError', 'needs SM90')
    >>> raised("def r(b):\\n    return b\\n", "r") is None
    True
    """
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef) and node.name == function:
            for branch in ast.walk(node):
                if not isinstance(branch, ast.If) or not branch.body:
                    continue
                first = branch.body[0]
                if isinstance(first, ast.Raise) and isinstance(first.exc, ast.Call):
                    names = [n.attr for n in ast.walk(branch.test) if isinstance(n, ast.Attribute)]
                    message = ast.literal_eval(first.exc.args[0]) if first.exc.args else ""
                    return list(dict.fromkeys(names)), getattr(first.exc.func, "id", "an exception"), message
            return None
    raise ValueError(f"no function {function}")


def _probe_names(where, relative, function, platform):
    """The probes in utils/common.py that ``function`` asks, and how it refuses."""
    source = (where / relative).read_text()
    if not platform:
        names = [n.lstrip("_") for n in referenced(source, function, r"_is_sm\d+_supported")]
        return names, {"refusal": "silent", "message": f"{function}() returns False: the flag is a no-op"}
    found = raised(source, function)
    if found is None:
        raise ValueError(f"{function} raises nothing")
    attributes, exception, message = found
    probes = assigned((where / platform).read_text(), PLATFORM_PROBES)
    names = [probes[a] for a in attributes if re.fullmatch(r"is_sm\d+", a) and a in probes]
    return names, {"refusal": "raises", "message": f"{exception}: {message}"}


def _defines(path, function):
    try:
        return f"def {function}(" in path.read_text()
    except OSError:
        return False


def sglang_gate():
    """The majors sglang's fused path admits, read from whichever of its layouts (SGLANG_GATES) is
    installed, and how it refuses any other: silently (0.5.9) or with an exception at start-up
    (0.5.23). None: no sglang here."""
    where = package_dir("sglang")
    if where is None:
        return None
    layout = next((g for g in SGLANG_GATES if _defines(where / g[0], g[1])), None)
    if layout is None:
        known = " nor ".join(f"{g[0]}:{g[1]}()" for g in SGLANG_GATES)
        return {"version": dist_version("sglang"), "error": f"neither {known} is in {where}: no known gate"}
    relative, function, platform, helpers, keyword = layout
    record = {"version": dist_version("sglang"), "file": str(where / relative), "function": function}
    try:
        names, refusal = _probe_names(where, relative, function, platform)
        common = (where / helpers).read_text()
        majors = [m for name in names for m in keyword_value(common, name, keyword)]
        if not majors:
            raise ValueError(f"{function} reads no is_smNN probe")
        return {**record, "supported_majors": sorted(set(majors)), "helpers": str(where / helpers), **refusal}
    except (OSError, SyntaxError, ValueError, KeyError) as exc:
        return {**record, "error": f"{type(exc).__name__}: {exc}"}
