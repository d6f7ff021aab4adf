"""Facts about a Python environment, printed as JSON by THAT environment's interpreter.

Run as ``<target python> probe.py OUTPUT.json [REQUEST-JSON]``. Standard library only, and
Python 3.8 compatible: the target may be any environment, healthy or broken. torch is imported
once, only when asked and only if installed; its failure is a fact, not a crash.

REQUEST-JSON: {"torch": true, "distributions": true, "files_of": ["sgl-kernel", ...]} asks for
torch's facts, the installed distributions, and the shared objects each named distribution
installed. stackgate runs the torch part and the distributions part as two processes at once.
"""

import importlib.util
import json
import os
import platform
import re
import sys
import time
import traceback
from types import ModuleType
from typing import Any, Dict, Optional

metadata: Optional[ModuleType]
try:
    from importlib import metadata
except ImportError:  # pragma: no cover - Python < 3.8 has no importlib.metadata
    metadata = None

SCHEMA = "stackgate.probe/1"


def canonical(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def marker_environment():
    """What PEP 508 markers evaluate against in this interpreter."""
    info = sys.implementation.version
    version = "{0.major}.{0.minor}.{0.micro}".format(info)
    if info.releaselevel != "final":
        version += info.releaselevel[0] + str(info.serial)
    return {
        "implementation_name": sys.implementation.name,
        "implementation_version": version,
        "os_name": os.name,
        "platform_machine": platform.machine(),
        "platform_release": platform.release(),
        "platform_system": platform.system(),
        "platform_version": platform.version(),
        "python_full_version": platform.python_version(),
        "platform_python_implementation": platform.python_implementation(),
        "python_version": ".".join(platform.python_version_tuple()[:2]),
        "sys_platform": sys.platform,
    }


def object_sizes(dist):
    """Each shared object the distribution's RECORD lists, with the size RECORD gives it (None: not given)."""
    found = {}
    for file in dist.files or ():
        name = str(file)
        if name.endswith(".so") or ".so." in os.path.basename(name):
            found[str(dist.locate_file(file))] = file.size
    return found


def distributions(files_of, every=False):
    """The installed distributions; the shared objects of those ``files_of`` names (of all of them with ``every``)."""
    if metadata is None:  # Python < 3.8: main() does not ask
        return None
    wanted = {canonical(n) for n in files_of}
    result = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if not name:
            continue
        key = canonical(name)
        if key in result:  # the first on sys.path wins, as for imports
            continue
        entry = {
            "name": name,
            "version": dist.version,
            "requires": list(dist.requires or ()),
            "location": str(dist.locate_file("")),
            "wheel_tags": wheel_tags(dist),
            "direct_url": direct_url(dist),
        }
        if key in wanted or every:
            sizes = object_sizes(dist)
            entry["shared_objects"] = sorted(sizes)
            entry["object_sizes"] = sizes
        result[key] = entry
    return result


def wheel_tags(dist):
    """The tags of the wheel the distribution was installed from (its WHEEL file's Tag lines)."""
    text = dist.read_text("WHEEL") or ""
    return sorted(line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Tag:"))


def direct_url(dist):
    """Where a distribution installed from a URL or a file came from (PEP 610), or None."""
    try:
        found = json.loads(dist.read_text("direct_url.json") or "null")
    except ValueError:
        return {"error": "direct_url.json is not JSON"}
    return found if isinstance(found, dict) else None


def torch_facts():
    started = time.monotonic()
    try:
        import torch
    except BaseException as exc:  # noqa: BLE001 - any failure to import is the fact
        return {
            "imported": False,
            "error": "{}: {}".format(type(exc).__name__, exc),
            "traceback": traceback.format_exc(),
            "import_s": time.monotonic() - started,
        }
    facts: Dict[str, Any] = {"imported": True, "import_s": time.monotonic() - started}
    facts["version"] = str(torch.__version__)
    facts["file"] = getattr(torch, "__file__", None)
    facts["cuda"] = getattr(torch.version, "cuda", None)
    facts["hip"] = getattr(torch.version, "hip", None)
    facts["git_version"] = getattr(torch.version, "git_version", None)
    facts["cxx11_abi"] = ask(lambda: bool(torch._C._GLIBCXX_USE_CXX11_ABI))
    facts["arch_list"] = ask(lambda: list(torch.cuda.get_arch_list()))
    facts["cuda_available"] = ask(lambda: bool(torch.cuda.is_available()))
    facts["device_count"] = ask(lambda: int(torch.cuda.device_count()))
    facts["devices"] = ask(lambda: devices(torch)) if facts["cuda_available"] is True else []
    facts["nccl_version"] = ask(lambda: nccl_version(torch))
    return facts


def devices(torch):
    found = []
    for index in range(torch.cuda.device_count()):
        properties = torch.cuda.get_device_properties(index)
        found.append(
            {
                "index": index,
                "name": properties.name,
                "capability": [properties.major, properties.minor],
                "memory_bytes": int(properties.total_memory),
            }
        )
    return found


def nccl_version(torch):
    if not torch.cuda.is_available() and not getattr(torch.version, "cuda", None):
        raise RuntimeError("torch is not a CUDA build: no NCCL")
    version = torch.cuda.nccl.version()
    if isinstance(version, int):  # very old torch: 2708 means 2.7.8
        return [version // 1000, version // 100 % 10, version % 100]
    return list(version)


def ask(call):
    """A value, or {"error": ...} when torch cannot give it."""
    try:
        return call()
    except BaseException as exc:  # noqa: BLE001 - the reason is the fact
        return {"error": "{}: {}".format(type(exc).__name__, exc)}


def main(argv):
    if len(argv) < 2:
        sys.stderr.write("usage: probe.py OUTPUT.json [REQUEST-JSON]\n")
        return 2
    request = json.loads(argv[2]) if len(argv) > 2 else {}
    wants_dists = request.get("distributions", True) and metadata is not None
    dists = distributions(request.get("files_of", ()), request.get("every_file", False)) if wants_dists else None
    wants_torch = request.get("torch") and importlib.util.find_spec("torch") is not None
    facts = {
        "schema": SCHEMA,
        "python": {
            "executable": sys.executable,
            "version": platform.python_version(),
            "prefix": sys.prefix,
            "base_prefix": getattr(sys, "base_prefix", sys.prefix),
            "markers": marker_environment(),
        },
        "distributions": dists,
        "torch": torch_facts() if wants_torch else None,
    }
    tmp = argv[1] + ".part"
    with open(tmp, "w") as out:
        json.dump(facts, out)
    os.replace(tmp, argv[1])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
