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
#: sglang 0.5.9's runtime gate of the fused path, and where its _is_smNN_supported come from.
SGLANG_GATE = (
    "srt/layers/communicator.py",
    "apply_flashinfer_allreduce_fusion",
    "srt/utils/common.py",
    "device_capability_majors",
)


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


def sglang_gate():
    """The majors sglang's ``apply_flashinfer_allreduce_fusion`` admits (None: no sglang here)."""
    where = package_dir("sglang")
    if where is None:
        return None
    relative, function, helpers, keyword = SGLANG_GATE
    record = {"version": dist_version("sglang"), "file": str(where / relative), "function": function}
    try:
        names = referenced((where / relative).read_text(), function, r"_is_sm\d+_supported")
        common = (where / helpers).read_text()
        majors = [m for name in names for m in keyword_value(common, name.lstrip("_"), keyword)]
        return {**record, "supported_majors": sorted(set(majors)), "helpers": str(where / helpers)}
    except (OSError, SyntaxError, ValueError) as exc:
        return {**record, "error": f"{type(exc).__name__}: {exc}"}
