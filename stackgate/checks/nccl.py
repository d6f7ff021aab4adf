"""Check of the NCCL library torch loads."""

from __future__ import annotations

from packaging.version import Version

from stackgate.checks.core import check
from stackgate.checks.unexplained import missing_piece, unexplained
from stackgate.facts import Facts, Missing
from stackgate.models.finding import Fix
from stackgate.models.result import Result, failed, passed, skipped
from stackgate.models.spec import Spec

__all__: list[str] = []

_PROVISION = "stackgate provision --only python"


@check("nccl.version", needs=("probe",))
def version(spec: Spec, facts: Facts) -> Result:
    """The NCCL torch loads is at least the locked minimum and is the installed nvidia-nccl."""
    probe = facts.probe
    if isinstance(probe, Missing):
        return skipped("no probe of the stack's interpreter (see python.interpreter)", [probe.reason])
    torch = probe.torch
    if not torch or not torch["imported"] or not torch["cuda"]:
        return skipped("torch is not an importable CUDA build (see torch.build): no NCCL to check")
    loaded = torch["nccl_version"]
    if isinstance(loaded, dict):
        summary = f"torch cannot load NCCL: {loaded['error']}"
        missing = missing_piece(loaded["error"])
        if missing is not None:
            fix = Fix(f"{missing} is not installed: install torch with its nvidia-nccl dependency.", (_PROVISION,))
            return failed(summary, fix=fix)
        look = Fix(
            "Load NCCL by hand in the stack's interpreter to see the whole error.",
            (f"{spec.python.target} -c 'import torch; print(torch.cuda.nccl.version())'",),
        )
        return unexplained(failed(summary, fix=look), facts, loaded["error"])
    have = Version(".".join(str(part) for part in loaded))
    dist = probe.dist(f"nvidia-nccl-cu{torch['cuda'].split('.')[0]}")
    data = {
        "loaded": str(have),
        "distribution": f"{dist.name} {dist.version}" if dist else None,
        "min_version": str(spec.nccl.min_version) if spec.nccl.min_version else None,
    }
    want = spec.nccl.min_version
    if want and have < want:
        return failed(
            f"torch loads NCCL {have}, older than the locked minimum {want}",
            fix=Fix("Install the locked nvidia-nccl distribution.", ("stackgate provision --only python",)),
            data=data,
        )
    if dist and Version(dist.version).release[:3] != have.release[:3]:
        return failed(
            f"torch loads NCCL {have} but {dist.name} {dist.version} is installed: another libnccl is found first",
            ["Look for a libnccl.so.2 on LD_LIBRARY_PATH or in torch/lib that shadows the distribution's."],
            Fix(
                "Remove the other libnccl from the library path.",
                ("python -c 'import torch; print(torch.cuda.nccl.version())'",),
            ),
            data,
        )
    return passed(
        f"NCCL {have}" + (f" from {dist.name} {dist.version}" if dist else "") + (f" (>= {want})" if want else ""),
        data=data,
    )
