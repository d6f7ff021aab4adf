"""A real package index for the tests: wheels built with zipfile, served over HTTP on 127.0.0.1.

The wheels are small but complete (METADATA, WHEEL, RECORD with hashes) and carry the dependency
shapes of the real stack (FACTS.md): a PyPI-like index with torch 2.10.0 and the plain stack, a
cu130-like index with torch 2.9.1+cu130 and its family, and the sgl-kernel cu130 wheel at a
plain URL. pip and uv resolve against them exactly as they would against PyPI.
"""

from __future__ import annotations

import base64
import hashlib
import html
import http.server
import json
import platform
import threading
import urllib.parse
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Mapping, Sequence

from packaging.utils import canonicalize_name
from specs import DEFAULT_TOOLKIT

__all__ = [
    "DEAD_URL",
    "Index",
    "IndexServer",
    "Wheel",
    "build_wheel",
    "lock_stack",
    "serve_stack",
    "stack_wheels",
    "write_sglang0523_spec",
    "write_stack_lock",
]

PY_TAG = "py3-none-any"
#: A file of the test sglang that a test patch changes (our own text, in the place of the real one).
SYMM_MEM_FILE = "sglang/srt/distributed/device_communicators/torch_symm_mem.py"
SYMM_MEM_TEXT = (
    "# The test stand-in for sglang's symmetric-memory size table.\nMAX_SIZES = {\n    9: 4,\n    10: 8,\n}\n"
)


@dataclass(frozen=True)
class Wheel:
    name: str
    version: str
    requires: tuple[str, ...] = ()
    tag: str = PY_TAG
    files: tuple[tuple[str, str], ...] = ()  #: extra (path, text) pairs inside the wheel
    module: str | None = None  #: the top-level package (default: the name with '_')

    @property
    def filename(self) -> str:
        return f"{self.name.replace('-', '_')}-{self.version}-{self.tag}.whl"


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest},{len(data)}"


def build_wheel(directory: Path, wheel: Wheel) -> Path:
    """Write ``wheel`` as a valid .whl file into ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    dist = wheel.name.replace("-", "_")
    info = f"{dist}-{wheel.version}.dist-info"
    module = wheel.module or dist
    metadata = ["Metadata-Version: 2.1", f"Name: {wheel.name}", f"Version: {wheel.version}"]
    metadata += [f"Requires-Dist: {r}" for r in wheel.requires]
    entries = {
        f"{module}/__init__.py": f'__version__ = "{wheel.version}"\n',
        **dict(wheel.files),
        f"{info}/METADATA": "\n".join(metadata) + "\n\n",
        f"{info}/WHEEL": f"Wheel-Version: 1.0\nGenerator: stackgate-tests\nRoot-Is-Purelib: true\nTag: {wheel.tag}\n",
    }
    record = [f"{path},{_record_hash(text.encode())}" for path, text in entries.items()]
    record.append(f"{info}/RECORD,,")
    path = directory / wheel.filename
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, text in [*entries.items(), (f"{info}/RECORD", "\n".join(record) + "\n")]:
            # A fixed timestamp makes the same wheel the same bytes, so its sha256 is stable.
            archive.writestr(zipfile.ZipInfo(name, date_time=(2025, 1, 1, 0, 0, 0)), text)
    return path


def _torch(version: str, cuda: str | None, requires: Sequence[str]) -> Wheel:
    # torch.version.cuda is what the probe reads to tell a CUDA build from another.
    version_py = f'__version__ = "{version}"\ncuda = {cuda!r}\nhip = None\ngit_version = "stackgate-test"\n'
    init = f'from torch import version\n__version__ = "{version}"\n'
    return Wheel(
        "torch", version, tuple(requires), files=(("torch/version.py", version_py), ("torch/__init__.py", init))
    )


def stack_wheels() -> dict[str, list[Wheel]]:
    """The stack's wheels by where they live: "pypi", "cu130" and "url"."""
    cu130_deps = [
        "filelock",
        "nvidia-nccl-cu13==2.27.7; platform_system == 'Linux'",
        "triton==3.5.1; platform_system == 'Linux'",
    ]
    pypi = [
        Wheel("filelock", "3.20.0"),
        Wheel("nvidia-nccl-cu13", "2.27.7", module="nvidia_nccl_cu13"),
        Wheel("nvidia-nccl-cu13", "2.28.9", module="nvidia_nccl_cu13"),
        Wheel("nvidia-nccl-cu12", "2.27.5", module="nvidia_nccl_cu12"),
        Wheel("triton", "3.5.1"),
        Wheel("triton", "3.6.0"),
        # PyPI's plain torch builds are CUDA 12.8 builds with the cu12 family.
        _torch(
            "2.9.1",
            "12.8",
            [
                "filelock",
                "nvidia-nccl-cu12==2.27.5; platform_system == 'Linux'",
                "triton==3.5.1; platform_system == 'Linux'",
            ],
        ),
        _torch(
            "2.10.0",
            "12.8",
            [
                "filelock",
                "nvidia-nccl-cu12==2.27.5; platform_system == 'Linux'",
                "triton==3.6.0; platform_system == 'Linux'",
            ],
        ),
        Wheel("torchaudio", "2.9.1", ("torch==2.9.1",)),
        Wheel("torchaudio", "2.10.0", ("torch==2.10.0",)),
        Wheel("flashinfer-python", "0.6.3", ("torch", "flashinfer-cubin"), module="flashinfer"),
        Wheel("flashinfer-python", "0.6.4", ("torch", "flashinfer-cubin"), module="flashinfer"),
        Wheel("flashinfer-cubin", "0.6.3"),
        Wheel("flashinfer-cubin", "0.6.4"),
        Wheel("sgl-kernel", "0.3.21"),  # PyPI's is a CUDA 12.9 build: the wrong one
        Wheel(
            "sglang",
            "0.5.9",
            (
                "torch==2.9.1",
                "torchaudio==2.9.1",
                "sgl-kernel==0.3.21",
                "flashinfer_python==0.6.3",
                "flashinfer_cubin==0.6.3",
            ),
            files=((SYMM_MEM_FILE, SYMM_MEM_TEXT),),
        ),
        # Packages that only exist to show the guard at work.
        Wheel("eager-upgrader", "1.0", ("torch>=2.10",)),
        Wheel("torch-agnostic", "1.0", ("torch",)),
    ]
    cu130 = [
        _torch("2.9.1+cu130", "13.0", cu130_deps),
        Wheel("torchaudio", "2.9.1+cu130", ("torch==2.9.1+cu130",)),
        Wheel("triton", "3.5.1"),
        # The real cu130 index also mirrors common packages; they must not come from it.
        Wheel("filelock", "3.19.1"),
    ]
    url = [Wheel("sgl-kernel", "0.3.21+cu130", tag="cp310-abi3-manylinux2014_x86_64", module="sgl_kernel")]
    return {"pypi": pypi, "cu130": cu130, "url": url, "pypi523": sglang0523_wheels()}


def sglang0523_wheels() -> list[Wheel]:
    """The SGLang 0.5.23 stack as PyPI serves it (an index of its own): each stand-in carries the
    requirements its real wheel's METADATA declares for the stack's core (sglang-0.5.23 METADATA lines
    223, 232, 273, 281, 283; torch-2.14.1 lines 124, 128, 130, cuda-toolkit[cudart]==13.0.3 taken as
    the nvidia-cuda-runtime it brings; sglang-kernel-0.4.10 line 214; torchaudio-2.11.0 declares
    nothing), with the real tags where a floor hangs on them (sglang's manylinux_2_34)."""
    python = "cp" + "".join(platform.python_version_tuple()[:2])
    return [
        Wheel("filelock", "3.20.0"),
        _torch(
            "2.14.1",
            "13.0",
            [
                "filelock",
                "nvidia-cuda-runtime==13.0.96; platform_system == 'Linux'",
                "nvidia-nccl-cu13==2.30.7; platform_system == 'Linux'",
                "triton~=3.8.0; platform_system == 'Linux'",
            ],
        ),
        Wheel("nvidia-cuda-runtime", "13.0.96", module="nvidia_cuda_runtime"),
        Wheel("nvidia-nccl-cu13", "2.30.7", module="nvidia_nccl_cu13"),
        Wheel("triton", "3.8.0"),
        Wheel("torchaudio", "2.11.0"),  # no Requires-Dist: it does not pin torch
        Wheel("torchvision", "0.29.2", ("torch==2.14.1",)),
        Wheel("cuda-python", "13.0.0", module="cuda"),
        Wheel("flashinfer-python", "0.7.2", ("torch", "cuda-python>=12.0"), module="flashinfer"),
        Wheel("flashinfer-cubin", "0.6.13"),  # the last one PyPI has
        Wheel("sgl-kernel", "0.3.21"),
        Wheel(
            "sglang-kernel", "0.4.10", ("torch==2.14.1",), tag="cp310-abi3-manylinux2014_x86_64", module="sgl_kernel"
        ),
        Wheel(
            "sglang",
            "0.5.23",
            (
                "cuda-python>=13.0",
                "flashinfer_python==0.7.2",
                "sglang-kernel==0.4.10",
                "torch==2.14.1",
                "torchaudio==2.11.0",
            ),
            tag=f"{python}-{python}-manylinux_2_34_x86_64",
        ),
        # A package that drops a file into sgl_kernel/ (what a second kernel distribution does).
        Wheel("kernel-plugin", "1.0", files=(("sgl_kernel/plugin.py", "# not sglang-kernel's\n"),)),
        # A package that makes every start of the environment's interpreter take 3 s (a .pth line runs at start).
        Wheel("slow-start", "1.0", files=(("slow_start.pth", "import time; time.sleep(3)\n"),)),
        # A package whose only wheel needs a glibc newer than this machine's (uv targets up to 2.40).
        Wheel("future-glibc", "1.0", tag="py3-none-manylinux_2_40_x86_64"),
    ]


@dataclass
class Index:
    """One PEP 503 index: wheels on disk, served under /<name>/simple/."""

    name: str
    directory: Path

    def projects(self) -> dict[str, list[Path]]:
        found: dict[str, list[Path]] = {}
        for path in sorted(self.directory.glob("*.whl")):
            found.setdefault(canonicalize_name(path.name.split("-", 1)[0]), []).append(path)
        return found


@dataclass
class IndexServer:
    """A threaded HTTP server on 127.0.0.1 serving indexes and plain files; it logs every request."""

    indexes: dict[str, Index]
    files: Path
    requests: list[str] = field(default_factory=list)
    down: bool = False  #: answer every request with 503, like a dead index

    def __post_init__(self) -> None:
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                self.reply(with_body=True)

            def do_HEAD(self) -> None:  # noqa: N802 - uv asks HEAD before a range request
                self.reply(with_body=False)

            def reply(self, with_body: bool) -> None:
                server.requests.append(f"{self.command} {self.path}")
                status, body, kind = server.answer(self.path)
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if with_body:
                    self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def simple(self, name: str) -> str:
        return f"{self.url}/{name}/simple"

    def file_url(self, filename: str) -> str:
        return f"{self.url}/files/{filename}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def answer(self, path: str) -> tuple[int, bytes, str]:
        if self.down:
            return 503, b"index is down", "text/plain"
        parts = [urllib.parse.unquote(p) for p in path.split("?")[0].split("/") if p]
        if len(parts) == 2 and parts[0] == "files":
            target = self.files / parts[1]
            if target.is_file():
                return 200, target.read_bytes(), "application/octet-stream"
        elif len(parts) >= 2 and parts[0] in self.indexes and parts[1] == "simple":
            return self._simple(self.indexes[parts[0]], parts[2:])
        return 404, b"not found", "text/plain"

    def _simple(self, index: Index, rest: list[str]) -> tuple[int, bytes, str]:
        projects = index.projects()
        if not rest:
            links = "".join(f'<a href="{p}/">{p}</a>\n' for p in projects)
            return 200, _page(links), "text/html"
        name = canonicalize_name(rest[0])
        if len(rest) == 1 and name in projects:
            links = "".join(
                (
                    "<a "
                    f'href="{urllib.parse.quote(p.name)}#sha256={hashlib.sha256(p.read_bytes()).hexdigest()}">{html.escape(p.name)}</a>\n'
                )
                for p in projects[name]
            )
            return 200, _page(links), "text/html"
        if len(rest) == 2 and name in projects:
            match = [p for p in projects[name] if p.name == rest[1]]
            if match:
                return 200, match[0].read_bytes(), "application/octet-stream"
        return 404, b"not found", "text/plain"


def _page(body: str) -> bytes:
    return f"<!DOCTYPE html><html><body>\n{body}</body></html>\n".encode()


def serve_stack(base: Path, extra: dict[str, list[Wheel]] | None = None) -> IndexServer:
    """Build the stack's wheels under ``base`` and serve them; files land in ``base/files``."""
    wheels = stack_wheels()
    for where, more in (extra or {}).items():
        wheels.setdefault(where, []).extend(more)
    files = base / "files"
    indexes = {}
    for where, group in wheels.items():
        directory = base / where
        for wheel in group:
            path = build_wheel(directory, wheel)
            # Every wheel is also reachable as a plain file (the index pages link there).
            (files / path.name).parent.mkdir(parents=True, exist_ok=True)
            (files / path.name).write_bytes(path.read_bytes())
        if where != "url":
            indexes[where] = Index(where, directory)
    return IndexServer(indexes, files)


def iter_wheels(base: Path) -> Iterator[Path]:
    yield from sorted((base / "files").glob("*.whl"))


SGL_KERNEL_WHEEL = "sgl_kernel-0.3.21+cu130-cp310-abi3-manylinux2014_x86_64.whl"
DEAD_URL = "http://127.0.0.1:9/simple"  # the discard port: nothing listens there


def sgl_kernel_sha256(server: IndexServer) -> str:
    return hashlib.sha256((server.files / SGL_KERNEL_WHEEL).read_bytes()).hexdigest()


def write_stack_lock(
    path: Path,
    server: IndexServer,
    root: Path,
    *,
    installer: str = "uv",
    python: str | None = None,
    extra_packages: dict[str, str] | None = None,
    sha256: str | None = "",
    default_index: str | None = None,
    family_index: str | None = None,
    env: dict[str, str] | None = None,
    toolkits: str | None = None,
    resolve_with: Mapping[str, str] | None = None,
) -> Path:
    """A lockfile of the test stack (the default profile's shape) served by ``server``.

    ``sha256=""`` puts the real digest of the sgl-kernel wheel; None leaves it out.
    ``resolve_with``: an installer environment to make its pylock with (:func:`lock_stack`).
    """

    version = python or ".".join(platform.python_version_tuple()[:2])
    digest = sgl_kernel_sha256(server) if sha256 == "" else sha256
    kernel = f'{{ version = "==0.3.21+cu130", url = "{server.file_url(urllib.parse.quote(SGL_KERNEL_WHEEL))}"'
    kernel += f', sha256 = "{digest}" }}' if digest else " }"
    packages = {
        "torch": "==2.9.1+cu130",
        "torchaudio": "==2.9.1+cu130",
        "triton": "==3.5.1",
        "nvidia-nccl-cu13": "==2.27.7",
        "flashinfer-python": "==0.6.4",
        "flashinfer-cubin": "==0.6.4",
        "sglang": "==0.5.9",
        **(extra_packages or {}),
    }
    pins = "".join(f'{name} = "{spec}"\n' for name, spec in packages.items())
    env_lines = "".join(f'{k} = "{v}"\n' for k, v in (env or {}).items())
    text = f"""# A test lock: the default profile's shape, served from {server.url}
[stack]
name = "test-stack"

[hardware]
gpu_count = 1
compute_capability = "12.0"
gpu_name = "RTX PRO 6000"
min_driver = "580"

{toolkits if toolkits is not None else DEFAULT_TOOLKIT}
[python]
version = "{version}"
root = "{root}"
installer = "{installer}"
default_index = "{default_index or server.simple("pypi")}"

[[python.index]]
url = "{family_index or server.simple("cu130")}"
packages = ["torch", "torchaudio", "triton"]

[python.packages]
{pins}sgl-kernel = {kernel}

[python.guard]
frozen = ["torch", "torchaudio", "triton", "nvidia-nccl-cu13"]

[[python.override]]
package = "flashinfer-python"
version = "==0.6.4"
reason = "sglang 0.5.9 pins flashinfer_python==0.6.3; the stack runs 0.6.4"

[[python.override]]
package = "flashinfer-cubin"
version = "==0.6.4"
reason = "sglang 0.5.9 pins flashinfer_cubin==0.6.3; it must equal flashinfer-python"

[env]
CUDA_HOME = "{{toolkit.default}}"
TRITON_PTXAS_PATH = "{{toolkit.default}}/bin/ptxas"
{env_lines}"""
    path.write_text(text)
    if resolve_with is not None:
        lock_stack(path, resolve_with)
    return path


def write_sglang0523_spec(
    path: Path,
    server: IndexServer,
    root: Path,
    *,
    extra_packages: dict[str, str] | None = None,
    platform_tag: str = "x86_64-manylinux_2_34",
    resolve_with: Mapping[str, str] | None = None,
) -> Path:
    """A spec of the SGLang 0.5.23 stack (the shipped blackwell-sm120-cu130-sglang0523 profile's
    shape: one index, no override, no flashinfer-cubin) served by ``server``."""
    version = ".".join(platform.python_version_tuple()[:2])
    packages = {
        "torch": "==2.14.1",
        "torchaudio": "==2.11.0",
        "triton": "==3.8.0",
        "nvidia-nccl-cu13": "==2.30.7",
        "flashinfer-python": "==0.7.2",
        "sglang-kernel": "==0.4.10",
        "sglang": "==0.5.23",
        **(extra_packages or {}),
    }
    pins = "".join(f'{name} = "{spec}"\n' for name, spec in packages.items())
    path.write_text(f"""# A test spec: the SGLang 0.5.23 profile's shape, served from {server.url}
[stack]
name = "test-stack-0523"

[hardware]
gpu_count = 1
compute_capability = "12.0"
gpu_name = "RTX PRO 6000"
min_driver = "580.65.06"

{DEFAULT_TOOLKIT}
[python]
version = "{version}"
platform = "{platform_tag}"
root = "{root}"
default_index = "{server.simple("pypi523")}"

[python.packages]
{pins}
[python.guard]
frozen = ["torch", "torchaudio", "triton", "nvidia-nccl-cu13"]

[env]
CUDA_HOME = "{{toolkit.default}}"
""")
    if resolve_with is not None:
        lock_stack(path, resolve_with)
    return path


_RESOLVED: dict[str, str] = {}


def lock_stack(spec_path: Path, environ: Mapping[str, str]) -> Path:
    """Make a spec's pylock with `invoke lock`'s own code: real uv against the test index. The
    same inputs (same server, pins, Python) are resolved once per test process and copied after."""
    from stackgate.models import pylock
    from stackgate.models.spec import load_spec
    from stackgate.stack import pyenv, resolve

    spec = load_spec(spec_path)
    key = json.dumps([spec_path.name, pylock.inputs(spec)], sort_keys=True)
    target = pylock.path_for(spec_path)
    if key in _RESOLVED:
        target.write_text(_RESOLVED[key])
        return target
    uv = pyenv.find_uv()
    assert uv is not None
    resolve.resolve(spec, uv=uv, environ=environ)
    _RESOLVED[key] = target.read_text()
    return target
