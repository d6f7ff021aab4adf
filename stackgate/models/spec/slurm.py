"""The spec's ``[slurm]`` section: how node health acts under Slurm and how fleet steps ask for GPUs.

::

    [slurm]
    drain_after = 3              # consecutive failures of the same check before slurm-health drains (default 1)
    max_drained_share = 0.5      # the breaker: stackgate never drains more than this share of a partition
    revalidate = "verify"        # before a resume: "verify" (every check, nothing cached) or "deep" (verify --deep)
    gpus_per_node = 8            # fleet steps ask for this many GPUs per node (--gpus-per-node; default: none)
    container_image = "nvcr.io#nvidia/pytorch:25.01-py3"   # fleet steps run inside it (pyxis: srun --container-image)
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from stackgate.models.spec.reader import Table

__all__ = ["REVALIDATIONS", "Slurm"]

#: What a node stackgate drained must pass before it is resumed.
REVALIDATIONS = ("verify", "deep")
#: A container image as pyxis takes it (``[USER@][REGISTRY#]IMAGE[:TAG]``, or an absolute .sqsh path).
_IMAGE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/@#:+-]{0,254}$|^/[A-Za-z0-9._/+-]{1,254}$")


@dataclass(frozen=True)
class Slurm:
    drain_after: int = 1
    max_drained_share: float = 0.5
    revalidate: str = "verify"
    gpus_per_node: int | None = None
    container_image: str | None = None

    @classmethod
    def _from_table(cls, t: Table) -> Slurm:
        share = t.positive("max_drained_share", float, cls.max_drained_share)
        if share is not None and share > 1:
            t.error("max_drained_share", f"must be a share of the partition, at most 1, not {share:g}")
            share = None
        revalidate = t.get("revalidate", str, cls.revalidate)
        if revalidate is not None:
            t.choice("revalidate", revalidate, REVALIDATIONS)
        image = t.get("container_image", str, None)
        if image is not None and not _IMAGE.match(image):
            t.error("container_image", f"{image!r} is not a container image name (pyxis: [REGISTRY#]IMAGE[:TAG])")
            image = None
        section = cls(
            drain_after=t.positive("drain_after", int, cls.drain_after) or cls.drain_after,
            max_drained_share=share or cls.max_drained_share,
            revalidate=revalidate if revalidate in REVALIDATIONS else cls.revalidate,
            gpus_per_node=t.positive("gpus_per_node", int, None),
            container_image=image,
        )
        t.finish()
        return section
