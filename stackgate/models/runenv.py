"""Which of a run's environment variables a report records: those that explain the run, by value;
the rest by name only.

A server's environment holds whatever the shell that started stackgate held: cloud keys, database
passwords, tokens of other tools. None of that explains a run, and every copy of it (the smoke and
gate JSON, the kept runs, a bundle) is one more place it leaks from. What does explain a run: the
variables the lock sets (its ``[env]`` and smoke tables), the stack's own families (CUDA, NCCL,
torch, Triton, SGLang, FlashInfer, Hugging Face) and the search paths (``PATH``, ``LD_LIBRARY_PATH``,
``PYTHONPATH`` ...). Values recorded still go through :mod:`stackgate.models.redact` (``HF_TOKEN``
is recorded as set, its value hidden).
"""

from __future__ import annotations

from typing import Iterable, Mapping

__all__ = ["PREFIXES", "explains", "recorded"]

#: The families of variables the stack reads.
PREFIXES = ("CUDA_", "NCCL_", "TORCH_", "TRITON_", "SGLANG_", "FLASHINFER_", "HF_")
#: Loader variables that are not named like a search path but act as one.
_PATH_LIKE = frozenset({"LD_PRELOAD"})


def explains(name: str, named: Iterable[str] = ()) -> bool:
    """Whether a variable's value explains a run: the lock sets it, or it is of the stack's
    families, or it is a search path.

    >>> names = ("NCCL_DEBUG", "LD_LIBRARY_PATH", "PATH", "FOO", "AWS_SECRET_ACCESS_KEY", "X")
    >>> [n for n in names if explains(n, ("X",))]
    ['NCCL_DEBUG', 'LD_LIBRARY_PATH', 'PATH', 'X']
    """
    return name in set(named) or name.startswith(PREFIXES) or name.endswith("PATH") or name in _PATH_LIKE


def recorded(environ: Mapping[str, str], named: Iterable[str] = ()) -> tuple[dict[str, str], list[str]]:
    """The variables recorded with their values, and the names of the others (both sorted).

    >>> recorded({"PATH": "/bin", "FOO": "AKIAIOSFODNN7EXAMPLE", "TUNE": "1"}, named=("TUNE",))
    ({'PATH': '/bin', 'TUNE': '1'}, ['FOO'])
    """
    lock_set = set(named)
    kept = {name: environ[name] for name in sorted(environ) if explains(name, lock_set)}
    return kept, sorted(name for name in environ if name not in kept)
