"""The lock model: both shipped profiles load; every bad input is one clean LockError."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from packaging.version import Version

from stackgate.models.spec import Capability, SpecError, default_spec_path, load_spec, loads_spec

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = ROOT / "lockfiles" / "blackwell-sm120-cu130.toml"
HOPPER = ROOT / "lockfiles" / "hopper-sm90-cu130.toml"

MINIMAL = """
[stack]
name = "t"
[hardware]
gpu_count = 1
compute_capability = "9.0"
gpu_name = "H200"
min_driver = "580"
[[toolkit]]
version = "13.0"
prefix = "/usr/local/cuda-13.0"
keep = true
default = true
[python]
version = "3.12"
interpreter = "/usr/bin/python3"
[python.packages]
torch = "==2.11.0"
"""


def problems(text: str) -> list[str]:
    with pytest.raises(SpecError) as caught:
        loads_spec(text, path="bad.toml")
    return caught.value.problems


def test_the_default_profile_holds_every_value_facts_gives():
    spec = load_spec(DEFAULT)
    assert spec.name == "blackwell-sm120-cu130"
    assert (spec.hardware.gpu_count, spec.hardware.compute_capability, spec.hardware.arch) == (
        8,
        Capability(12, 0),
        "sm_120a",
    )
    assert spec.hardware.min_driver == Version("580.82.07")
    default, kept = spec.toolkits
    assert (default.version, default.nvcc, default.source, default.default) == (
        Version("13.0.1"),
        Version("13.0.88"),
        "pypi",
        True,
    )
    assert (kept.version, kept.keep, kept.prefix) == (Version("12.8"), True, Path("/usr/local/cuda-12.8"))
    pins = {p.name: p.pinned_version for p in spec.python.packages}
    assert pins["torch"] == "2.9.1+cu130" and pins["sgl-kernel"] == "0.3.21+cu130"
    assert pins["flashinfer-python"] == pins["flashinfer-cubin"] == "0.6.4"
    assert pins["sglang"] == "0.5.9" and pins["triton"] == "3.5.1" and pins["nvidia-nccl-cu13"] == "2.27.7"
    assert spec.python.package("sgl_kernel").url.startswith("https://github.com/sgl-project/whl/releases/")
    assert spec.python.frozen == ("torch", "torchaudio", "triton", "nvidia-nccl-cu13")
    assert spec.python.override("flashinfer_python").reason.startswith("sglang 0.5.9 pins")
    assert spec.env["CUDA_HOME"] == "/usr/local/cuda-13.0"
    assert spec.env["TRITON_PTXAS_PATH"] == "/usr/local/cuda-13.0/bin/ptxas"
    assert spec.nccl.min_version == Version("2.27.7")
    assert (spec.smoke.tp, spec.smoke.attention_backend, spec.smoke.port) == (8, "flashinfer", 30000)
    assert spec.smoke.evidence["--enable-flashinfer-allreduce-fusion"] == "FlashInfer workspace initialized for rank"
    assert (spec.benchmark.output_tokens, spec.benchmark.runs, spec.benchmark.warmup) == (2048, 5, 2)
    assert (spec.benchmark.baseline_tok_s, spec.benchmark.max_regression) == (92.6, 0.03)
    assert spec.python.target == Path("/opt/stackgate/current/bin/python")
    assert re.fullmatch(r"[0-9a-f]{64}", spec.sha256)


def test_the_hopper_profile_names_an_existing_interpreter():
    spec = load_spec(HOPPER)
    assert spec.python.root is None and spec.python.env_file is None
    assert spec.python.target == Path("/opt/torch/.venv/bin/python3")
    assert spec.python.package("torch").pinned_version == "2.11.0"
    assert spec.python.imports == ("torch", "torchvision", "torchaudio", "triton")
    assert (spec.hardware.compute_capability, spec.hardware.arch) == (Capability(9, 0), "sm_90a")


def test_pins_compare_under_pep_440_local_labels_included():
    torch = load_spec(DEFAULT).python.package("torch")
    assert torch.specifier.contains("2.9.1+cu130")
    assert not torch.specifier.contains("2.9.1")  # 2.9.1 is not 2.9.1+cu130
    assert not torch.specifier.contains("2.10.0")
    hopper = load_spec(HOPPER).python.package("torch")
    assert hopper.specifier.contains("2.11.0") and hopper.specifier.contains("2.11.0+cu130")


def test_environment_variable_names_the_default_lock(monkeypatch, tmp_path):
    monkeypatch.setenv("STACKGATE_LOCK", str(HOPPER))
    assert default_spec_path() == HOPPER
    monkeypatch.delenv("STACKGATE_LOCK")
    assert default_spec_path() == DEFAULT.resolve()  # the package's copy, which lockfiles/ links to


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (('torch = "==2.11.0"', 'torch = "=2.11.0"'), "python.packages.torch: invalid specifier '=2.11.0'"),
        (("gpu_count = 1", "gpu_count = true"), "hardware.gpu_count: must be an integer, not a boolean"),
        (("gpu_count = 1", "gpu_count = 0"), "hardware.gpu_count: must be greater than 0, not 0"),
        (
            ("gpu_count = 1", "gpu_count = 1\ngpu_cuont = 2"),
            "hardware.gpu_cuont: unknown key (did you mean 'gpu_count'?)",
        ),
        (
            ('compute_capability = "9.0"', 'compute_capability = "9"'),
            "hardware.compute_capability: invalid compute capability '9'",
        ),
        (('min_driver = "580"', 'min_driver = "r580"'), "hardware.min_driver: Invalid version"),
        (('prefix = "/usr/local/cuda-13.0"', 'prefix = "cuda-13.0"'), "toolkit[0].prefix: must be an absolute path"),
        (("keep = true\n", ""), "toolkit[0].source: missing: say how to install it"),
        (
            ("keep = true\n", 'keep = true\nsource = "pypi"\n'),
            "toolkit[0].source: a keep = true toolkit is never installed by stackgate",
        ),
        (
            ('interpreter = "/usr/bin/python3"', 'interpreter = "/usr/bin/python3"\nroot = "/opt/x"'),
            "python.root: set exactly one of root",
        ),
        (('version = "3.12"', 'version = "3"'), "python.version: must be a major.minor like '3.12'"),
        (('[stack]\nname = "t"', '[stack]\nname = "t"\n[stakc]'), "stakc: unknown key (did you mean 'stack'?)"),
        (('[stack]\nname = "t"', "[stack]"), "stack.name: missing (required)"),
    ],
)
def test_each_bad_value_is_named_by_its_key_path(edit, expected):
    old, new = edit
    assert old in MINIMAL
    found = problems(MINIMAL.replace(old, new, 1))
    assert any(p.startswith(expected) for p in found), found


def test_pypi_cannot_provide_a_cuda_12_toolkit():
    text = MINIMAL.replace("keep = true\n", 'source = "pypi"\n').replace(
        'version = "13.0"\nprefix', 'version = "12.8"\nprefix'
    )
    (problem,) = [p for p in problems(text) if p.startswith("toolkit[0].source")]
    assert "not the nvcc driver" in problem and "runfile" in problem


def test_every_problem_is_collected_at_once_with_the_file_name():
    text = MINIMAL.replace("gpu_count = 1", 'gpu_count = "one"').replace('torch = "==2.11.0"', 'torch = "latest"')
    with pytest.raises(SpecError) as caught:
        loads_spec(text, path="/x/bad.toml")
    message = str(caught.value)
    assert message.startswith("/x/bad.toml: 2 problems in the lockfile:")
    assert "hardware.gpu_count: must be an integer, not a string" in message
    assert "python.packages.torch: invalid specifier 'latest'" in message


def test_cross_references_are_checked():
    text = (
        MINIMAL
        + """
[python.guard]
frozen = ["triton"]
[[python.override]]
package = "flashinfer-python"
version = "==0.6.4"
reason = ""
[env]
CUDA_HOME = "{toolkit.defualt}"
[smoke]
flags = []
evidence = { "--enable-x" = "x ready" }
"""
    )
    found = problems(text)
    assert "python.guard.frozen[0]: 'triton' has no pin in python.packages: the guard needs a version to hold" in found
    assert "python.override[0].package: 'flashinfer-python' has no pin in python.packages" in found
    assert "python.override[0].reason: must say why the override is needed" in found
    assert any(p.startswith("env.CUDA_HOME: unknown reference {toolkit.defualt}") for p in found)
    assert (
        "smoke.evidence.--enable-x: is not one of smoke.flags: evidence is asked only of a flag that is passed" in found
    )


def test_references_resolve_against_the_default_toolkit():
    spec = loads_spec(MINIMAL + '[env]\nX = "{toolkit.default}/bin:{stack.name}"\n')
    assert spec.env["X"] == "/usr/local/cuda-13.0/bin:t"


def test_exactly_one_default_toolkit_and_the_second_is_named():
    two = MINIMAL + '[[toolkit]]\nversion = "12.8"\nprefix = "/usr/local/cuda-12.8"\nkeep = true\ndefault = true\n'
    assert problems(two) == [
        "toolkit[1].default: toolkit[0] is the default already: exactly one toolkit may have default = true"
    ]
    none = MINIMAL.replace("default = true\n", "")
    assert problems(none) == ["toolkit: exactly one toolkit must have default = true, found none"]


@pytest.mark.parametrize(
    "second",
    [
        "/usr/local/cuda-13.0",
        "/usr/local/cuda-13.0/",
        "/usr/local//cuda-13.0",
        "//usr/local/cuda-13.0",
        "/usr/local/x/../cuda-13.0",
    ],
)
def test_a_shared_prefix_names_the_toolkit_that_repeats_it(second):
    text = MINIMAL + f'[[toolkit]]\nversion = "12.8"\nprefix = "{second}"\nkeep = true\n'
    assert problems(text) == [
        "toolkit[1].prefix: /usr/local/cuda-13.0 is toolkit[0]'s prefix too: two toolkits cannot share a prefix"
    ]


def test_a_url_package_hash_is_64_hex_digits():
    text = MINIMAL.replace(
        'torch = "==2.11.0"', 'torch = "==2.11.0"\nx = { version = "==1", url = "https://h/x.whl", sha256 = "abc" }'
    )
    assert "python.packages.x.sha256: must be 64 lowercase hex digits, not 'abc'" in problems(text)


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b"\xff\xfe[stack]", "not UTF-8 text"),
        (b"[stack\nname=", "not valid TOML"),
        (b"", "stack: missing (required)"),
        (b"stack = 3", "stack: must be a table, not an integer"),
        (b"[[stack]]\nname='x'", "stack: must be a table, not an array"),
    ],
)
def test_broken_files_fail_cleanly(content, expected):
    with pytest.raises(SpecError) as caught:
        loads_spec(content, path="broken.toml")
    assert any(expected in p for p in caught.value.problems), caught.value.problems


def test_missing_and_unreadable_paths(tmp_path):
    with pytest.raises(SpecError, match="no such file"):
        load_spec(tmp_path / "absent.toml")
    with pytest.raises(SpecError, match="is a directory"):
        load_spec(tmp_path)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=400))
def test_any_bytes_give_a_lock_or_a_lock_error(data):
    try:
        loads_spec(data, path="fuzz.toml")
    except SpecError as exc:
        assert exc.problems and all(isinstance(p, str) for p in exc.problems)


_LINES = DEFAULT.read_text().splitlines()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.integers(0, len(_LINES) - 1),
    st.sampled_from(["delete", "duplicate", "truncate", "replace"]),
    st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=12),
)
def test_mutations_of_the_real_lockfile_never_raise_anything_else(index, action, text):
    lines = list(_LINES)
    if action == "delete":
        del lines[index]
    elif action == "duplicate":
        lines.insert(index, lines[index])
    elif action == "truncate":
        lines[index] = lines[index][: len(lines[index]) // 2]
    else:
        lines[index] = lines[index][:3] + text + lines[index][3:]
    try:
        loads_spec("\n".join(lines), path=DEFAULT)
    except SpecError as exc:
        assert exc.problems


_RICH = DEFAULT.read_text()
_ASSIGNMENTS = [i for i, line in enumerate(_RICH.splitlines()) if " = " in line and not line.startswith("#")]


def _toml(value) -> str:
    """A TOML inline value for any JSON-like value (None becomes an empty string)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return '""'
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml(x) for x in value) + "]"
    return "{" + ", ".join(f"{json.dumps(k)} = {_toml(x)}" for k, x in value.items()) + "}"


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(_ASSIGNMENTS),
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
        lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3),
        max_leaves=12,
    ),
)
def test_any_value_in_any_place_gives_a_lock_or_a_clean_error(index, value):
    lines = _RICH.splitlines()
    key = lines[index].split(" = ", 1)[0]
    lines[index] = f"{key} = {_toml(value)}"
    try:
        loads_spec("\n".join(lines))
    except SpecError as exc:
        assert exc.problems
