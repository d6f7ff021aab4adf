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

#: The CUDA libraries whose soname tells the CUDA major a binary was built against. Most carry
#: the CUDA major itself; cuFFT and cuSOLVER number their own (CUDA 12 ships .so.11, CUDA 13
#: .so.12). cuSPARSE (.so.12) and cuRAND (.so.10) keep one soname across CUDA 12 and 13, so they
#: tell nothing: PyPI's torch 2.11.0+cu130 links libcusparse.so.12 and libcurand.so.10, rightly.
CUDA_LIBRARIES = ("cudart", "cublas", "cublasLt", "nvrtc", "nvJitLink", "cupti", "cufft", "cusolver")
_OWN_NUMBERING = {"cufft": {11: 12, 12: 13}, "cusolver": {11: 12, 12: 13}}
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
                tag.needed  # type: ignore[attr-defined]  # pyelftools sets DT_NEEDED's value by setattr, undeclared in its types
                for section in elf.iter_sections()
                if isinstance(section, DynamicSection)
                for tag in section.iter_tags()
                if tag.entry.d_tag == "DT_NEEDED"
            )
    except (OSError, ELFError) as exc:
        raise ElfError(f"{path}: {exc}") from None


def cuda_majors(sonames: tuple[str, ...]) -> tuple[CudaNeed, ...]:
    """The CUDA libraries among ``sonames``, with the CUDA major each one implies.

    >>> cuda_majors(("libc.so.6", "libcudart.so.12", "libcufft.so.12", "libcusparse.so.12"))
    (CudaNeed(library='libcudart.so.12', major=12), CudaNeed(library='libcufft.so.12', major=13))
    """
    found = []
    for soname in sonames:
        match = _CUDA_SONAME.match(soname)
        if not match:
            continue
        library, number = match[1], int(match[2])
        major = _OWN_NUMBERING[library].get(number) if library in _OWN_NUMBERING else number
        if major is not None:
            found.append(CudaNeed(soname, major))
    return tuple(found)
