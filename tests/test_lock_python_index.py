"""The lock fields provision added: python.default_index, and pins for every index-mapped name."""

from __future__ import annotations

from pathlib import Path

import pytest
from specs import write_spec

from stackgate.models.spec import Spec, SpecError, load_spec

INDEX = """[[python.index]]
url = "https://download.pytorch.org/whl/cu130"
packages = ["torch", "torchvision"]
[python.packages]
torch = "==2.9.1+cu130"
"""


def _load(tmp_path: Path, extra: str = "", pins: str = 'torchvision = "==0.24.1+cu130"') -> Spec:
    path = tmp_path / "lock.toml"
    write_spec(path, gpu_name="x", root="/opt/stackgate", python=f"{extra}\n", tail=f"{INDEX}{pins}\n")
    return load_spec(path)


def test_the_default_index_is_pypi_unless_the_lock_names_a_mirror(tmp_path: Path) -> None:
    assert _load(tmp_path).python.default_index == "https://pypi.org/simple"
    assert (
        _load(tmp_path, 'default_index = "https://mirror.example/simple"').python.default_index
        == "https://mirror.example/simple"
    )


def test_a_default_index_that_is_not_a_url_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SpecError) as caught:
        _load(tmp_path, 'default_index = "pypi.org"')
    assert caught.value.problems == [
        (
            "python.default_index: must be an https:// URL or a file:// URL (http:// only to localhost or a loopback "
            "IP), "
            "not 'pypi.org'"
        )
    ]


def test_an_index_mapped_name_without_a_pin_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SpecError) as caught:
        _load(tmp_path, pins="")
    assert caught.value.problems == [
        (
            "python.index[0].packages[1]: 'torchvision' has no pin in python.packages: provision installs from this "
            "index "
            "only what the lock pins"
        )
    ]


def test_the_shipped_lockfiles_still_load(tmp_path: Path) -> None:
    specs = [
        p
        for p in sorted((Path(__file__).resolve().parents[1] / "lockfiles").glob("*.toml"))
        if not p.name.startswith("pylock.")
    ]  # pylocks: tests/test_pylock.py
    assert len(specs) >= 3
    for path in specs:
        assert load_spec(path).python.default_index == "https://pypi.org/simple"
