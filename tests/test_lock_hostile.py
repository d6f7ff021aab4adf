"""A hostile lockfile: whatever it holds, loading ends in a Lock or in a LockError naming the key,
and nothing it holds is ever run by the shell files provision writes (sourced in a real sh)."""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest
import test_lock
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stackgate.models import envfile
from stackgate.models.spec import Spec, SpecError, load_spec, loads_spec, patch_location_problem
from stackgate.stack import pyenv

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = ROOT / "lockfiles" / "blackwell-sm120-cu130.toml"
SHIPPED_PATCH = (
    ROOT / "patches" / "sglang-0.5.9-sm120-torch-symm-mem.patch"
).resolve()  # patches/ links to the package's
#: What the loader must refuse outside free text: C0 and C1 controls, DEL, U+2028 and U+2029.
CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")

#: test_lock's minimal lock, with a stackgate-managed root (its files are what shells source).
MINIMAL = test_lock.MINIMAL.replace('interpreter = "/usr/bin/python3"', 'root = "{root}"')


def problems(text: str, path: Path | str = "bad.toml") -> list[str]:
    with pytest.raises(SpecError) as caught:
        loads_spec(text, path=path)
    return caught.value.problems


def minimal(root: str = "/opt/stackgate", extra: str = "") -> str:
    return MINIMAL.format(root=root) + extra


def source(path: Path, *names: str, cwd: Path) -> list[str]:
    """What a real sh sees after sourcing ``path``: each variable's value, one per line."""
    prints = " ".join(f'"${name}"' for name in names)
    done = subprocess.run(
        ["sh", "-c", f'. "$1" && printf "%s\\n" {prints}', "sh", str(path)],
        cwd=cwd,
        env={"PATH": "/usr/bin:/bin", "HOME": "/home/u"},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


# --- 1. [env]: only $NAME and ${NAME}; the files shells source run nothing ----------------------


@pytest.mark.parametrize("table", ["env", "smoke.env", "smoke.compare.env"])
@pytest.mark.parametrize("value", ["$(touch /tmp/x)", "a$((1+1))", "${HOME:-/x}", "$1", "x$", "$$", "${HOME"])
def test_an_env_value_with_any_other_dollar_is_refused_with_its_key(table, value):
    text = minimal(extra=f"[{table}]\nNCCL_DEBUG = {json.dumps(value)}\n")
    (problem,) = problems(text)
    assert (
        problem.startswith(f"{table}.NCCL_DEBUG: ")
        and "a '$' may only start a variable reference, $NAME or ${NAME}" in problem
    )


def test_plain_references_stay_and_lock_references_still_resolve():
    spec = loads_spec(minimal(extra='[env]\nX = "{toolkit.default}/bin:$PATH:${HOME}/y"\n[smoke.env]\nY = "$HOME"\n'))
    assert spec.env["X"] == "/usr/local/cuda-13.0/bin:$PATH:${HOME}/y"
    assert spec.smoke.env["Y"] == "$HOME"


def test_sourcing_what_provision_writes_runs_nothing_that_was_data(tmp_path):
    """A root whose path holds shell syntax (it is a path, not an env value: it loads), and env
    values with backquotes, quotes and backslashes: stackgate.env and activate keep all literal."""
    canary = tmp_path / "canary"
    root = tmp_path / f"r$(touch {canary})`touch {canary}`"
    odd = f'`touch {canary}` "q" \\ $HOME'
    spec = loads_spec(minimal(root=str(root), extra=f'[env]\nODD = {json.dumps(odd)}\nP = "{{python.root}}/x"\n'))
    home = root / "generations" / "0001"
    home.mkdir(parents=True)
    pyenv.write_environment(spec, home, root)
    for sourced in (home / pyenv.ENV_FILE, home / pyenv.ACTIVATE):
        seen = source(sourced, "VIRTUAL_ENV", "ODD", "P", cwd=tmp_path)
        assert seen == [str(home), f'`touch {canary}` "q" \\ /home/u', f"{root}/x"]
    assert not canary.exists()
    parsed = envfile.parse((home / pyenv.ENV_FILE).read_text(), {"HOME": "/home/u"})
    assert (parsed["VIRTUAL_ENV"], parsed["P"]) == (str(home), f"{root}/x")


def test_render_itself_escapes_every_dollar_that_is_not_a_plain_reference(tmp_path):
    canary = tmp_path / "canary"
    values = {"A": f"$(touch {canary})", "B": f"$((0)) ${{X:-$(touch {canary})}} $1 $", "C": "$HOME and ${HOME}"}
    path = tmp_path / "stackgate.env"
    path.write_text(envfile.render(values))
    assert source(path, "A", "B", "C", cwd=tmp_path) == [values["A"], values["B"], "/home/u and /home/u"]
    assert not canary.exists()
    assert envfile.parse(path.read_text(), {"HOME": "/home/u"}) == {**values, "C": "/home/u and /home/u"}


@pytest.mark.parametrize(
    ("name", "value"),
    [("X;touch /tmp/p;Y", "1"), ("X", "a\nb"), ("X", "a\x00b"), ("X", "\x1b[2J"), ("X", "a\x85b"), ("X", "a\u2028b")],
)
def test_render_refuses_what_a_shell_file_cannot_hold(name, value):
    with pytest.raises(envfile.EnvFileError):
        envfile.render({name: value})


# --- 2. URLs: https; http only to this machine --------------------------------------------------

URL_FIELDS = {
    "python.default_index": ("[python]", "default_index = {url}"),
    "python.index[0].url": ("", '[[python.index]]\nurl = {url}\npackages = ["torch"]'),
    "python.packages.x.url": ("", '[python.packages.x]\nversion = "==1"\nurl = {url}\nsha256 = "' + "0" * 64 + '"'),
    "toolkit[1].url": (
        "",
        '[[toolkit]]\nversion = "12.8.1"\nprefix = "/usr/local/cuda-12.8"\nsource = "runfile"\nurl = {url}\nsha256 = "'
        + "0" * 64
        + '"',
    ),
}


def with_url(field: str, url: str) -> str:
    anchor, line = URL_FIELDS[field]
    text = line.format(url=json.dumps(url))
    if anchor:
        return minimal().replace(anchor, f"{anchor}\n{text}", 1)
    return minimal() + text + "\n"


@pytest.mark.parametrize("field", sorted(URL_FIELDS))
@pytest.mark.parametrize(
    "url",
    [
        "http://download.pytorch.org/whl/cu130",
        "http://127.0.0.1.evil.com/simple",
        "http://localhost.evil/simple",
        "http://localhost@evil.com/simple",
        "http://0x7f.1/simple",
        "http://2130706433/simple",
        "http://0.0.0.0:8080/simple",
        "ftp://mirror.example/simple",
        "file://evil.example/share/simple",
        "https:///simple",
        "http://[::1/simple",
        "pypi.org/simple",
    ],
)
def test_an_url_that_can_be_tampered_with_or_is_no_url_is_refused(field, url):
    found = problems(with_url(field, url))
    assert [p for p in found if p.startswith(f"{field}: ")], found


@pytest.mark.parametrize("field", sorted(URL_FIELDS))
@pytest.mark.parametrize(
    "url",
    [
        "https://download.pytorch.org/whl/cu130",
        "http://127.0.0.1:8080/simple",
        "http://localhost:3141/simple",
        "http://[::1]:8080/simple",
        "http://127.8.9.10/simple",
        "file:///srv/wheels",
    ],
)
def test_https_and_http_to_this_machine_load(field, url):
    loads_spec(with_url(field, url))


def test_a_runfile_may_also_be_an_absolute_path_but_not_a_relative_one():
    loads_spec(with_url("toolkit[1].url", "/srv/cuda_12.8.1_570.124.06_linux.run"))
    (problem,) = problems(with_url("toolkit[1].url", "cuda_12.8.1_570.124.06_linux.run"))
    assert problem.startswith("toolkit[1].url: must be an https:// URL, a file:// URL or an absolute path")


def test_plain_http_names_the_host_and_the_way_out():
    (problem,) = problems(with_url("python.index[0].url", "http://download.pytorch.org/whl/cu130"))
    assert problem == (
        "python.index[0].url: plain http to download.pytorch.org: use https (http only to localhost or a "
        "loopback "
        "IP such as 127.0.0.1 or [::1])"
    )


# --- 3. control characters, in every key and string ---------------------------------------------


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (
            (
                "[python]",
                '[[patch]]\npackage = "torch"\nversion = "2.11.0"\nfile = "a\\u0000b.patch"\nreason = "r"\n[python]',
            ),
            "patch[0].file: contains a control character (U+0000)",
        ),
        (
            ('torch = "==2.11.0"', 'torch = "==2.11.0"\n[env]\nNCCL_DEBUG = "INFO\\u0000"'),
            "env.NCCL_DEBUG: contains a control character (U+0000)",
        ),
        (
            ('prefix = "/usr/local/cuda-13.0"', 'prefix = "/usr/local/cuda-13.0\\n"'),
            "toolkit[0].prefix: contains a control character (U+000A)",
        ),
        (
            ('root = "/opt/stackgate"', 'root = "/opt/stackgate\\ntouch /tmp/p"'),
            "python.root: contains a control character (U+000A)",
        ),
        (
            ('torch = "==2.11.0"', 'torch = "==2.11.0"\n[smoke]\nhost = "127.0.0.1\\u001b[2J"'),
            "smoke.host: contains a control character (U+001B)",
        ),
        (
            ('torch = "==2.11.0"', 'torch = "==2.11.0"\n"a\\u0000b" = "==1"'),
            "python.packages.a\\x00b: the key contains a control character (U+0000)",
        ),
        (
            ('name = "t"', 'name = "t"\ndescription = "two\\nlines"'),
            "stack.description: contains a control character (U+000A)",
        ),
        (('name = "t"', 'name = "t\\u2028"'), "stack.name: contains a control character (U+2028)"),
        (('name = "t"', 'name = "t\\u0085"'), "stack.name: contains a control character (U+0085)"),
    ],
)
def test_a_control_character_is_refused_at_load_with_its_key_path(edit, expected):
    old, new = edit
    assert old in minimal()
    assert expected in problems(minimal().replace(old, new, 1))


def test_a_tab_is_free_text_only_and_the_prompt_may_have_lines():
    spec = loads_spec(
        minimal(extra='[benchmark]\nprompt = "Line one.\\n\\tLine two."\n').replace(
            'name = "t"', 'name = "t"\ndescription = "a\\tb"'
        )
    )
    assert spec.benchmark.prompt == "Line one.\n\tLine two." and spec.stack.description == "a\tb"
    assert problems(minimal(extra='[smoke]\nmodel = "/m\\tx"\n')) == [
        "smoke.model: contains a control character (U+0009)"
    ]


# --- 4. patch files: they exist, inside the lockfile's checkout or stackgate's patches -----------
# Only provision reads a patch file, so only provision's plan refuses a bad one (test_plan.py);
# the lock still loads for verify, smoke and the gate, which need no more than its name.


def patch_lock(folder: Path, file: str) -> Spec:
    path = folder / "lock.toml"
    path.write_text(
        minimal(extra=f'[[patch]]\npackage = "torch"\nversion = "2.11.0"\nfile = {json.dumps(file)}\nreason = "r"\n')
    )
    return load_spec(path)


def location_problem(folder: Path, file: str) -> str | None:
    spec = patch_lock(folder, file)
    return patch_location_problem(spec, spec.patches[0])


def test_a_missing_patch_file_is_named(tmp_path):
    assert location_problem(tmp_path, "absent.patch") == f"{tmp_path / 'absent.patch'}: no such file"


@pytest.mark.parametrize("how", ["dotdot", "absolute", "symlink"])
def test_a_patch_file_outside_the_checkout_is_named(tmp_path, how):
    lockdir, outside = tmp_path / "project", tmp_path / "elsewhere"
    lockdir.mkdir()
    outside.mkdir()
    (outside / "x.patch").write_text("--- a/m.py\n+++ b/m.py\n@@ -1 +1 @@\n-a\n+b\n")
    file = {"dotdot": "../elsewhere/x.patch", "absolute": str(outside / "x.patch"), "symlink": "x.patch"}[how]
    if how == "symlink":
        (lockdir / "x.patch").symlink_to(outside / "x.patch")
    problem = location_problem(lockdir, file)
    assert (
        problem is not None
        and f"resolves to {outside / 'x.patch'}, outside the lockfile's checkout ({lockdir})" in problem
    )


@pytest.mark.parametrize("how", ["too long", "loop"])
def test_a_patch_path_that_cannot_be_resolved_loads_and_is_named(tmp_path, how):
    file = "a" * 5000 if how == "too long" else "loop.patch"
    (tmp_path / "loop.patch").symlink_to(tmp_path / "loop.patch")
    problem = location_problem(tmp_path, file)
    assert problem is not None and "cannot be resolved" in problem


def test_a_patch_inside_the_git_checkout_or_shipped_with_stackgate_is_fine(tmp_path):
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    (repo / "lockfiles").mkdir()
    (repo / "patches").mkdir()
    (repo / "patches" / "x.patch").write_text("--- a/m.py\n+++ b/m.py\n@@ -1 +1 @@\n-a\n+b\n")
    assert location_problem(repo / "lockfiles", "../patches/x.patch") is None
    assert location_problem(tmp_path, str(SHIPPED_PATCH)) is None
    default = load_spec(DEFAULT)
    assert default.patches[0].file == SHIPPED_PATCH and patch_location_problem(default, default.patches[0]) is None


# --- every string of a real lock, made hostile: a Lock or a LockError with the key path ---------


def _toml_string(text: str) -> str:
    """A TOML basic string holding ``text`` exactly (control characters as \\u escapes)."""
    out = []
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif CONTROL.match(ch):
            out.append(f"\\u{ord(ch):04X}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return _toml_string(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml(x) for x in value) + "]"
    return "{" + ", ".join(f"{_toml_string(k)} = {_toml(x)}" for k, x in value.items()) + "}"


def _dump(document: dict[str, Any]) -> str:
    return "\n".join(f"{_toml_string(k)} = {_toml(v)}" for k, v in document.items()) + "\n"


def _rich_document() -> dict[str, Any]:
    """The default profile, with every optional string field filled in too."""
    document = tomllib.loads(DEFAULT.read_text())
    document["python"]["default_index"] = "https://pypi.org/simple"
    document["toolkit"].append(
        {
            "version": "12.9.1",
            "prefix": "/usr/local/cuda-12.9",
            "source": "runfile",
            "url": "https://developer.download.nvidia.com/cuda_12.9.1_575.57.08_linux.run",
            "sha256": "0" * 64,
        }
    )
    smoke = document["smoke"]
    smoke.update(
        model="/models/m",
        env={"NCCL_P2P_LEVEL": "SYS"},
        speculative={"algorithm": "EAGLE3", "draft_model": "/models/draft"},
    )
    smoke["compare"] = {"name": "baseline", "attention_backend": "triton", "flags": ["--enable-x"], "env": {"X": "1"}}
    document["benchmark"]["prompt"] = "Write a story."
    return document


def _strings(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _strings(item, (*path, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _strings(item, (*path, i))
    elif isinstance(value, str):
        yield path


def _key_path(path: tuple[Any, ...]) -> str:
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _set(document: dict[str, Any], path: tuple[Any, ...], value: str) -> dict[str, Any]:
    changed = copy.deepcopy(document)
    target = changed
    for part in path[:-1]:
        target = target[part]
    target[path[-1]] = value
    return changed


RICH = _rich_document()
FIELDS = list(_strings(RICH))
ENV_TABLES = ("env.", "smoke.env.", "smoke.compare.env.")
URL_KEYS = (".url", "default_index")
FREE_TEXT = {"stack.description": "\t", "benchmark.prompt": "\t\n"}


def _must_refuse(where: str, value: str) -> bool:
    allowed = "\t" if where.endswith(".reason") else FREE_TEXT.get(where, "")
    if any(CONTROL.match(c) and c not in allowed for c in value):
        return True
    if where.startswith(ENV_TABLES) and ("$(" in value or "${HOME:-" in value):
        return True
    return where.endswith(URL_KEYS) and value.startswith("http://") and "127.0.0.1:" not in value


def _hostile(canary: Path) -> list[str]:
    return [
        "\x00",
        "a\x00b",
        "line\nbreak",
        "tab\there",
        "\x1b[31mred",
        "\x7f",
        "\x85",
        "\u2028",
        f"$(touch {canary})",
        f"`touch {canary}`",
        "${HOME:-x}",
        "http://evil.example/x",
        "http://127.0.0.1.evil.com/simple",
        "http://127.0.0.1:9/simple",
    ]


def test_the_rich_document_itself_loads():
    assert loads_spec(_dump(RICH), path=DEFAULT).smoke.compare is not None
    assert len(FIELDS) > 60


def test_every_string_field_made_hostile_gives_a_lock_or_a_lock_error_naming_it(tmp_path):
    canary = tmp_path / "canary"
    loaded = 0
    for path in FIELDS:
        where = _key_path(path)
        for value in _hostile(canary):
            try:
                spec = loads_spec(_dump(_set(RICH, path, value)), path=DEFAULT)
            except SpecError as exc:
                assert exc.problems and all(isinstance(p, str) for p in exc.problems)
                if _must_refuse(where, value):
                    assert any(p.startswith(f"{where}: ") for p in exc.problems), (where, value, exc.problems)
                continue
            assert not _must_refuse(where, value), (where, value)
            loaded += 1
            if where.startswith(ENV_TABLES) or where == "python.root":
                env = tmp_path / "stackgate.env"
                env.write_text(envfile.render({**spec.env, **spec.smoke.env}))
                subprocess.run(
                    ["sh", "-c", '. "$1"', "sh", str(env)], cwd=tmp_path, capture_output=True, timeout=30, check=True
                )
    assert loaded and not canary.exists()


def test_every_key_made_hostile_is_refused_with_its_escaped_path():
    for path in FIELDS:
        key = path[-1]
        if isinstance(key, int):
            continue
        parent = copy.deepcopy(RICH)
        target = parent
        for part in path[:-1]:
            target = target[part]
        target[f"{key}\x00"] = target.pop(key)
        found = problems(_dump(parent), DEFAULT)
        assert f"{_key_path(path)}\\x00: the key contains a control character (U+0000)" in found, found


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(FIELDS), st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=10))
def test_any_text_in_any_string_field_gives_a_lock_or_a_lock_error(path, text):
    where = _key_path(path)
    try:
        loads_spec(_dump(_set(RICH, path, text)), path=DEFAULT)
    except SpecError as exc:
        assert exc.problems
        if _must_refuse(where, text):
            assert any(p.startswith(f"{where}: ") for p in exc.problems), (where, text, exc.problems)
    else:
        assert not _must_refuse(where, text)


def test_no_error_message_carries_a_raw_control_character():
    text = minimal().replace('min_driver = "580"', 'min_driver = "580"\n"\\u001b[2J" = 1')
    for problem in problems(text):
        assert not any(CONTROL.match(c) for c in problem), repr(problem)


@pytest.mark.parametrize("command", [["provision", "--dry-run"], ["verify"]])
def test_through_invoke_a_hostile_lock_exits_2_with_the_key_path_and_no_traceback(tmp_path, command):
    canary = tmp_path / "canary"
    spec = tmp_path / "lock.toml"
    spec.write_text(
        minimal(
            root=str(tmp_path / "root"),
            extra=(
                f'[env]\nNCCL_DEBUG = "$(touch {canary})"\n[[patch]]\npackage = "torch"\nversion = '
                '"2.11.0"\nfile '
                "= "
                '"a\\u0000b.patch"\nreason = "r"\n'
            ),
        )
    )
    done = subprocess.run(
        [sys.executable, "-m", "invoke", *command, "--lock", str(spec)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "NO_COLOR": "1", "HOME": str(tmp_path)},
    )
    assert done.returncode == 2, done.stderr
    assert (
        "patch[0].file: contains a control character (U+0000)" in done.stderr
        and "Traceback" not in done.stderr + done.stdout
    )
    assert not (tmp_path / "root").exists() and not canary.exists()


def test_what_provision_writes_in_a_generation_replaces_a_planted_link_instead_of_writing_through_it(tmp_path):
    """The temporary name a write used to take (`.<file>.<pid>.part`), planted as a link elsewhere."""
    spec = loads_spec(minimal(root=str(tmp_path / "root")))
    home = tmp_path / "root" / "generations" / "0001"
    home.mkdir(parents=True)
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    for name in (pyenv.ENV_FILE, pyenv.ACTIVATE):
        (home / f".{name}.{os.getpid()}.part").symlink_to(victim)
        (home / name).symlink_to(victim)
    pyenv.write_environment(spec, home, tmp_path / "root")
    assert victim.read_text() == "precious\n"
    assert not (home / pyenv.ENV_FILE).is_symlink() and "VIRTUAL_ENV" in (home / pyenv.ENV_FILE).read_text()
