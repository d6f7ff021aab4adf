"""Apply the lock's ``[[patch]]`` entries to installed packages, idempotently.

A patch is a unified diff against one exact version of one package, with paths relative to
site-packages after the first component (``a/sglang/...``, as ``git diff`` writes them). It is
applied by this module's own small diff applier, strictly: every hunk must match exactly where
it says, because the package version is exact too. All files are patched in memory first, so a
hunk that does not match changes nothing; then each file is replaced atomically. The applied
set is recorded in ``<site-packages>/stackgate-patches.json`` with each patched file's hash,
which the ``patches.applied`` verify check compares against the files (reading the record and
judging whether a patch is applied is :mod:`stackgate.facts.patchstate`: observation, not action).

The public API, as provision calls it:

``apply_patch(patch, site_packages) -> Outcome``
    Apply one locked patch (a no-op when it is already applied) or raise :class:`PatchError`.
``check_patch_file(patch) -> None``
    Raise :class:`PatchError` unless the patch file reads, has the locked sha256 and is a diff
    (plan asks before it plans an apply, so a bad file stops provision before anything runs).
``site_packages(python) -> Path``
    The purelib folder of an interpreter's environment.
``parse(text) -> tuple[FileDiff, ...]`` and ``patch_text(original, diff, reverse=False) -> str``
    The diff reader and applier, pure.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Mapping, Sequence

from stackgate.edges import fetch, runner
from stackgate.facts.patchstate import (
    RECORD,
    distribution,
    final_hashes,
    installed_version,
    read_record,
    recorded_entry,
)
from stackgate.models.spec import Patch

__all__ = [
    "FileDiff",
    "Hunk",
    "Outcome",
    "PatchError",
    "apply_patch",
    "check_patch_file",
    "parse",
    "patch_text",
    "site_packages",
]


class PatchError(Exception):
    """A patch that cannot be applied (or read); nothing was changed."""


# --- reading unified diffs ----------------------------------------------------------------------


@dataclass(frozen=True)
class Hunk:
    old_start: int
    old_count: int
    new_start: int
    new_count: int
    lines: tuple[str, ...]  #: each starts with ' ', '-' or '+', and keeps its line ending

    @property
    def old(self) -> list[str]:
        return [line[1:] for line in self.lines if line[0] in " -"]

    @property
    def new(self) -> list[str]:
        return [line[1:] for line in self.lines if line[0] in " +"]


@dataclass(frozen=True)
class FileDiff:
    path: str  #: relative to site-packages, the first component ("a/", "b/") stripped
    hunks: tuple[Hunk, ...]
    creates: bool = False


_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


def parse(text: str) -> tuple[FileDiff, ...]:
    """The files and hunks of a unified diff; text before the first ``---`` is a free header.

    >>> d = parse("why\\n--- a/p/m.py\\n+++ b/p/m.py\\n@@ -1,2 +1,2 @@\\n x = 1\\n-y = 2\\n+y = 3\\n")
    >>> d[0].path, d[0].hunks[0].old, d[0].hunks[0].new
    ('p/m.py', ['x = 1\\n', 'y = 2\\n'], ['x = 1\\n', 'y = 3\\n'])
    """
    lines = _lines(text)
    diffs, i = [], 0
    while i < len(lines):
        if _file_header(lines, i):
            diff, i = _file_diff(lines, i)
            diffs.append(diff)
        else:
            i += 1
    if not diffs:
        raise PatchError("no file in the patch: expected '--- a/path' and '+++ b/path' lines")
    return tuple(diffs)


def _file_diff(lines: list[str], i: int) -> tuple[FileDiff, int]:
    old, new = _diff_path(lines[i], i), _diff_path(lines[i + 1], i + 1)
    if new is None:
        raise PatchError(f"line {i + 2}: deleting {old} is not supported by stackgate's patches")
    hunks, i = [], i + 2
    while i < len(lines) and lines[i].startswith("@@"):
        hunk, i = _hunk(lines, i)
        hunks.append(hunk)
    if not hunks:
        raise PatchError(f"line {i + 1}: {new} has no hunks")
    if i < len(lines) and lines[i][:1] in (" ", "-", "+") and not _file_header(lines, i):
        raise PatchError(f"line {i + 1}: {lines[i].rstrip()!r} is outside any hunk (are the hunk's line counts wrong?)")
    return FileDiff(new, tuple(hunks), creates=old is None), i


def _file_header(lines: list[str], i: int) -> bool:
    return lines[i].startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ ")


def _lines(text: str) -> list[str]:
    r"""Lines split at newlines only (str.splitlines also splits at form feeds, which Python files hold).

    >>> _lines("a\x0cb\r\nc")
    ['a\x0cb\r\n', 'c']
    """
    return re.findall(r"[^\n]*\n|[^\n]+", text)


def _diff_path(line: str, index: int) -> str | None:
    name = line[4:].rstrip("\r\n").split("\t")[0].strip()
    if name == "/dev/null":
        return None
    parts = PurePosixPath(name).parts[1:]  # -p1: drop "a/" or "b/"
    if not parts or name.startswith("/") or ".." in parts:
        raise PatchError(f"line {index + 1}: {name!r} is not a relative path inside the package")
    return "/".join(parts)


def _hunk(lines: list[str], i: int) -> tuple[Hunk, int]:
    match = _HUNK.match(lines[i])
    if not match:
        raise PatchError(f"line {i + 1}: malformed hunk header {lines[i].strip()!r}")
    old_start, new_start = int(match[1]), int(match[3])
    old_count, new_count = int(match[2] or 1), int(match[4] or 1)
    body: list[str] = []
    want_old, want_new, start = old_count, new_count, i + 1
    i += 1
    while want_old or want_new:
        if i >= len(lines):
            raise PatchError(f"line {start}: the hunk ends early (the file is cut short, or its counts are wrong)")
        line = lines[i] if lines[i] not in ("\n", "\r\n") else " " + lines[i]  # an editor ate the space
        kind = line[0]
        if kind not in " -+" or (kind in " -" and not want_old) or (kind in " +" and not want_new):
            raise PatchError(f"line {i + 1}: {line.rstrip()!r} does not fit the hunk at line {start}")
        want_old -= kind in " -"
        want_new -= kind in " +"
        body.append(line)
        i += 1
        if i < len(lines) and lines[i].startswith("\\"):  # "\ No newline at end of file"
            body[-1] = body[-1].rstrip("\r\n")
            i += 1
    return Hunk(old_start, old_count, new_start, new_count, tuple(body)), i


# --- applying ------------------------------------------------------------------------------------


class _Mismatch(PatchError):
    pass


def patch_text(original: str, diff: FileDiff, reverse: bool = False) -> str:
    """``original`` with the diff applied (or un-applied); every hunk must match exactly where it says.

    >>> d = parse("--- a/m.py\\n+++ b/m.py\\n@@ -2,0 +3 @@\\n+z = 3\\n")[0]
    >>> patch_text("x = 1\\ny = 2\\n", d)
    'x = 1\\ny = 2\\nz = 3\\n'
    """
    lines = _lines(original)
    out: list[str] = []
    position = 0
    for number, hunk in enumerate(diff.hunks, 1):
        before, after = (hunk.new, hunk.old) if reverse else (hunk.old, hunk.new)
        start = (hunk.new_start if reverse else hunk.old_start) - 1
        if not before:
            start += 1  # "-N,0": the lines go after line N
        if start < position or lines[start : start + len(before)] != before:
            found = "".join(lines[start : start + len(before)]) if start >= 0 else ""
            raise _Mismatch(
                f"{diff.path}: hunk {number} does not match at line "
                f"{start + 1}:\nexpected:\n{''.join(before)}found:\n{found}"
            )
        out += lines[position:start] + after
        position = start + len(before)
    return "".join(out + lines[position:])


@dataclass(frozen=True)
class _FileChange:
    diff: FileDiff
    target: Path
    new_text: str | None  #: None when this file is already patched


def _plan_file(diff: FileDiff, target: Path) -> _FileChange:
    """Decide a file's fate without writing: patch it, or leave it (already patched), or refuse."""
    exists = target.is_file()
    if not exists and not diff.creates:
        raise PatchError(f"{diff.path}: no such file in {target.parent}")
    text = _read_text(target) if exists else ""
    forward = _try(text, diff, reverse=False) if not (diff.creates and exists) else None
    backward = _try(text, diff, reverse=True) if exists else None
    if forward is not None and backward is not None:
        raise PatchError(f"{diff.path}: the patch matches both before and after itself; it changes nothing")
    if forward is None and backward is None:
        detail = _mismatch(text, diff)
        raise PatchError(f"{diff.path} does not match the patch (a different release, or edited since):\n{detail}")
    return _FileChange(diff, target, forward)


def _read_text(path: Path) -> str:
    # Bytes decoded as they are: line endings must survive a patch untouched.
    try:
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PatchError(f"{path} is not UTF-8 text: stackgate patches only text files") from exc


def _try(text: str, diff: FileDiff, reverse: bool) -> str | None:
    try:
        return patch_text(text, diff, reverse)
    except _Mismatch:
        return None


def _mismatch(text: str, diff: FileDiff) -> str:
    try:
        patch_text(text, diff)
    except _Mismatch as exc:
        return str(exc)
    return ""


@dataclass(frozen=True)
class Outcome:
    """What :func:`apply_patch` did: the files it patched now, and those already patched."""

    patch: Patch
    patched: tuple[str, ...]
    already: tuple[str, ...]
    recorded: bool  #: whether the record had to be written

    @property
    def changed(self) -> bool:
        return bool(self.patched) or self.recorded


def apply_patch(patch: Patch, site_packages: Path) -> Outcome:
    """Apply ``patch`` to its package in ``site_packages``; applying it again changes nothing."""
    text = _read_patch(patch)
    _require_version(patch, site_packages)
    changes = [_plan_file(diff, _target(site_packages, diff)) for diff in parse(text)]
    _require_package_files(patch, site_packages, [c.diff for c in changes])
    _require_unchanged(patch, site_packages, changes)
    for change in changes:
        if change.new_text is not None:
            _replace(change.target, change.new_text)
    entry = _entry(patch, text, changes)
    recorded = _update_record(site_packages, entry)
    patched = tuple(c.diff.path for c in changes if c.new_text is not None)
    already = tuple(c.diff.path for c in changes if c.new_text is None)
    return Outcome(patch, patched, already, recorded)


def check_patch_file(patch: Patch) -> None:
    """Raise :class:`PatchError` unless ``patch``'s file reads, has the locked sha256 and parses."""
    text = _read_patch(patch)
    try:
        parse(text)
    except PatchError as exc:
        raise PatchError(f"{patch.file.name}: {exc}") from exc


def _read_patch(patch: Patch) -> str:
    try:
        raw = patch.file.read_bytes()
    except OSError as exc:
        raise PatchError(f"cannot read the patch {patch.file}: {exc.strerror or exc}") from exc
    have = hashlib.sha256(raw).hexdigest()
    if patch.sha256 is not None and have != patch.sha256:
        raise PatchError(
            f"{patch.file.name}: sha256 is {have}, the lock says {patch.sha256}: the patch file changed since the "
            "lock was written"
        )
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PatchError(f"{patch.file.name} is not UTF-8 text") from exc


def _require_version(patch: Patch, site_packages: Path) -> None:
    found = installed_version(site_packages, patch.package)
    if found is None:
        raise PatchError(f"{patch.package} is not installed in {site_packages}: nothing to patch")
    if found != str(patch.version):
        raise PatchError(
            f"{patch.package} {found} is installed in {site_packages}; {patch.file.name} is for {patch.version} "
            "only: refusing to apply it"
        )


def _require_package_files(patch: Patch, site_packages: Path, diffs: Sequence[FileDiff]) -> None:
    """A patch of sglang changes sglang's files (RECORD), never another package's."""
    dist = distribution(site_packages, patch.package)
    owned = {str(f) for f in (dist.files or ())} if dist is not None else set()
    strangers = [d.path for d in diffs if not d.creates and d.path not in owned]
    if strangers:
        raise PatchError(
            f"{patch.file.name} changes {', '.join(strangers)}, which {patch.package} {patch.version} does not install"
        )


def _require_unchanged(patch: Patch, site_packages: Path, changes: Sequence[_FileChange]) -> None:
    """A recorded file edited since: re-applying would bless the edit, so refuse instead."""
    entry = recorded_entry(site_packages, patch)
    recorded = final_hashes(read_record(site_packages)) if entry else {}
    edited = [
        c.diff.path
        for c in changes
        if c.new_text is None and c.diff.path in recorded and fetch.sha256_file(c.target) != recorded[c.diff.path]
    ]
    if edited:
        raise PatchError(
            f"{', '.join(edited)} changed since {patch.file.name} was applied; stackgate cannot restore the file: "
            f"reinstall {patch.package}=={patch.version} (a new environment), then apply the patch again"
        )


def _target(site_packages: Path, diff: FileDiff) -> Path:
    return site_packages / diff.path


def _replace(target: Path, text: str) -> None:
    """Write through a temporary file in the same folder and rename: never a half-written file."""
    mode = target.stat().st_mode & 0o7777 if target.exists() else 0o644
    target.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.stackgate-")
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8", newline="") as sink:
            sink.write(text)
            sink.flush()
            os.fsync(sink.fileno())
        os.chmod(temporary, mode)
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    # Bytecode compiled from the old text would be reused if size and mtime happened to match.
    for cached in target.parent.glob(f"__pycache__/{target.stem}.*.pyc"):
        cached.unlink(missing_ok=True)


# --- the record ----------------------------------------------------------------------------------


def _entry(patch: Patch, text: str, changes: Sequence[_FileChange]) -> dict[str, object]:
    return {
        "package": patch.package,
        "version": str(patch.version),
        "patch": patch.file.name,
        "sha256": hashlib.sha256(text.encode("utf-8")).hexdigest(),
        "reason": patch.reason,
        "files": {c.diff.path: fetch.sha256_file(c.target) for c in changes},
    }


def _update_record(site_packages: Path, entry: dict[str, object]) -> bool:
    entries = read_record(site_packages)
    kept = [e for e in entries if not (e.get("package") == entry["package"] and e.get("patch") == entry["patch"])]
    if entry in entries:
        return False
    _write_json(site_packages / RECORD, {"patches": kept + [entry]})
    return True


def _write_json(path: Path, data: Mapping[str, object]) -> None:
    temporary = path.with_name(f".{path.name}.stackgate-{os.getpid()}")
    temporary.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(temporary, path)


# --- the environment -----------------------------------------------------------------------------


def site_packages(python: Path) -> Path:
    """The purelib folder of ``python``'s environment, asked of that interpreter."""
    done = runner.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], timeout_s=60)
    if not done.ok or not done.stdout.strip():
        raise PatchError(f"cannot ask {python} for its site-packages: {' '.join(done.tail(2))}")
    return Path(done.stdout.strip())
