"""The ELF edge: which shared libraries a binary needs (its DT_NEEDED entries).

Reading the dynamic section is a few seeks into the file, so scanning every .so of a stack
costs milliseconds, not the gigabytes the files weigh.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from elftools.common.exceptions import ELFError
from elftools.elf.dynamic import DynamicSection
from elftools.elf.elffile import ELFFile

__all__ = ["CUDA_LIBRARIES", "ElfError", "cuda_majors", "needed"]

#: The CUDA libraries whose soname carries the CUDA major a binary was built against.
CUDA_LIBRARIES = ("cudart", "cublas", "cublasLt", "nvrtc", "cusparse", "cufft", "curand", "cusolver", "nvJitLink")
_CUDA_SONAME = re.compile(r"^lib(" + "|".join(CUDA_LIBRARIES) + r")\.so\.(\d+)")


class ElfError(Exception):
    """A file that is not a readable ELF binary."""


@dataclass(frozen=True)
class CudaNeed:
    library: str  #: e.g. libcudart.so.12
    major: int


def needed(path: Path | str) -> tuple[str, ...]:
    """The DT_NEEDED sonames of an ELF file, in the file's order."""
    try:
        with open(path, "rb") as stream:
            elf = ELFFile(stream)
            return tuple(
                tag.needed
                for section in elf.iter_sections()
                if isinstance(section, DynamicSection)
                for tag in section.iter_tags()
                if tag.entry.d_tag == "DT_NEEDED"
            )
    except (OSError, ELFError) as exc:
        raise ElfError(f"{path}: {exc}") from None


def cuda_majors(sonames: tuple[str, ...]) -> tuple[CudaNeed, ...]:
    """The CUDA libraries among ``sonames``, with the major each one names.

    >>> cuda_majors(("libc.so.6", "libcudart.so.12"))
    (CudaNeed(library='libcudart.so.12', major=12),)
    """
    found = []
    for soname in sonames:
        match = _CUDA_SONAME.match(soname)
        if match:
            found.append(CudaNeed(soname, int(match[2])))
    return tuple(found)
