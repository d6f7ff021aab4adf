"""The ABI checks on real ELF files built with gcc: the static CUDA-major link check, and the
import classifier on real extension modules that fail the way broken stacks fail."""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from support import install_dist, interpreter_lock, make_venv

from stackgate.checks.all import REGISTRY
from stackgate.edges import elf
from stackgate.facts import Missing, gather, interpreters
from stackgate.models.result import Status
from stackgate.models.spec import Spec
from stackgate.scan.extract import symbol_provider

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
VERSION = f"{sys.version_info.major}.{sys.version_info.minor}"
MANGLED = "_ZN3c104cuda9SetDeviceEab"  # c10::cuda::SetDevice(signed char, bool), a torch symbol


def gcc(out: Path, source: str, *args: str) -> Path:
    src = out.with_suffix(".c")
    src.write_text(source)
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(out), str(src), *args], check=True, capture_output=True)
    return out


def fake_cudart(folder: Path, major: int) -> Path:
    """A library whose soname is the CUDA runtime's: what an extension built for CUDA `major` needs."""
    folder.mkdir(parents=True, exist_ok=True)
    return gcc(
        folder / f"libcudart.so.{major}",
        "int cudaGetDeviceCount(int *n) { *n = 0; return 0; }\n",
        f"-Wl,-soname,libcudart.so.{major}",
    )


def extension(folder: Path, name: str, body: str, *args: str) -> Path:
    """A real CPython extension module."""
    include = sysconfig.get_paths()["include"]
    source = f"""
#include <Python.h>
{body}
static struct PyModuleDef def = {{PyModuleDef_HEAD_INIT, "{name}", NULL, -1, NULL}};
PyMODINIT_FUNC PyInit_{name}(void) {{ touch(); return PyModule_Create(&def); }}
"""
    return gcc(folder / f"{name}.so", source, f"-I{include}", *args)


def spec_for(python: Path, packages: str, imports: str = "[]") -> Spec:
    return interpreter_lock(python, packages, imports=imports)


def run(name, spec):
    facts = gather(spec, REGISTRY[name].needs, environ={"PATH": "/usr/bin:/bin"})
    try:
        return REGISTRY[name].function(spec, facts)
    finally:
        facts.close()


def test_needed_entries_are_read_from_a_real_elf(tmp_path):
    cudart = fake_cudart(tmp_path / "lib", 12)
    ops = gcc(
        tmp_path / "ops.so",
        "int cudaGetDeviceCount(int*); int f(void) { int n; return cudaGetDeviceCount(&n); }\n",
        f"-L{cudart.parent}",
        "-l:libcudart.so.12",
    )
    assert "libcudart.so.12" in elf.needed(ops)
    assert elf.cuda_majors(elf.needed(ops)) == (elf.CudaNeed("libcudart.so.12", 12),)
    with pytest.raises(elf.ElfError):
        elf.needed(tmp_path / "ops.c")


def test_a_package_linking_cuda_12_beside_a_cuda_13_stack_fails_by_file(tmp_path):
    python, site = make_venv(tmp_path / "venv")
    cuda12, cuda13 = fake_cudart(tmp_path / "cu12", 12), fake_cudart(tmp_path / "cu13", 13)
    code = "int cudaGetDeviceCount(int*); int f(void) { int n; return cudaGetDeviceCount(&n); }\n"
    bad = gcc(tmp_path / "common_ops.abi3.so", code, f"-L{cuda12.parent}", "-l:libcudart.so.12").read_bytes()
    good = gcc(tmp_path / "flashinfer_ops.so", code, f"-L{cuda13.parent}", "-l:libcudart.so.13").read_bytes()
    install_dist(
        site, "sgl-kernel", "0.3.21", files={"sgl_kernel/common_ops.abi3.so": bad, "sgl_kernel/__init__.py": b""}
    )
    install_dist(site, "flashinfer-python", "0.6.4", files={"flashinfer/ops.so": good})
    result = run("abi.elf", spec_for(python, 'sgl-kernel = "==0.3.21"\nflashinfer-python = "==0.6.4"'))
    assert result.status is Status.FAIL
    assert result.details == ("sgl_kernel/common_ops.abi3.so (sgl-kernel) links libcudart.so.12",)
    assert result.summary.startswith("1 shared object(s) link CUDA 12 libraries but torch is CUDA 13.0")
    assert "CUDA 13.0 build of sgl-kernel" in result.fix.text
    fixed = run("abi.elf", spec_for(python, 'flashinfer-python = "==0.6.4"'))
    assert fixed.status is Status.PASS and fixed.summary == (
        "1 shared object(s) scanned, 1 link CUDA, all CUDA 13; 2 of the stack checked whole"
    )


def test_an_undefined_torch_symbol_is_an_abi_mismatch_named_readably(tmp_path):
    python, site = make_venv(tmp_path / "venv")
    extension(site, "sgl_kernel_stub", f"extern void {MANGLED}(void); static void touch(void) {{ {MANGLED}(); }}")
    result = run("abi.imports", spec_for(python, "", '["sgl_kernel_stub"]'))
    assert result.status is Status.FAIL
    (detail,) = result.details
    assert detail.startswith(
        "import sgl_kernel_stub: undefined symbol c10::cuda::SetDevice(signed char, bool): ABI mismatch with torch"
    )
    assert result.fix.commands[0].startswith("stackgate provision --only python")


def test_a_missing_cuda_12_runtime_is_a_cuda_major_mismatch(tmp_path):
    python, site = make_venv(tmp_path / "venv")
    cudart = fake_cudart(tmp_path / "cu12", 12)  # linked at build time, absent at run time
    extension(
        site,
        "needs_cuda12",
        "int cudaGetDeviceCount(int*); static void touch(void) { int n; cudaGetDeviceCount(&n); }",
        f"-L{cudart.parent}",
        "-l:libcudart.so.12",
    )
    result = run("abi.imports", spec_for(python, "", '["needs_cuda12"]'))
    assert result.status is Status.FAIL
    (detail,) = result.details
    assert "libcudart.so.12: cannot open shared object file" in detail
    assert "built against CUDA 12 (libcudart.so.12)" in detail
    finding = result.data["needs_cuda12"]["finding"]  # the knowledge base's finding, in its one form
    assert (
        finding["id"] == "cuda-major-mismatch"
        and finding["evidence"]["file"] == "import needs_cuda12"
        and finding["values"]["lib"] == "libcudart.so.12"
    )


def test_imports_that_work_pass_with_their_times(tmp_path):
    python, site = make_venv(tmp_path / "venv")
    (site / "fine.py").write_text("x = 1\n")
    result = run("abi.imports", spec_for(python, "", '["fine", "json"]'))
    assert result.status is Status.PASS and result.summary.startswith("2 module(s) import (fine ")


def test_an_import_that_hangs_is_reported_as_a_timeout(tmp_path, monkeypatch):
    python, site = make_venv(tmp_path / "venv")
    (site / "hangs.py").write_text("import time\ntime.sleep(60)\n")
    monkeypatch.setenv("STACKGATE_IMPORT_TIMEOUT_S", "1")  # read when the import runs
    result = run("abi.imports", spec_for(python, "", '["hangs"]'))
    assert result.status is Status.FAIL and "import hangs: timed out after" in result.details[0]


@pytest.mark.parametrize(
    ("symbol", "provider"),
    [
        ("_ZN3c104cuda9SetDeviceEab", "torch (libc10.so / libtorch*.so)"),
        ("at::Tensor::add(int)", "torch (libc10.so / libtorch*.so)"),
        ("_ZN10flashinfer3fooEv", "flashinfer"),
        ("ncclCommInitRank", "NCCL (libnccl.so)"),
        ("curandCreateGenerator", "cuRAND (libcurand.so)"),
        ("zzz::f()", "the library it was built against"),
    ],
)
def test_symbol_providers_are_the_knowledge_bases(symbol, provider):
    """abi.imports names a symbol's provider from the finding, so verify and diagnose read one table."""
    assert symbol_provider(f"x.so: undefined symbol: {symbol}", {})["provider"] == provider


def test_cuda_13_libraries_with_their_own_numbering_are_not_mismatches():
    # DT_NEEDED of PyPI's torch 2.11.0+cu130 torch/lib/libtorch_cuda.so and libtorch_cuda_linalg.so,
    # as read on the H200 machine: cuSPARSE and cuRAND keep .so.12/.so.10 across CUDA 12 and 13,
    # cuFFT 12 and cuSOLVER 12 are CUDA 13's.
    needed = (
        "libcudart.so.13",
        "libcusparse.so.12",
        "libcufft.so.12",
        "libcurand.so.10",
        "libcusolver.so.12",
        "libcublas.so.13",
        "libcublasLt.so.13",
        "libnccl.so.2",
    )
    assert {n.major for n in elf.cuda_majors(needed)} == {13}
    # CUDA 12's cuFFT and cuSOLVER are .so.11: a CUDA 12 build.
    assert [n.major for n in elf.cuda_majors(("libcufft.so.11", "libcusolver.so.11"))] == [12, 12]


def test_a_package_shadowed_through_pythonpath_names_the_file_and_the_variable(tmp_path):
    python, site = make_venv(tmp_path / "venv")
    (site / "triton").mkdir()
    (site / "triton" / "__init__.py").write_text("x = 1\n")
    shadow = tmp_path / "shadow"
    (shadow / "triton").mkdir(parents=True)
    (shadow / "triton" / "__init__.py").write_text('raise ImportError("shadowed triton for the test")\n')
    spec = spec_for(python, "", '["triton"]')
    facts = gather(spec, REGISTRY["abi.imports"].needs, environ={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(shadow)})
    try:
        result = REGISTRY["abi.imports"].function(spec, facts)
    finally:
        facts.close()
    assert result.status is Status.FAIL
    assert result.details == (
        f"import triton: ImportError: shadowed triton for the test: it came from {shadow}/triton/__init__.py, which "
        f"PYTHONPATH={shadow} "
        "puts ahead of the stack's own packages",
    )
    assert (
        result.fix.text
        == f"Take {shadow} out of PYTHONPATH (or unset it) where the stack runs: it shadows the installed triton."
    )
    assert "Reinstall" not in result.fix.text and result.fix.commands == (
        f"env -u PYTHONPATH {python} -c 'import triton'",
    )


def test_an_import_error_of_unknown_cause_says_so_instead_of_reinstalling(tmp_path):
    python, site = make_venv(tmp_path / "venv")
    (site / "odd.py").write_text('raise RuntimeError("something only its author knows")\n')
    result = run("abi.imports", spec_for(python, "", '["odd"]'))
    assert result.status is Status.FAIL
    (detail,) = result.details
    assert detail.startswith(
        "import odd: RuntimeError: something only its author knows; the cause is not known from this; nothing "
        "abnormal in the limits ("
    )
    assert "0 path(s) in play, 0 shared object(s) of the stack, the kernel log" in detail
    assert result.fix.text == "The cause is not known from this error: run the import by hand to see it whole."
    assert result.fix.commands == (f"{python} -c 'import odd'",)


def test_the_import_tests_run_beside_the_probe_not_after_it(tmp_path):
    # An import that leaves a mark: by the time the imports ask for the probe (for torch's outcome only),
    # the other imports have run, so the probe's seconds and theirs overlap in a full verify.
    python, site = make_venv(tmp_path / "venv")
    (site / "marks.py").write_text(f"open({str(tmp_path / 'imported')!r}, 'w').close()\n")
    asked = []

    def probed():
        asked.append((tmp_path / "imported").exists())
        return Missing("not needed here")

    outcomes = interpreters.imports(spec_for(python, "", '["marks", "torch"]'), {"PATH": "/usr/bin:/bin"}, probed)
    assert asked == [True] and outcomes["marks"].ok
