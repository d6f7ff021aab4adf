"""The spec (the lockfile): TOML -> frozen, typed dataclasses, every problem with its key path.

- :mod:`.model`: the dataclasses, each section built from its table beside it;
- :mod:`.reader`: the TOML table reader (typed getters that collect errors) and :class:`SpecError`;
- :mod:`.rules`: URLs, ``$`` references in environment values, patch locations;
- :mod:`.files`: where a spec is found (the default lock, the shipped profiles) and the loaders.
"""

from __future__ import annotations

from stackgate.models.spec.accuracy import Accuracy
from stackgate.models.spec.locate import (
    DEFAULT_SPEC,
    LOCAL_SPEC,
    SYSTEM_SPEC,
    default_spec_path,
    edit_hint,
    find_local,
    found_spec_path,
    is_shipped,
    load_spec,
    loads_spec,
    read_only_problem,
    spec_command,
)
from stackgate.models.spec.model import (
    DEFAULT_EVIDENCE,
    MAX_JIT_TIMEOUT_S,
    PYPI_CUDA12_REASON,
    Benchmark,
    Capability,
    DeepAttention,
    Override,
    Package,
    Patch,
    Python,
    Smoke,
    Spec,
    Speculative,
    Toolkit,
)
from stackgate.models.spec.reader import SpecError, read_toml
from stackgate.models.spec.rules import SHELL_REFERENCE, patch_location_problem, url_problem

__all__ = [
    "DEFAULT_EVIDENCE",
    "DEFAULT_SPEC",
    "LOCAL_SPEC",
    "MAX_JIT_TIMEOUT_S",
    "PYPI_CUDA12_REASON",
    "SHELL_REFERENCE",
    "SYSTEM_SPEC",
    "Accuracy",
    "Benchmark",
    "Capability",
    "DeepAttention",
    "Override",
    "Package",
    "Patch",
    "Python",
    "Smoke",
    "Spec",
    "SpecError",
    "Speculative",
    "Toolkit",
    "default_spec_path",
    "edit_hint",
    "find_local",
    "found_spec_path",
    "is_shipped",
    "load_spec",
    "loads_spec",
    "patch_location_problem",
    "read_only_problem",
    "spec_command",
    "read_toml",
    "url_problem",
]
