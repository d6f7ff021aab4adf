"""What is installed at a CUDA toolkit's prefix: nvcc's and ptxas's versions, version.json, and
whether ptxas assembles for the GPU's arch (no GPU needed)."""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path

from packaging.version import Version

from stackgate.edges import runner
from stackgate.facts.values import ArchBuild, Missing, ToolkitFacts, ToolVersion
from stackgate.models.spec import Toolkit

__all__ = ["TOOL_TIMEOUT_S", "build_for_arch", "inspect_toolkit", "tool_version"]

TOOL_TIMEOUT_S = 60.0
_RELEASE = re.compile(r"release (\d+\.\d+), V(\d+\.\d+\.\d+)")


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
        Missing(ptxas.reason) if isinstance(ptxas, Missing) else build_for_arch(prefix / "bin" / "ptxas", arch),
    )


def tool_version(path: Path) -> ToolVersion | Missing:
    """The "release X.Y, VX.Y.Z" that nvcc and ptxas print."""
    if not path.exists():
        return Missing(f"{path} does not exist")
    done = runner.run([path, "--version"], timeout_s=TOOL_TIMEOUT_S)
    if not done.ok:
        return Missing(f"{path} --version failed ({done.ended}): {' '.join(done.tail(2))}")
    match = _RELEASE.search(done.stdout)
    if not match:
        return Missing(f"{path} --version printed no 'release X.Y, VX.Y.Z' line")
    return ToolVersion(path, match[1], Version(match[2]))


# The lowest PTX ISA that knows each arch, so that an older ptxas is not refused for the .version.
_PTX_ISA = {
    "sm_120": "8.7",
    "sm_121": "8.8",
    "sm_100": "8.6",
    "sm_101": "8.6",
    "sm_103": "8.8",
    "sm_90": "8.0",
    "sm_89": "7.8",
}
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
