"""Import every check module so that the registry holds them all, in report order."""

from stackgate.checks import gpu, cuda, python, nccl, abi, patches  # noqa: F401  (registration)
from stackgate.checks.core import REGISTRY

__all__ = ["REGISTRY"]
