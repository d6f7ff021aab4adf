"""Import every check module so that the registry holds them all, in report order."""

# Registration order is the report's order (and deep's slow checks come last): keep it as written.
# isort: off
# Imported for their registration; deep's checks are slow, so they register last.
from stackgate.checks import gpu, cuda, python, nccl, abi, patches, environment, fusiongate, deep  # noqa: F401

# isort: on
from stackgate.checks.core import REGISTRY

__all__ = ["REGISTRY"]
