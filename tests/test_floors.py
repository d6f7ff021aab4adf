"""The dependency floors of pyproject.toml are true: what the code uses of a dependency exists
in its lowest allowed version. `.ci/run` installs those versions (uv's lowest-direct resolution)
and runs these with the floor subset; under the newest versions they pass as well."""

from __future__ import annotations

import re

import pynvml
from fakes import fake_nvml
from support import ROOT


def test_every_nvml_name_the_code_uses_exists_in_nvidia_ml_py_and_in_the_fake():
    # No GPU here, so the tests speak to the fake NVML; only this says the real module has them.
    used = set(re.findall(r"\blib\.(\w+)", (ROOT / "stackgate" / "edges" / "nvml.py").read_text()))
    assert {"nvmlInit", "nvmlDeviceGetGpuMaxPcieLinkGeneration", "NVMLError"} <= used
    assert sorted(n for n in used if not hasattr(pynvml, n)) == []
    assert sorted(n for n in used if not hasattr(fake_nvml, n)) == []


def test_invoke_gives_tasks_the_text_after_a_double_dash():
    """`invoke report -- -2 -1` reads ``c.remainder``, which invoke 2.x does not have."""
    from invoke import Context

    assert Context(remainder="-2 -1").remainder == "-2 -1"
    assert re.search(r"c\.remainder\b", (ROOT / "stackgate" / "tasks.py").read_text())
