"""Import every check module so that the registry holds them all, in report order."""

from stackgate.checks import gpu, cuda, python, nccl, abi, patches, deep  # noqa: F401  (registration; deep's are slow)
from stackgate.checks.core import REGISTRY

__all__ = ["REGISTRY"]
