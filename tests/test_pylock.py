"""The pylock model: PEP 751 files read through packaging.pylock, hostile ones refused with their
key path, and the spec's inputs that say whether a pylock is current."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from packaging.pylock import Pylock

from stackgate.models import pylock
from stackgate.models.spec import SpecError, load_spec

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
SPEC = load_spec(ROOT / "lockfiles" / "blackwell-sm120-cu128.toml")
TORCH = "https://files.pythonhosted.org/packages/ab/cd/torch-2.9.1-cp312-cp312-manylinux_2_28_x86_64.whl"
KERNEL = "https://github.com/sgl-project/whl/releases/download/v0.3.21/sgl_kernel-0.3.21%2Bcu130-cp310-abi3-manylinux2014_x86_64.whl"
BODY = f'''lock-version = "1.0"
created-by = "uv"
requires-python = ">=3.12"

[[packages]]
name = "torch"
version = "2.9.1"
wheels = [{{ url = "{TORCH}", size = 1, hashes = {{ sha256 = "{"a" * 64}" }} }}]

[[packages]]
name = "sgl-kernel"
version = "0.3.21+cu130"
marker = "sys_platform == 'linux'"
archive = {{ url = "{KERNEL}", hashes = {{ sha256 = "{"b" * 64}" }} }}
'''


def _loads(text: str, name: str = "pylock.spec.toml") -> pylock.Resolution:
    return pylock.loads(text.encode(), Path("/x") / name)


def test_the_shipped_pylock_is_valid_pep_751_and_matches_its_spec() -> None:
    resolution = pylock.load(pylock.path_for(SPEC.path))
    assert resolution.path.name == "pylock.blackwell-sm120-cu128.toml"
    assert len(resolution.packages) >= 100 and all(len(f.sha256) == 64 for f in resolution.files)
    assert dict(resolution.inputs) == pylock.inputs(SPEC)
    assert pylock.differences(SPEC, resolution) == []
    assert resolution.requires_python == ">=3.12"


def test_a_stamped_pylock_records_the_specs_inputs_and_reads_back() -> None:
    text = pylock.stamp(BODY, SPEC)
    assert text.startswith(
        "# The resolution of blackwell-sm120-cu128.toml (PEP 751), written by `stackgate lock`: do not edit.\n"
    )
    resolution = _loads(text)
    assert resolution.inputs["python.packages.sglang"] == "==0.5.9"
    assert resolution.inputs["python.platform"] == "x86_64-manylinux_2_28"
    kernel = resolution.package("SGL_Kernel")
    assert kernel is not None and kernel.archive is not None
    assert kernel.archive.filename == "sgl_kernel-0.3.21+cu130-cp310-abi3-manylinux2014_x86_64.whl"  # percent-decoded
    assert (kernel.marker, kernel.wheels) == ('sys_platform == "linux"', ())


def test_the_installers_pylock_is_pep_751_too_with_local_files_by_path() -> None:
    resolution = _loads(pylock.stamp(BODY, SPEC))
    text = pylock.install_text(
        resolution, {"b" * 64: Path("/srv/wheel house/sgl_kernel-0.3.21+cu130-cp310-abi3-manylinux2014_x86_64.whl")}
    )
    document = tomllib.loads(text)
    Pylock.from_dict(document)  # packaging's own validation
    torch, kernel = sorted(document["packages"], key=lambda p: p["name"], reverse=True)
    assert torch["wheels"] == [{"url": TORCH, "hashes": {"sha256": "a" * 64}}]
    assert kernel["archive"] == {
        "path": "/srv/wheel house/sgl_kernel-0.3.21+cu130-cp310-abi3-manylinux2014_x86_64.whl",
        "hashes": {"sha256": "b" * 64},
    }
    assert kernel["marker"] == 'sys_platform == "linux"'


HOSTILE = [
    (
        lambda t: t.replace(TORCH, TORCH.replace("https://", "http://")),
        "packages[0].wheels[0].url: plain http to files.pythonhosted.org: use https",
    ),
    (lambda t: t.replace(TORCH, TORCH + " --index-url https://evil"), "packages[0].wheels[0]"),
    (
        lambda t: t.replace(TORCH, TORCH.replace("torch-2.9.1", "torch-2.9.1\\u001b[2J")),
        "contains a control character (U+001B)",
    ),
    (
        lambda t: t.replace(f'sha256 = "{"a" * 64}"', 'md5 = "00"'),
        "packages[0].wheels[0].hashes: needs a sha256 of 64 lowercase hex digits (found: md5)",
    ),
    (
        lambda t: t.replace(f'sha256 = "{"a" * 64}"', 'sha256 = "A"'),
        "packages[0].wheels[0].hashes: needs a sha256 of 64 lowercase hex digits (found: sha256)",
    ),
    (lambda t: t.replace('version = "2.9.1"', 'version = "two"'), "packages[0].version: Invalid version: 'two'"),
    (
        lambda t: t.replace('name = "torch"', 'name = "Torch Evil"'),
        "packages[0].name: Name 'Torch Evil' is not normalized",
    ),
    (
        lambda t: t.replace('lock-version = "1.0"', 'lock-version = "2.0"'),
        "lock-version: pylock version 2.0 is not supported",
    ),
    (
        lambda t: t.replace("archive = {", "sdist = {").replace(
            "%2Bcu130-cp310-abi3-manylinux2014_x86_64.whl", "%2Bcu130.tar.gz"
        ),
        "packages[1]: sgl-kernel has no wheel: stackgate installs hashed wheels only",
    ),
    (
        lambda t: t.replace("%2Bcu130-cp310-abi3-manylinux2014_x86_64.whl", "%2Bcu130.tar.gz"),
        "packages[1].archive: 'sgl_kernel-0.3.21+cu130.tar.gz' is not a wheel",
    ),
    (
        lambda t: (
            t
            + '\n[[packages]]\nname = "torch"\nversion = "2.9.1"\n'
            + f'wheels = [{{ url = "{TORCH}", hashes = {{ sha256 = "{"a" * 64}" }} }}]\n'
        ),
        "packages[2]: torch is listed twice",
    ),
    (
        lambda t: t.replace("[tool.stackgate.inputs]", "[tool.other]"),
        "tool.stackgate.inputs: missing: this pylock was not made by `stackgate lock`",
    ),
    (lambda t: t + "[[packages", "not valid TOML"),
]


@pytest.mark.parametrize(("mutate", "expected"), HOSTILE)
def test_a_hostile_or_broken_pylock_is_refused_with_its_key_path(mutate, expected: str) -> None:  # type: ignore[no-untyped-def]
    text = mutate(pylock.stamp(BODY, SPEC))
    with pytest.raises(pylock.PylockError) as caught:
        _loads(text)
    assert isinstance(caught.value, SpecError)  # a bad lockfile: exit 2, nothing done
    assert any(expected in problem for problem in caught.value.problems), caught.value.problems
    assert str(caught.value).startswith("/x/pylock.spec.toml: ") and " in the pylock:\n  " in str(caught.value)


def test_a_pylock_needs_a_pep_751_file_name() -> None:
    with pytest.raises(pylock.PylockError) as caught:
        _loads(pylock.stamp(BODY, SPEC), name="spec.pylock.toml")
    assert caught.value.problems == [
        "(file name): 'spec.pylock.toml' is not a PEP 751 name: pylock.toml or pylock.<name>.toml"
    ]
    assert pylock.path_for(Path("lockfiles/a.b.toml")).name == "pylock.a-b.toml"  # <name> holds no dot


def test_differences_name_changed_inputs_then_what_the_pylock_does_not_hold() -> None:
    resolution = _loads(pylock.stamp(BODY, SPEC))
    assert pylock.differences(SPEC, resolution) == [
        "python.packages.torchaudio: ==2.9.1 in the spec, torchaudio not in the pylock",
        "python.packages.torchvision: ==0.24.1 in the spec, torchvision not in the pylock",
        "python.packages.triton: ==3.5.1 in the spec, triton not in the pylock",
        "python.packages.nvidia-nccl-cu12: ==2.27.5 in the spec, nvidia-nccl-cu12 not in the pylock",
        "python.packages.flashinfer-python: ==0.6.3 in the spec, flashinfer-python not in the pylock",
        "python.packages.flashinfer-cubin: ==0.6.3 in the spec, flashinfer-cubin not in the pylock",
        "python.packages.sglang: ==0.5.9 in the spec, sglang not in the pylock",
    ]  # a pylock edited by hand: its recorded inputs agree, its packages do not (==0.3.21 admits 0.3.21+cu130: PEP 440)
