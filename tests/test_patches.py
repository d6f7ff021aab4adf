"""stackgate.stack.patching against diffs made by diff(1), GNU patch, and the real sglang 0.5.9 wheel."""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import runpy
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest
from packaging.version import Version
from specs import THIS_PYTHON, minimal_spec
from support import CACHE, cached_build, isolated_environ

from stackgate.checks.all import REGISTRY
from stackgate.checks.core import run_checks, select
from stackgate.facts import gather
from stackgate.facts import patchstate as applied
from stackgate.models.result import Status
from stackgate.models.spec import DEFAULT_SPEC, Patch, Spec, load_spec, loads_spec
from stackgate.stack import patching
from stackgate.stack.patching import PatchError

ROOT = Path(__file__).resolve().parents[1]
SM120_PATCH = (
    ROOT / "patches" / "sglang-0.5.9-sm120-torch-symm-mem.patch"
).resolve()  # patches/ links to the package's
COMM = "sglang/srt/distributed/device_communicators"
SIZES_FILE = f"{COMM}/all_reduce_utils.py"
SYMM_FILE = f"{COMM}/torch_symm_mem.py"


def unified_diff(tmp_path: Path, relative: str, old: str, new: str) -> str:
    """Real diff text, written by diff(1) as a patch author would make it."""
    for side, text in (("a", old), ("b", new)):
        (tmp_path / side / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / side / relative).write_bytes(text.encode())
    done = subprocess.run(
        ["diff", "-u", f"a/{relative}", f"b/{relative}"], cwd=tmp_path, capture_output=True, check=False
    )
    assert done.returncode == 1, done.stderr  # 1: the files differ
    return done.stdout.decode()  # bytes as they are: "\r\n" must reach the parser


def fake_site(tmp_path: Path, name: str, version: str, files: dict[str, str]) -> Path:
    """A site-packages holding one distribution with a real dist-info (METADATA, RECORD)."""
    site = tmp_path / "site-packages"
    info = site / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    for relative, text in files.items():
        (site / relative).parent.mkdir(parents=True, exist_ok=True)
        (site / relative).write_bytes(text.encode())
    records = [f"{r},sha256=,{len(t)}" for r, t in files.items()] + [f"{info.name}/METADATA,,", f"{info.name}/RECORD,,"]
    (info / "RECORD").write_text("\n".join(records) + "\n")
    return site


def patch_entry(path: Path, package: str = "demo", version: str = "1.0") -> Patch:
    return Patch(package, Version(version), path, "a test", hashlib.sha256(path.read_bytes()).hexdigest())


OLD = "".join(f"line {i}\n" for i in range(1, 31))
NEW = OLD.replace("line 3\n", "line three\n").replace("line 20\n", "line 20\nline 20.5\n").replace("line 30\n", "")


# --- the diff reader and applier ---------------------------------------------------------------


def test_three_hunk_diff_from_diff1_applies_and_reverses(tmp_path: Path) -> None:
    text = unified_diff(tmp_path, "pkg/m.py", OLD, NEW)
    [diff] = patching.parse("A free header explaining the patch.\n\n" + text)
    assert diff.path == "pkg/m.py" and len(diff.hunks) == 3
    assert patching.patch_text(OLD, diff) == NEW
    assert patching.patch_text(NEW, diff, reverse=True) == OLD


def test_agrees_with_gnu_patch(tmp_path: Path) -> None:
    if shutil.which("patch") is None:
        pytest.skip("GNU patch is not installed")
    text = unified_diff(tmp_path, "pkg/m.py", OLD, NEW)
    work = tmp_path / "gnu"
    (work / "pkg").mkdir(parents=True)
    (work / "pkg" / "m.py").write_text(OLD)
    subprocess.run(["patch", "-p1", "--dry-run"], input=text, cwd=work, text=True, check=True, capture_output=True)
    subprocess.run(["patch", "-p1"], input=text, cwd=work, text=True, check=True, capture_output=True)
    [diff] = patching.parse(text)
    assert patching.patch_text(OLD, diff) == (work / "pkg" / "m.py").read_text()


def test_no_newline_at_end_of_file_crlf_and_form_feeds_survive(tmp_path: Path) -> None:
    old, new = "a\r\n\x0cb\r\nc", "a\r\n\x0cB\r\nc"
    text = unified_diff(tmp_path, "m.txt", old, new)
    assert "\\ No newline at end of file" in text
    [diff] = patching.parse(text)
    assert patching.patch_text(old, diff) == new


def test_new_file_from_dev_null(tmp_path: Path) -> None:
    text = "--- /dev/null\n+++ b/pkg/new.py\n@@ -0,0 +1,2 @@\n+x = 1\n+y = 2\n"
    [diff] = patching.parse(text)
    assert diff.creates and patching.patch_text("", diff) == "x = 1\ny = 2\n"


def test_a_hunk_must_match_where_it_says(tmp_path: Path) -> None:
    text = unified_diff(tmp_path, "pkg/m.py", OLD, NEW)
    [diff] = patching.parse(text)
    shifted = "inserted\n" + OLD  # what GNU patch would accept "with offset 1": a different file
    with pytest.raises(PatchError, match="hunk 1 does not match at line"):
        patching.patch_text(shifted, diff)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("just words\n", "no file in the patch"),
        ("--- a/m.py\n+++ b/m.py\n@@ -1,2 +1,2 @@\n x\n", "ends early"),
        ("--- a/m.py\n+++ b/m.py\n@@ -1 +1 @@\n-x\n+y\n+z\n", "outside any hunk"),
        ("--- a/m.py\n+++ b/m.py\n@@ -1,2 +1 @@\n-x\n+y\n+z\n-w\n", "does not fit the hunk"),
        ("--- a/m.py\n+++ b/m.py\n@@ bogus @@\n", "malformed hunk header"),
        ("--- a/../etc/passwd\n+++ b/../etc/passwd\n@@ -1 +1 @@\n-x\n+y\n", "not a relative path inside the package"),
        ("--- a/m.py\n+++ /dev/null\n@@ -1 +0,0 @@\n-x\n", "deleting m.py is not supported"),
    ],
)
def test_malformed_diffs_are_refused_with_the_reason(text: str, message: str) -> None:
    with pytest.raises(PatchError, match=message):
        patching.parse(text)


# --- applying to an installed package -----------------------------------------------------------


def test_apply_twice_is_a_no_op_and_is_recorded(tmp_path: Path) -> None:
    site = fake_site(tmp_path, "demo", "1.0", {"demo/m.py": OLD})
    (site / "demo" / "__pycache__").mkdir()
    stale = site / "demo" / "__pycache__" / "m.cpython-312.pyc"
    stale.write_bytes(b"old bytecode")
    (tmp_path / "demo.patch").write_text(unified_diff(tmp_path / "d", "demo/m.py", OLD, NEW))
    patch = patch_entry(tmp_path / "demo.patch")
    first = patching.apply_patch(patch, site)
    assert first.patched == ("demo/m.py",) and first.changed
    assert (site / "demo" / "m.py").read_text() == NEW and not stale.exists()
    record = (site / applied.RECORD).read_bytes()
    mtime = (site / "demo" / "m.py").stat().st_mtime_ns
    second = patching.apply_patch(patch, site)
    assert not second.changed and second.already == ("demo/m.py",)
    assert (site / applied.RECORD).read_bytes() == record
    assert (site / "demo" / "m.py").stat().st_mtime_ns == mtime
    assert applied.patch_state(patch, site) is None


def test_a_patch_that_does_not_apply_changes_nothing(tmp_path: Path) -> None:
    other = OLD.replace("line 20\n", "line twenty\n")
    site = fake_site(tmp_path, "demo", "1.0", {"demo/a.py": OLD, "demo/b.py": other})
    good = unified_diff(tmp_path / "d1", "demo/a.py", OLD, NEW)
    bad = unified_diff(tmp_path / "d2", "demo/b.py", OLD, NEW)  # written against a b.py that is not installed
    (tmp_path / "demo.patch").write_text(good + bad)
    with pytest.raises(PatchError, match="demo/b.py does not match the patch"):
        patching.apply_patch(patch_entry(tmp_path / "demo.patch"), site)
    assert (site / "demo" / "a.py").read_text() == OLD
    assert (site / "demo" / "b.py").read_text() == other
    assert not (site / applied.RECORD).exists()


def test_only_the_exact_version_is_patched(tmp_path: Path) -> None:
    site = fake_site(tmp_path, "demo", "1.1", {"demo/m.py": OLD})
    (tmp_path / "demo.patch").write_text(unified_diff(tmp_path / "d", "demo/m.py", OLD, NEW))
    with pytest.raises(PatchError, match=r"demo 1.1 is installed .* is for 1.0 only"):
        patching.apply_patch(patch_entry(tmp_path / "demo.patch"), site)
    assert (site / "demo" / "m.py").read_text() == OLD


def test_a_patch_file_that_differs_from_the_lock_is_refused(tmp_path: Path) -> None:
    site = fake_site(tmp_path, "demo", "1.0", {"demo/m.py": OLD})
    (tmp_path / "demo.patch").write_text(unified_diff(tmp_path / "d", "demo/m.py", OLD, NEW))
    patch = dataclasses.replace(patch_entry(tmp_path / "demo.patch"), sha256="0" * 64)
    with pytest.raises(PatchError, match="changed since the lock was written"):
        patching.apply_patch(patch, site)


def test_files_of_another_package_are_refused(tmp_path: Path) -> None:
    site = fake_site(tmp_path, "demo", "1.0", {"demo/m.py": OLD})
    (site / "other").mkdir()
    (site / "other" / "m.py").write_text(OLD)
    (tmp_path / "demo.patch").write_text(unified_diff(tmp_path / "d", "other/m.py", OLD, NEW))
    with pytest.raises(PatchError, match="which demo 1.0 does not install"):
        patching.apply_patch(patch_entry(tmp_path / "demo.patch"), site)


def test_an_edited_patched_file_is_reported_and_not_blessed(tmp_path: Path) -> None:
    site = fake_site(tmp_path, "demo", "1.0", {"demo/m.py": OLD})
    (tmp_path / "demo.patch").write_text(unified_diff(tmp_path / "d", "demo/m.py", OLD, NEW))
    patch = patch_entry(tmp_path / "demo.patch")
    patching.apply_patch(patch, site)
    (site / "demo" / "m.py").write_text(NEW + "# edited by hand\n")
    assert applied.patch_state(patch, site) == "demo/m.py changed since demo.patch was applied"
    with pytest.raises(PatchError, match="reinstall demo==1.0"):
        patching.apply_patch(patch, site)


def test_lost_record_with_patched_files_is_recorded_again(tmp_path: Path) -> None:
    site = fake_site(tmp_path, "demo", "1.0", {"demo/m.py": NEW})  # patched, say, by hand
    (tmp_path / "demo.patch").write_text(unified_diff(tmp_path / "d", "demo/m.py", OLD, NEW))
    patch = patch_entry(tmp_path / "demo.patch")
    assert "not applied" in (applied.patch_state(patch, site) or "")
    outcome = patching.apply_patch(patch, site)
    assert outcome.patched == () and outcome.recorded
    assert applied.patch_state(patch, site) is None


# --- the shipped SM120 patch against the real sglang 0.5.9 wheel --------------------------------


@pytest.fixture(scope="module")
def sglang_wheel() -> Path:
    """The real sglang 0.5.9 wheel from PyPI, downloaded once into the test cache (safely when
    two runs start at once: ``cached_build``)."""

    def download(folder: Path) -> None:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--only-binary",
                ":all:",
                "sglang==0.5.9",
                "-d",
                str(folder),
            ],
            env=isolated_environ(),
            check=True,
            capture_output=True,
        )

    (found,) = cached_build(CACHE / "sglang-0.5.9-wheel", download).glob("sglang-0.5.9-*.whl")
    return found


@pytest.fixture()
def sglang_env(tmp_path: Path, sglang_wheel: Path) -> tuple[Path, Path]:
    """A real venv with the sglang 0.5.9 wheel's files unpacked into its site-packages."""
    home = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(home)
    python = home / "bin" / "python"
    site = patching.site_packages(python)
    with zipfile.ZipFile(sglang_wheel) as wheel:
        wheel.extractall(site)
    return python, site


def locked_patch() -> Patch:
    [patch] = load_spec(DEFAULT_SPEC).patches
    return patch


def sizes_table(site: Path) -> dict[int, dict[int, int]]:
    return runpy.run_path(str(site / SIZES_FILE))["TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES"]


def multimem_table(site: Path) -> dict[int, list[int]]:
    """The class attribute, read without importing torch."""
    tree = ast.parse((site / SYMM_FILE).read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "_WORLD_SIZES_MULTIMEM" for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError("_WORLD_SIZES_MULTIMEM not found")


def test_the_lock_names_the_shipped_patch_with_its_real_sha256() -> None:
    patch = locked_patch()
    assert patch.file == SM120_PATCH and patch.package == "sglang" and patch.version == Version("0.5.9")
    assert patch.sha256 == hashlib.sha256(SM120_PATCH.read_bytes()).hexdigest()


def test_sm120_patch_on_the_real_wheel(sglang_env: tuple[Path, Path]) -> None:
    _, site = sglang_env
    patch = locked_patch()
    assert set(sizes_table(site)) == {9, 10} and set(multimem_table(site)) == {9, 10}
    outcome = patching.apply_patch(patch, site)
    assert set(outcome.patched) == {SIZES_FILE, SYMM_FILE}
    sizes = sizes_table(site)
    assert sizes[12] == {2: 64 << 20, 4: 64 << 20, 6: 128 << 20, 8: 128 << 20}
    assert sizes[9] == {2: 64 << 20, 4: 64 << 20, 6: 128 << 20, 8: 128 << 20}  # untouched
    assert multimem_table(site)[12] == []
    again = patching.apply_patch(patch, site)
    assert not again.changed


def test_sm120_patch_refuses_another_sglang_version(sglang_env: tuple[Path, Path]) -> None:
    _, site = sglang_env
    metadata = next(site.glob("sglang-0.5.9.dist-info")) / "METADATA"
    metadata.write_text(metadata.read_text().replace("Version: 0.5.9", "Version: 0.5.8", 1))
    before = (site / SIZES_FILE).read_bytes()
    with pytest.raises(PatchError, match=r"sglang 0.5.8 is installed .* is for 0.5.9 only"):
        patching.apply_patch(locked_patch(), site)
    assert (site / SIZES_FILE).read_bytes() == before


def verify_spec(tmp_path: Path, python: Path) -> Spec:
    patch = locked_patch()
    text = (
        minimal_spec(name="patch-test", version=THIS_PYTHON, interpreter=python)
        + f"""[[patch]]
package = "sglang"
version = "0.5.9"
file = "{patch.file}"
sha256 = "{patch.sha256}"
reason = "{patch.reason}"
"""
    )
    return loads_spec(text, path=tmp_path / "lock.toml")


def run_patches_check(spec: Spec):
    facts = gather(spec, ("patches",))
    try:
        [result] = run_checks(select(["patches.applied"], REGISTRY), spec, facts)
    finally:
        facts.close()
    return result


def test_patches_applied_check_through_the_real_probe(tmp_path: Path, sglang_env: tuple[Path, Path]) -> None:
    python, site = sglang_env
    spec = verify_spec(tmp_path, python)
    missing = run_patches_check(spec)
    assert missing.status is Status.FAIL and "is not applied" in missing.summary
    assert missing.fix is not None and "stackgate provision --only patches" in missing.fix.commands
    patching.apply_patch(spec.patches[0], site)
    good = run_patches_check(spec)
    assert good.status is Status.PASS, good.summary
    assert set(good.data[SM120_PATCH.name]["files"]) == {SIZES_FILE, SYMM_FILE}
    (site / SIZES_FILE).write_text((site / SIZES_FILE).read_text().replace("12: {", "11: {"))
    edited = run_patches_check(spec)
    assert edited.status is Status.FAIL
    assert f"{SIZES_FILE} changed since {SM120_PATCH.name} was applied" in edited.summary


def test_patches_applied_is_skipped_without_patches(tmp_path: Path, sglang_env: tuple[Path, Path]) -> None:
    python, _ = sglang_env
    spec = dataclasses.replace(verify_spec(tmp_path, python), patches=())
    assert run_patches_check(spec).status is Status.SKIP
