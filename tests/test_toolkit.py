"""stackgate.stack.toolkit: real CUDA wheels side by side, a runfile that behaves like NVIDIA's, apt.

The tests marked `toolkit` download real CUDA wheels from PyPI (cached in the test cache, so a
second run downloads nothing). The runfile is a shell script that takes the real runfile's
flags and does what it does to a prefix and to the cuda link, with the link in a temp folder.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import http.server
import json
import os
import struct
import subprocess
import sys
import threading
from pathlib import Path
from typing import Iterator, Sequence

import pytest
from packaging.version import Version
from specs import minimal_spec
from support import CACHE, isolated_environ

from stackgate.checks.all import REGISTRY
from stackgate.checks.core import run_checks, select
from stackgate.edges import runner
from stackgate.facts import gather, inspect_toolkit, tool_version
from stackgate.models.result import Status
from stackgate.models.spec import PYPI_CUDA12_REASON, SpecError, Toolkit, loads_spec
from stackgate.stack import toolkit as tk
from stackgate.stack import toolkitsources
from stackgate.stack.toolkit import ToolkitError

ROOT = Path(__file__).resolve().parents[1]
UV_CACHE = CACHE / "toolkit-uv-cache"
COMPILER = ("nvcc", "crt", "nvvm", "cudart", "cccl")  # what nvcc needs to compile a kernel
WHEELS_12_8 = ("nvidia-cuda-nvcc-cu12==12.8.93", "nvidia-cuda-runtime-cu12==12.8.90")
KERNEL = Path(__file__).resolve().parent / "data" / "axpy.cu"
EM_CUDA = 190  # the ELF machine number of a cubin


def cuda13(prefix: Path, **changes: object) -> Toolkit:
    toolkit = Toolkit(Version("13.0.1"), prefix, "pypi", default=True, nvcc=Version("13.0.88"), components=COMPILER)
    return dataclasses.replace(toolkit, **changes)


def kept(prefix: Path, version: str = "12.8") -> Toolkit:
    return Toolkit(Version(version), prefix, None, keep=True)


# --- fingerprints --------------------------------------------------------------------------------


def small_tree(root: Path) -> Path:
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "ptxas").write_bytes(b"\x7fELF ptxas")
    (root / "bin" / "ptxas").chmod(0o755)
    (root / "include").mkdir()
    (root / "include" / "cuda.h").write_text("#define CUDA 12080\n")
    (root / "lib").mkdir()
    (root / "lib64").symlink_to("lib")
    return root


def test_fingerprint_is_stable_and_names_every_kind_of_change(tmp_path: Path) -> None:
    root = small_tree(tmp_path / "cuda-12.8")
    before = tk.take_fingerprint(root)
    assert tk.fingerprint(root) == before.digest == tk.take_fingerprint(root).digest
    ptxas = root / "bin" / "ptxas"
    size, mtime = ptxas.stat().st_size, ptxas.stat().st_mtime_ns
    ptxas.write_bytes(b"\x7fELF PTXAS")  # same size ...
    os.utime(ptxas, ns=(mtime, mtime))  # ... and mtime: only the content hash sees it
    assert ptxas.stat().st_size == size
    (root / "include" / "cuda.h").chmod(0o600)
    (root / "lib64").unlink()
    (root / "lib64").symlink_to("/elsewhere")
    (root / "include" / "new.h").write_text("")
    (root / "lib").rmdir()
    changes = tk.fingerprint_diff(before, tk.take_fingerprint(root))
    assert changes == [
        "removed: lib",
        "added: include/new.h",
        "changed: bin/ptxas (content)",
        "changed: include/cuda.h (mode)",
        "changed: lib64 (target)",
    ]


def test_kept_untouched_raises_naming_the_change(tmp_path: Path) -> None:
    root = small_tree(tmp_path / "cuda-12.8")
    toolkits = [kept(root), cuda13(tmp_path / "cuda-13.0")]
    with tk.kept_untouched(toolkits):
        (tmp_path / "cuda-13.0").mkdir()  # writing beside it is fine
    changed = r"(?s)CUDA 12.8 at .* is kept .* changed during provisioning:.*changed: include/cuda.h \(size, mtime\)"
    with pytest.raises(ToolkitError, match=changed), tk.kept_untouched(toolkits):
        (root / "include" / "cuda.h").write_text("#define CUDA 12090 /* patched */\n")


def test_kept_untouched_reports_the_change_even_when_the_body_failed(tmp_path: Path) -> None:
    root = small_tree(tmp_path / "cuda-12.8")
    with pytest.raises(ToolkitError, match="removed: bin/ptxas") as caught, tk.kept_untouched([kept(root)]):
        (root / "bin" / "ptxas").unlink()
        raise RuntimeError("the install failed too")
    assert isinstance(caught.value.__context__, RuntimeError)


# --- the cuda link -------------------------------------------------------------------------------


def test_set_cuda_link_is_atomic_idempotent_and_refuses_a_directory(tmp_path: Path) -> None:
    link = tmp_path / "cuda"
    old, new = tmp_path / "cuda-12.8", tmp_path / "cuda-13.0"
    old.mkdir(), new.mkdir()
    tk.set_cuda_link(old, link)
    assert os.readlink(link) == str(old)
    tk.set_cuda_link(new, link)
    assert os.readlink(link) == str(new)
    inode = link.lstat().st_ino
    tk.set_cuda_link(new, link)
    assert link.lstat().st_ino == inode  # already right: not even rewritten
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    real = tmp_path / "real"
    real.mkdir()
    with pytest.raises(ToolkitError, match="is a real directory"):
        tk.set_cuda_link(new, real)


def test_cuda_link_state_follows_the_lock_policy(tmp_path: Path) -> None:
    link = tmp_path / "cuda"
    default = cuda13(tmp_path / "cuda-13.0")
    assert tk.cuda_link_state("leave", default, link) is None
    assert "does not exist" in (tk.cuda_link_state("default", default, link) or "")
    link.symlink_to(tmp_path / "cuda-12.8")
    assert f"points at {tmp_path / 'cuda-12.8'}" in (tk.cuda_link_state("default", default, link) or "")
    tk.set_cuda_link(default.prefix, link)
    assert tk.cuda_link_state("default", default, link) is None


# --- refusals that change nothing ----------------------------------------------------------------


def test_a_kept_toolkit_is_never_installed(tmp_path: Path) -> None:
    with pytest.raises(ToolkitError, match="is kept"):
        tk.install_toolkit(kept(tmp_path / "cuda-12.8"), log=tmp_path / "log")
    with pytest.raises(ToolkitError, match="is kept"):
        tk.install_command(kept(tmp_path / "cuda-12.8"))
    assert not (tmp_path / "log").exists()


def test_pypi_refuses_cuda_12_with_the_lock_loaders_reason(tmp_path: Path) -> None:
    toolkit = Toolkit(Version("12.8.1"), tmp_path / "cuda-12.8", "pypi")
    with pytest.raises(ToolkitError) as caught:
        tk.install_toolkit(toolkit, log=tmp_path / "log")
    with pytest.raises(SpecError) as loading:
        loads_spec(
            spec_text(
                f'[[toolkit]]\nversion = "12.8.1"\nprefix = "{toolkit.prefix}"\nsource = "pypi"\ndefault = true\n'
            )
        )
    for message in (str(caught.value), str(loading.value)):
        assert f"pypi cannot provide CUDA 12.8.1: {PYPI_CUDA12_REASON}" in message


def test_a_prefix_stackgate_did_not_make_is_not_replaced(tmp_path: Path) -> None:
    prefix = small_tree(tmp_path / "cuda-13.0")
    before = tk.fingerprint(prefix)
    with pytest.raises(ToolkitError, match="was not installed by stackgate"):
        tk.install_toolkit(cuda13(prefix), log=tmp_path / "log")
    assert tk.fingerprint(prefix) == before
    assert not tk._staging(prefix).exists()


def test_components_without_nvcc_are_refused_before_any_download(tmp_path: Path) -> None:
    with pytest.raises(ToolkitError, match="lack 'nvcc'"):
        tk.install_toolkit(cuda13(tmp_path / "cuda-13.0", components=("cudart",)), log=tmp_path / "log")


def test_install_command_is_what_runs(tmp_path: Path) -> None:
    prefix = tmp_path / "cuda-13.0"
    command = tk.install_command(cuda13(prefix), cache=UV_CACHE)
    assert command[-1] == "cuda-toolkit[nvcc,crt,nvvm,cudart,cccl]==13.0.1"
    assert command[command.index("--target") + 1] == str(tmp_path / ".cuda-13.0.stackgate-staging" / "site")
    assert command[command.index("--cache-dir") + 1] == str(UV_CACHE)


# --- runfile -------------------------------------------------------------------------------------

NVCC_VERSION = """nvcc: NVIDIA (R) Cuda compiler driver
Copyright (c) 2005-2025 NVIDIA Corporation
Built on Fri_Feb_21_20:23:50_PST_2025
Cuda compilation tools, release 12.8, V12.8.93
Build cuda_12.8.r12.8/compiler.35583870_0
"""


def fake_runfile(path: Path, link: Path, ran: Path, exit_code: int = 0) -> Path:
    """A script that takes the CUDA runfile's silent toolkit-only flags and acts as it does.

    Like the real one it writes the toolkit (nvcc, ptxas, version.json) under --toolkitpath,
    does its temporary work in --tmpdir, re-points the cuda link at what it installed, prints
    its summary, and rejects options it does not know.
    """
    path.write_text(f"""#!/bin/sh
echo "$*" >> "{ran}"
prefix=""; tmp=""
for arg in "$@"; do
  case "$arg" in
    --toolkitpath=*) prefix="${{arg#--toolkitpath=}}" ;;
    --tmpdir=*) tmp="${{arg#--tmpdir=}}" ;;
    --silent|--toolkit|--no-man-page|--override) ;;
    *) echo "Unknown option: $arg" >&2; exit 1 ;;
  esac
done
[ -d "$tmp" ] || {{ echo "tmpdir $tmp does not exist" >&2; exit 1; }}
mkdir -p "$prefix/bin" "$prefix/include" "$prefix/targets/x86_64-linux/lib"
echo extracted > "$tmp/payload"
cat > "$prefix/bin/nvcc" <<'EOF'
#!/bin/sh
cat <<'VERSION'
{NVCC_VERSION}VERSION
EOF
chmod 755 "$prefix/bin/nvcc"
cp "$prefix/bin/nvcc" "$prefix/bin/ptxas"
printf '{{"cuda": {{"name": "CUDA SDK", "version": "12.8.1"}}}}\\n' > "$prefix/version.json"
ln -sfn "$prefix" "{link}"
echo "==========="; echo "= Summary ="; echo "==========="
echo "Driver:   Not Selected"; echo "Toolkit:  Installed in $prefix/"
exit {exit_code}
""")
    path.chmod(0o755)
    return path


def runfile_toolkit(prefix: Path, runfile: Path | str, sha256: str) -> Toolkit:
    return Toolkit(Version("12.8.1"), prefix, "runfile", nvcc=Version("12.8.93"), url=str(runfile), sha256=sha256)


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_runfile_installs_through_staging_and_its_link_change_is_undone(tmp_path: Path) -> None:
    link, ran = tmp_path / "cuda", tmp_path / "ran"
    original = tmp_path / "cuda-12.4"
    original.mkdir()
    link.symlink_to(original)
    runfile = fake_runfile(tmp_path / "cuda_12.8.1_570.124.06_linux.run", link, ran)
    toolkit = runfile_toolkit(tmp_path / "cuda-12.8", runfile, sha256_of(runfile))
    tk.install_toolkit(toolkit, log=tmp_path / "install.log", link=link)
    flags = ran.read_text().split()
    assert flags[:4] == ["--silent", "--toolkit", "--no-man-page", "--override"]
    assert flags[4] == f"--toolkitpath={tmp_path / '.cuda-12.8.stackgate-staging' / 'tree'}"
    found = tool_version(toolkit.prefix / "bin" / "nvcc")
    assert found and found.build == Version("12.8.93")
    assert os.readlink(link) == str(original)  # the runfile re-pointed it; undone
    assert not tk._staging(toolkit.prefix).exists()
    assert "Toolkit:  Installed in" in (tmp_path / "install.log").read_text()
    assert tk.toolkit_state(toolkit, inspect_toolkit(toolkit, "sm_120a")) is None
    assert tk.install_command(toolkit) == ["sh", str(runfile), *tk.RUNFILE_FLAGS, flags[4], flags[5]]


def test_runfile_link_that_did_not_exist_is_removed_again(tmp_path: Path) -> None:
    link = tmp_path / "cuda"
    runfile = fake_runfile(tmp_path / "cuda.run", link, tmp_path / "ran")
    tk.install_toolkit(
        runfile_toolkit(tmp_path / "cuda-12.8", runfile, sha256_of(runfile)), log=tmp_path / "log", link=link
    )
    assert not link.exists() and not link.is_symlink()


def test_runfile_with_a_wrong_sha256_is_refused_before_it_runs(tmp_path: Path) -> None:
    link, ran = tmp_path / "cuda", tmp_path / "ran"
    runfile = fake_runfile(tmp_path / "cuda.run", link, ran)
    toolkit = runfile_toolkit(tmp_path / "cuda-12.8", runfile, "0" * 64)
    with pytest.raises(
        ToolkitError, match=f"has sha256 {sha256_of(runfile)}, the lock says 0{{64}}: refusing to run it"
    ):
        tk.install_toolkit(toolkit, log=tmp_path / "log", link=link)
    assert not ran.exists() and not toolkit.prefix.exists() and not link.is_symlink()
    assert not tk._staging(toolkit.prefix).exists()


def test_a_failing_runfile_leaves_no_prefix_and_names_the_log(tmp_path: Path) -> None:
    link = tmp_path / "cuda"
    runfile = fake_runfile(tmp_path / "cuda.run", link, tmp_path / "ran", exit_code=1)
    toolkit = runfile_toolkit(tmp_path / "cuda-12.8", runfile, sha256_of(runfile))
    with pytest.raises(
        ToolkitError,
        match=(
            r"(?s)failed \(exit 1\); the runfile's own log: /var/log/cuda-installer.log.*full output: "
            r".*install.log.*Toolkit:  "
            r"Installed in"
        ),
    ):
        tk.install_toolkit(toolkit, log=tmp_path / "install.log", link=link)
    assert not toolkit.prefix.exists() and not tk._staging(toolkit.prefix).exists()
    assert not link.is_symlink()


@pytest.fixture()
def http_folder(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """A real HTTP server on 127.0.0.1 serving a folder."""
    folder = tmp_path / "www"
    folder.mkdir()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(folder))
    handler.log_message = lambda *args: None  # type: ignore[method-assign]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield folder, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_runfile_from_a_url_is_downloaded_checked_and_cached(tmp_path: Path, http_folder: tuple[Path, str]) -> None:
    folder, base = http_folder
    runfile = fake_runfile(folder / "cuda_12.8.1_linux.run", tmp_path / "cuda", tmp_path / "ran")
    cache = tmp_path / "cache"
    toolkit = runfile_toolkit(tmp_path / "cuda-12.8", f"{base}/cuda_12.8.1_linux.run", sha256_of(runfile))
    shown: list[str] = []
    tk.install_toolkit(toolkit, log=tmp_path / "log", cache=cache, link=tmp_path / "cuda", on_progress=shown.append)
    size = runfile.stat().st_size / 1e6
    assert f"downloading {toolkit.sha256[:16]}-cuda_12.8.1_linux.run: {size:.1f} MB of {size:.1f} MB" in shown
    [cached] = cache.iterdir()
    assert sha256_of(cached) == toolkit.sha256 and tool_version(toolkit.prefix / "bin" / "nvcc")
    assert tk.install_command(toolkit, cache=cache)[1] == str(cached)


def test_a_corrupted_download_is_refused_and_not_kept(tmp_path: Path, http_folder: tuple[Path, str]) -> None:
    folder, base = http_folder
    runfile = fake_runfile(folder / "cuda.run", tmp_path / "cuda", tmp_path / "ran")
    want = sha256_of(runfile)
    runfile.write_text(runfile.read_text() + "# corrupted in transit\n")
    cache = tmp_path / "cache"
    with pytest.raises(ToolkitError, match="refusing to run it"):
        tk.install_toolkit(
            runfile_toolkit(tmp_path / "cuda-12.8", f"{base}/cuda.run", want), log=tmp_path / "log", cache=cache
        )
    assert list(cache.iterdir()) == [] and not (tmp_path / "ran").exists()


def test_a_dead_url_fails_clearly(tmp_path: Path, http_folder: tuple[Path, str]) -> None:
    _, base = http_folder
    with pytest.raises(ToolkitError, match=r"cannot download .*/missing.run: HTTP Error 404"):
        tk.install_toolkit(
            runfile_toolkit(tmp_path / "cuda-12.8", f"{base}/missing.run", "0" * 64),
            log=tmp_path / "log",
            cache=tmp_path / "cache",
        )


# --- apt -----------------------------------------------------------------------------------------

# What `apt-cache policy` prints on a machine with NVIDIA's repository (format as apt 2.6 prints it).
POLICY_PACKAGE = """cuda-toolkit-13-0:
  Installed: (none)
  Candidate: 13.0.2-1
  Version table:
     13.0.2-1 600
        600 https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64  Packages
     13.0.1-1 600
        600 https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64  Packages
"""
POLICY_SOURCES = """Package files:
 100 /var/lib/dpkg/status
     release a=now
 600 https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64  Packages
     release o=NVIDIA,l=NVIDIA CUDA,c=,b=amd64
     origin developer.download.nvidia.com
 500 http://deb.debian.org/debian bookworm/main amd64 Packages
Pinned packages:
"""


class RecordingApt:
    """Answers apt's queries with given text; records the install it is asked for."""

    def __init__(self, policy: str, sources: str, install_exit: int = 0) -> None:
        self.answers = {("apt-cache", "policy", "cuda-toolkit-13-0"): policy, ("apt-cache", "policy"): sources}
        self.installs: list[tuple[str, ...]] = []
        self.install_exit = install_exit

    def query(self, argv: Sequence[str]) -> runner.Completed:
        return runner.Completed(tuple(argv), 0, self.answers[tuple(argv)], "", 0.0)

    def install(self, argv: Sequence[str], log: Path) -> runner.Completed:
        self.installs.append(tuple(argv))
        text = "E: Could not open lock file /var/lib/dpkg/lock-frontend - open (13: Permission denied)\n"
        log.write_text(text)
        return runner.Completed(tuple(argv), self.install_exit, text, "", 0.0)


APT_PREFIX = Path("/usr/local/cuda-13.0")


def test_apt_without_nvidias_repository_is_a_clear_error_on_this_machine(tmp_path: Path) -> None:
    """The real apt-cache of this Debian machine, which has no NVIDIA repository."""
    if runner.run(["apt-cache", "policy"], timeout_s=60).returncode != 0:
        pytest.skip("no apt-cache here")
    if tk.NVIDIA_REPO in runner.run(["apt-cache", "policy"], timeout_s=60).stdout:
        pytest.skip("this machine has NVIDIA's repository configured")
    with pytest.raises(
        ToolkitError,
        match=r"(?s)repository is not configured .* apt knows no cuda-toolkit-13-0.*cuda-keyring.*apt-get update",
    ):
        tk.install_toolkit(cuda13(APT_PREFIX, source="apt"), log=tmp_path / "log", link=tmp_path / "cuda")
    assert not (tmp_path / "log").exists() or (tmp_path / "log").read_text() == ""


def test_apt_installs_the_versioned_package_of_the_locked_release(tmp_path: Path) -> None:
    apt = RecordingApt(POLICY_PACKAGE, POLICY_SOURCES, install_exit=100)
    with pytest.raises(
        ToolkitError, match=r"(?s)apt-get could not install cuda-toolkit-13-0 \(exit 100\).*Permission denied"
    ):
        tk.install_toolkit(cuda13(APT_PREFIX, source="apt"), log=tmp_path / "log", apt=apt, link=tmp_path / "cuda")
    assert apt.installs == [("apt-get", "install", "-y", "--no-install-recommends", "cuda-toolkit-13-0=13.0.1-*")]
    assert tk.install_command(cuda13(APT_PREFIX, source="apt")) == list(apt.installs[0])


def test_apt_refuses_a_release_the_repository_does_not_offer(tmp_path: Path) -> None:
    apt = RecordingApt(POLICY_PACKAGE.replace("13.0.1-1", "13.0.0-1"), POLICY_SOURCES)
    with pytest.raises(ToolkitError, match="apt offers cuda-toolkit-13-0 13.0.2-1, 13.0.0-1, not CUDA 13.0.1"):
        tk.install_toolkit(cuda13(APT_PREFIX, source="apt"), log=tmp_path / "log", apt=apt)
    assert apt.installs == []


def test_apt_with_the_repository_but_no_package_says_update(tmp_path: Path) -> None:
    apt = RecordingApt("", POLICY_SOURCES)
    with pytest.raises(ToolkitError, match=r"configured but offers no cuda-toolkit-13-0: run `sudo apt-get update`"):
        tk.install_toolkit(cuda13(APT_PREFIX, source="apt"), log=tmp_path / "log", apt=apt)


def test_apt_cannot_install_elsewhere(tmp_path: Path) -> None:
    apt = RecordingApt(POLICY_PACKAGE, POLICY_SOURCES)
    with pytest.raises(ToolkitError, match="apt packages install only to /usr/local/cuda-13.0"):
        tk.install_toolkit(cuda13(tmp_path / "cuda-13.0", source="apt"), log=tmp_path / "log", apt=apt)
    assert apt.installs == []


# --- toolkit_state -------------------------------------------------------------------------------


def test_state_of_missing_foreign_and_kept_toolkits(tmp_path: Path) -> None:
    toolkit = cuda13(tmp_path / "cuda-13.0")
    assert tk.toolkit_state(toolkit, inspect_toolkit(toolkit, "sm_120a")) == "missing"
    small_tree(toolkit.prefix)
    reason = tk.toolkit_state(toolkit, inspect_toolkit(toolkit, "sm_120a")) or ""
    assert reason.startswith("neither nvcc nor ptxas works") and "was not installed by stackgate" in reason
    gone = kept(tmp_path / "cuda-12.8")
    with pytest.raises(ToolkitError, match=r"CUDA 12.8 at .* is kept \(keep = true\) and it is wrong: missing"):
        tk.toolkit_state(gone, inspect_toolkit(gone, "sm_120a"))


# --- real CUDA wheels from PyPI, side by side -----------------------------------------------------


def uv_target(site: Path, requirements: Sequence[str]) -> None:
    """Install wheels into a folder with uv, isolated from the machine's pip configuration."""
    uv = toolkitsources._uv()
    assert uv is not None, "uv is in the test extra"
    subprocess.run(
        [
            uv,
            "pip",
            "install",
            "-q",
            "--python",
            sys.executable,
            "--target",
            str(site),
            "--link-mode",
            "copy",
            "--cache-dir",
            str(UV_CACHE),
            *requirements,
        ],
        env=isolated_environ(),
        check=True,
        capture_output=True,
    )


def stand_in_12_8(prefix: Path) -> Path:
    """The kept CUDA 12.8, laid out from the real 12.8 wheels (ptxas, headers, nvvm; no nvcc)."""
    site = prefix.with_name("site-12.8")
    uv_target(site, WHEELS_12_8)
    tk.lay_out_wheels(site, prefix)
    return prefix


@dataclasses.dataclass
class SideBySide:
    root: Path
    kept: Toolkit
    new: Toolkit
    before: tk.Fingerprint
    after: tk.Fingerprint
    state_before: str | None
    log: Path


@pytest.fixture(scope="module")
def side_by_side(tmp_path_factory: pytest.TempPathFactory) -> SideBySide:
    root = tmp_path_factory.mktemp("usr-local")
    kept_12 = kept(stand_in_12_8(root / "cuda-12.8"))
    new = cuda13(root / "cuda-13.0")
    before = tk.take_fingerprint(kept_12.prefix)
    state = tk.toolkit_state(new, inspect_toolkit(new, "sm_120a"))
    log = root / "logs" / "toolkit.log"
    with tk.kept_untouched([kept_12, new]):
        tk.install_toolkit(new, log=log, cache=UV_CACHE)
    return SideBySide(root, kept_12, new, before, tk.take_fingerprint(kept_12.prefix), state, log)


@pytest.mark.toolkit
def test_the_kept_12_8_is_untouched_and_still_12_8(side_by_side: SideBySide) -> None:
    assert side_by_side.after.digest == side_by_side.before.digest
    assert tk.fingerprint_diff(side_by_side.before, side_by_side.after) == []
    ptxas = tool_version(side_by_side.kept.prefix / "bin" / "ptxas")
    assert ptxas and ptxas.release == "12.8" and ptxas.build == Version("12.8.93")
    assert not (side_by_side.kept.prefix / "bin" / "nvcc").exists()  # PyPI's 12.x has no nvcc driver
    assert tk.toolkit_state(side_by_side.kept, inspect_toolkit(side_by_side.kept, "sm_120a")) is None


@pytest.mark.toolkit
def test_13_0_1_from_pypi_reports_v13_0_88_and_compiles_for_sm_120a(side_by_side: SideBySide, tmp_path: Path) -> None:
    prefix = side_by_side.new.prefix
    assert side_by_side.state_before == "missing"
    nvcc = tool_version(prefix / "bin" / "nvcc")
    assert nvcc and nvcc.release == "13.0" and nvcc.build == Version("13.0.88")
    done = runner.run(
        [prefix / "bin" / "nvcc", "-arch=sm_120a", "-cubin", "-o", tmp_path / "k.cubin", KERNEL], timeout_s=300
    )
    assert done.ok, done.tail()
    header = (tmp_path / "k.cubin").read_bytes()[:20]
    assert header[:4] == b"\x7fELF" and struct.unpack_from("<H", header, 18)[0] == EM_CUDA
    assert tk.toolkit_state(side_by_side.new, inspect_toolkit(side_by_side.new, "sm_120a")) is None
    assert "nvcc reports release 13.0, V13.0.88" in side_by_side.log.read_text()


@pytest.mark.toolkit
def test_the_layout_is_a_standard_toolkit_tree(side_by_side: SideBySide) -> None:
    prefix = side_by_side.new.prefix
    for name in (
        "bin/nvcc",
        "bin/ptxas",
        "bin/nvcc.profile",
        "nvvm/bin/cicc",
        "include/cuda_runtime.h",
        "lib/libcudart.so.13",
        "version.json",
    ):
        assert (prefix / name).is_file(), name
    assert os.readlink(prefix / "lib64") == "lib" and os.readlink(prefix / "lib" / "libcudart.so") == "libcudart.so.13"
    assert os.readlink(prefix / "targets" / "x86_64-linux" / "include") == "../../include"
    assert {p.name.split("-")[0] for p in (prefix / "dist-info").iterdir()} >= {"cuda_toolkit", "nvidia_cuda_nvcc"}
    assert not list(prefix.rglob("__init__.py")) and not (prefix / ".metadata").exists()
    assert [p.name for p in side_by_side.root.iterdir() if p.name.startswith(".")] == []  # no staging left


@pytest.mark.toolkit
def test_verify_passes_on_what_provision_built(side_by_side: SideBySide) -> None:
    text = spec_text(
        f'[[toolkit]]\nversion = "13.0.1"\nnvcc = "13.0.88"\nprefix = "{side_by_side.new.prefix}"\nsource = "pypi"\n'
        f"components = {json.dumps(list(COMPILER))}\ndefault = true\n"
        f'[[toolkit]]\nversion = "12.8"\nprefix = "{side_by_side.kept.prefix}"\nkeep = true\n'
    )
    spec = loads_spec(text)
    facts = gather(spec, ("toolkits",))
    try:
        results = run_checks(select(["cuda.toolkits", "cuda.ptxas_arch"], REGISTRY), spec, facts)
    finally:
        facts.close()
    assert [r.status for r in results] == [Status.PASS, Status.PASS], [r.summary for r in results]


@pytest.mark.toolkit
@pytest.mark.parametrize("point", ["toolkit:installed", "toolkit:laid-out"])
def test_killed_mid_install_leaves_no_prefix_and_a_rerun_completes(side_by_side: SideBySide, point: str) -> None:
    prefix = side_by_side.root / f"cuda-13.0-{point.split(':')[1]}"
    script = (
        "import sys; from pathlib import Path; from packaging.version import Version\n"
        "from stackgate.models.spec import Toolkit; from stackgate.stack.toolkit import install_toolkit\n"
        f"t = Toolkit(Version('13.0.1'), Path(sys.argv[1]), 'pypi', nvcc=Version('13.0.88'), components={COMPILER!r})\n"
        "install_toolkit(t, log=Path(sys.argv[2]), cache=Path(sys.argv[3]))\n"
    )
    env = dict(os.environ, STACKGATE_FAULT=point, PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, "-c", script, str(prefix), str(prefix) + ".log", str(UV_CACHE)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == -9, done.stderr  # killed by SIGKILL at the fault point
    assert not prefix.exists()
    assert (tk._staging(prefix) / "site").is_dir()  # the half-built state lies in staging only
    tk.install_toolkit(cuda13(prefix, default=False), log=Path(str(prefix) + ".log"), cache=UV_CACHE)
    assert tool_version(prefix / "bin" / "nvcc") and not tk._staging(prefix).exists()


@pytest.mark.toolkit
def test_an_unknown_component_fails_clearly_and_leaves_nothing(side_by_side: SideBySide) -> None:
    prefix = side_by_side.root / "cuda-13.0-typo"
    with pytest.raises(ToolkitError, match=r"cuda-toolkit 13.0.1 has no extra\(s\) nvvc; it offers: all, cccl"):
        tk.install_toolkit(
            cuda13(prefix, components=(*COMPILER, "nvvc")), log=side_by_side.root / "typo.log", cache=UV_CACHE
        )
    assert not prefix.exists() and not tk._staging(prefix).exists()


@pytest.mark.toolkit
def test_a_new_component_reinstalls_by_swapping_the_whole_tree(side_by_side: SideBySide) -> None:
    prefix = side_by_side.root / "cuda-13.0-swap"
    tk.install_toolkit(cuda13(prefix), log=side_by_side.root / "swap.log", cache=UV_CACHE)
    wider = cuda13(prefix, components=(*COMPILER, "nvrtc"))
    assert (
        tk.toolkit_state(wider, inspect_toolkit(wider, "sm_120a"))
        == "installed without the component(s) nvrtc that the lock lists"
    )
    inode = prefix.stat().st_ino
    tk.install_toolkit(wider, log=side_by_side.root / "swap.log", cache=UV_CACHE)
    assert prefix.stat().st_ino != inode and (prefix / "lib" / "libnvrtc.so.13").is_file()
    assert tk.toolkit_state(wider, inspect_toolkit(wider, "sm_120a")) is None
    assert not tk._staging(prefix).exists()


def spec_text(toolkits: str) -> str:
    return minimal_spec(name="toolkit-test", toolkits=f"{toolkits}\n", interpreter="/nonexistent/python")
