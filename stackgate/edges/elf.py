"""The ELF edge: which shared libraries a binary needs (its DT_NEEDED entries).

Reading the dynamic section is a few seeks into the file, so scanning every .so of a stack
costs milliseconds, not the gigabytes the files weigh.
"""

from __future__ import annotations

import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path

__all__ = ["CUDA_LIBRARIES", "ElfError", "cuda_majors", "damaged", "needed"]

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
    # pyelftools is imported here, not with the module: a cached verify (which reads no ELF file) never pays for it.
    from elftools.common.exceptions import ELFError
    from elftools.elf.dynamic import DynamicSection
    from elftools.elf.elffile import ELFFile

    try:
        with open(path, "rb") as stream:
            elf = ELFFile(stream)
            return tuple(
                # pyelftools sets DT_NEEDED's value by setattr, undeclared in its types
                tag.needed  # type: ignore[attr-defined]
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


def damaged(path: Path | str) -> str | None:
    """Why an ELF file is cut short (what a killed build or a full disk leaves), or None when its headers, section
    table and segments all lie inside it. Reads the headers only: what the loader maps, not what it means."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as stream:
            head = stream.read(64)
            if len(head) < 52 or head[:4] != b"\x7fELF" or head[4] not in (1, 2) or head[5] not in (1, 2):
                return f"not an ELF file ({size} bytes)"
            order = "<" if head[5] == 1 else ">"
            wide = head[4] == 2
            phoff, shoff = struct.unpack_from(order + ("QQ" if wide else "II"), head, 32 if wide else 28)
            phentsize, phnum, shentsize, shnum = struct.unpack_from(order + "HHxxHH", head, 54 if wide else 42)
            if shoff + shnum * shentsize > size:
                return f"its section table ends at byte {shoff + shnum * shentsize}, past its {size} bytes: cut short"
            stream.seek(phoff)
            table = stream.read(phnum * phentsize)
    except OSError as exc:
        return f"unreadable: {exc}"
    for i in range(phnum if len(table) == phnum * phentsize else 0):
        offset, filesz = struct.unpack_from(order + ("8xQ16xQ" if wide else "4xI8xI"), table, i * phentsize)
        if offset + filesz > size:
            return f"segment {i} ends at byte {offset + filesz}, past its {size} bytes: cut short"
    return None
