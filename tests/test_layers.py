"""Imports only go down: the layer rule of docs/architecture.md (Layout), read off the source with ast.

Every module of stackgate belongs to the layer of its folder (LAYERS, bottom first). An import
may reach its own folder or a lower layer's, never a higher one, never a peer on its own layer
(checks, stack and serve do not import each other), and no modules may import each other in a
cycle. An import is any ``import``/``from ... import`` at any depth (inside a function or under
``TYPE_CHECKING`` too), relative ones included, and ``importlib.import_module("stackgate...")``
with a literal name: each is a dependency whoever executes it.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "stackgate"

#: The layers, bottom to top: (name, its folders). "" is a module at the package's top level;
#: the package's own __init__ (its __version__) sits at the bottom, below everything that reads it.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("version", ("__init__",)),
    ("models", ("models",)),
    ("scan", ("scan",)),
    ("edges", ("edges",)),
    ("facts", ("facts",)),
    ("checks | stack | serve", ("checks", "stack", "serve")),
    ("runs", ("runs",)),
    ("render", ("render",)),
    ("flows", ("flows",)),
    ("commands", ("commands",)),
    ("program", ("",)),
)


@dataclass(frozen=True)
class Import:
    """One import of a stackgate module: where it is written, and what it reaches."""

    path: Path
    line: int
    text: str  #: the statement as written
    target: str  #: the module imported (a package's __init__ when a name is not a module)


def module_names(package: Path) -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its own name)."""
    modules = {}
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def folder(path: Path, package: Path) -> str:
    """The layer folder of a module's file: its first folder below the package; "" for a module
    at the top, "__init__" for the package's own __init__.

    >>> [folder(Path(f"/s/stackgate/{p}"), Path("/s/stackgate")) for p in ("facts/collect.py", "cli.py", "__init__.py")]
    ['facts', '', '__init__']
    """
    parts = path.relative_to(package).parts
    if len(parts) > 1:
        return parts[0]
    return "__init__" if parts[0] == "__init__.py" else ""


def rank(where: str) -> int | None:
    """The layer index of a folder, None when it is in no layer."""
    return next((i for i, (_, folders) in enumerate(LAYERS) if where in folders), None)


def imports(path: Path, module: str, modules: dict[str, Path]) -> Iterator[Import]:
    """The stackgate modules that ``module`` (the file at ``path``) imports, wherever it does."""
    source = path.read_text()
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(source, str(path))):
        targets = list(dict.fromkeys(_targets(node, module, is_package, modules)))  # one per module
        text = " ".join((ast.get_source_segment(source, node) or "").split()) if targets else ""
        for target in targets:
            yield Import(path, getattr(node, "lineno", 0), text, target)


def _targets(node: ast.AST, module: str, is_package: bool, modules: dict[str, Path]) -> list[str]:
    if isinstance(node, ast.Import):
        return [_known(alias.name, modules) for alias in node.names if _ours(alias.name)]
    if isinstance(node, ast.ImportFrom):
        base = _absolute(node, module, is_package)
        if not _ours(base):
            return []
        return [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else _known(base, modules) for a in node.names]
    if isinstance(node, ast.Call) and _is_import_call(node.func) and node.args:
        name = node.args[0]
        if isinstance(name, ast.Constant) and isinstance(name.value, str) and _ours(name.value):
            return [_known(name.value, modules)]
    return []


def _ours(name: str) -> bool:
    return name == "stackgate" or name.startswith("stackgate.")


def _absolute(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """``from ..x import y`` in stackgate.a.b is stackgate.x."""
    if not node.level:
        return node.module or ""
    package = module.split(".") if is_package else module.split(".")[:-1]
    base = package[: len(package) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def _is_import_call(func: ast.expr) -> bool:
    if isinstance(func, ast.Attribute):
        return func.attr == "import_module"
    return isinstance(func, ast.Name) and func.id in ("import_module", "__import__")


def _known(name: str, modules: dict[str, Path]) -> str:
    """The longest prefix of ``name`` that is a module (``import a.b.c`` where c is a class)."""
    parts = name.split(".")
    while len(parts) > 1 and ".".join(parts) not in modules:
        parts.pop()
    return ".".join(parts)


def graph(package: Path) -> dict[str, list[Import]]:
    """Each module's imports of other stackgate modules."""
    modules = module_names(package)
    return {name: [i for i in imports(path, name, modules) if i.target != name] for name, path in modules.items()}


def _where(item: Import, package: Path) -> str:
    return f"{item.path.relative_to(package.parent)}:{item.line}: {item.text}"


def layer_violations(package: Path) -> list[str]:
    """Each import that goes up a layer or across to a peer, named by file, line and statement."""
    modules = module_names(package)
    found = []
    for module, items in graph(package).items():
        here = folder(modules[module], package)
        for item in items:
            there = folder(modules[item.target], package)
            low, high = rank(here), rank(there)
            if low is None or high is None:
                continue  # reported by unplaced_modules
            if high > low:
                found.append(
                    f"{_where(item, package)}  ({LAYERS[low][0]} imports {item.target}, up in {LAYERS[high][0]})"
                )
            elif high == low and there != here:
                found.append(f"{_where(item, package)}  (peers: {here}/ imports {item.target} of {there}/)")
    return found


#: Folders whose modules never import one another: a command is a doorway, not a library.
APART = ("commands",)


def apart_violations(package: Path) -> list[str]:
    """Each import of one module by another of a folder whose modules stand apart (a command importing a
    command), named by file, line and statement; the folder's own package (its __init__) is no command."""
    modules = module_names(package)
    found = []
    for module, items in graph(package).items():
        here = folder(modules[module], package)
        for item in items:
            there = folder(modules[item.target], package)
            if here == there and here in APART and modules[item.target].name != "__init__.py":
                found.append(f"{_where(item, package)}  ({here}/ modules stand apart: {module} imports {item.target})")
    return found


def unplaced_modules(package: Path) -> list[str]:
    found = []
    for path in module_names(package).values():
        if rank(folder(path, package)) is None:
            found.append(f"{path.relative_to(package.parent)}: folder {folder(path, package)!r} is in no layer")
    return found


def cycles(package: Path) -> list[str]:
    """Every import cycle (a strongly connected group of modules), shown as one path around it."""
    edges = graph(package)
    found = []
    for group in _strongly_connected(edges):
        if len(group) > 1:
            found.append(_cycle_text(sorted(group)[0], set(group), edges, package))
    return found


def _strongly_connected(edges: dict[str, list[Import]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative (no recursion limit on a deep import chain)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(edges[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next((i.target for i in children if i.target in edges), None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.append(member)
                        if member == node:
                            break
                    groups.append(group)
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(edges[child])))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return groups


def _cycle_text(start: str, group: set[str], edges: dict[str, list[Import]], package: Path) -> str:
    """A shortest path from ``start`` back to itself inside the group, with each step's import."""
    paths: dict[str, list[Import]] = {start: []}
    queue = [start]
    while queue:
        node = queue.pop(0)
        for item in edges[node]:
            if item.target == start:
                steps = [*paths[node], item]
                names = " -> ".join([start, *(s.target for s in steps)])
                return f"import cycle {names}: " + "; ".join(_where(s, package) for s in steps)
            if item.target in group and item.target not in paths:
                paths[item.target] = [*paths[node], item]
                queue.append(item.target)
    raise AssertionError(f"no cycle through {start}")  # pragma: no cover - a group always has one


def test_every_module_is_in_a_layer() -> None:
    unplaced = unplaced_modules(PACKAGE)
    unnamed = "a folder the layer table (LAYERS, docs/architecture.md) does not name:\n"
    assert not unplaced, unnamed + "\n".join(unplaced)


def test_imports_only_go_down_and_never_to_a_peer() -> None:
    wrong = layer_violations(PACKAGE)
    assert not wrong, "imports that go up a layer or across to a peer:\n" + "\n".join(wrong)


def test_commands_never_import_commands() -> None:
    assert apart_violations(PACKAGE) == [], "\n".join(apart_violations(PACKAGE))


def test_a_command_importing_a_command_is_reported(tmp_path: Path) -> None:
    package = tmp_path / "stackgate"
    (package / "commands").mkdir(parents=True)
    for name in ("__init__.py", "commands/__init__.py", "commands/gate.py"):
        (package / name).write_text("")
    (package / "commands" / "upgrade.py").write_text("from stackgate.commands import gate\n")
    assert apart_violations(package) == [
        "stackgate/commands/upgrade.py:1: from stackgate.commands import gate  "
        "(commands/ modules stand apart: stackgate.commands.upgrade imports stackgate.commands.gate)"
    ]


def _own_names(path: Path) -> set[str]:
    """The names a module defines at its top level (not those it imports, nor a plain alias of one:
    ``name = module.name`` re-exports as an import does)."""
    own: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            own.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and not isinstance(node.value, (ast.Attribute, ast.Name)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            own |= {target.id for target in targets if isinstance(target, ast.Name)}
    return own


def reexports(package: Path, readers: list[Path]) -> list[str]:
    """A command's ``__all__`` naming what it only imports, and each place in ``readers`` that takes from a
    command a name the command does not define (``from stackgate.commands.gate import Stage``,
    ``gate.Stage`` after ``from stackgate.commands import gate``): a name is imported from its real home."""
    commands = {p.stem: p for p in (package / "commands").glob("*.py") if p.stem != "__init__"}
    own = {name: _own_names(path) for name, path in commands.items()}
    found = []
    for name, path in sorted(commands.items()):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["__all__"]:
                listed = [e.value for e in getattr(node.value, "elts", []) if isinstance(e, ast.Constant)]
                found += [
                    f"{path.relative_to(package.parent)}: __all__ re-exports {n!r}"
                    for n in listed
                    if n not in own[name]
                ]
    for path in readers:
        body = ast.parse(path.read_text()).body
        scopes = [node for node in body if isinstance(node, (ast.FunctionDef, ast.ClassDef))]
        top = ast.Module(body=[node for node in body if node not in scopes], type_ignores=[])
        aliases = _command_aliases(top, commands)
        for scope in (top, *scopes):  # `command` names another command in each task of tasks.py
            alias = {**aliases, **_command_aliases(scope, commands)}
            for node in ast.walk(scope):
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("stackgate.commands."):
                    command = str(node.module).rpartition(".")[2]
                    taken = [a.name for a in node.names if a.name not in own.get(command, {a.name})]
                    found += [f"{path.name}:{node.lineno}: {n} from commands.{command}" for n in taken]
                if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in alias:
                    if node.attr not in own[alias[node.value.id]]:
                        said = f"{node.value.id}.{node.attr} from commands.{alias[node.value.id]}"
                        found.append(f"{path.name}:{node.lineno}: {said}")
    return sorted(set(found), key=found.index)


def _command_aliases(scope: ast.AST, commands: dict[str, Path]) -> dict[str, str]:
    """The names under which ``scope`` imports a command module (``from stackgate.commands import gate as command``)."""
    found: dict[str, str] = {}
    for node in ast.walk(scope):
        if isinstance(node, ast.ImportFrom) and node.module == "stackgate.commands":
            found.update({a.asname or a.name: a.name for a in node.names if a.name in commands})
    return found


def test_an_alias_of_another_modules_name_is_a_re_export_too(tmp_path: Path) -> None:
    package = _package(
        tmp_path,
        {
            "__init__.py": "",
            "commands/__init__.py": "",
            "commands/fleet.py": (
                "from stackgate.flows import engines\nLIMIT = 8\noptions = engines.options\n"
                '__all__ = ["LIMIT", "options", "run"]\ndef run(): ...\n'
            ),
        },
    )
    assert reexports(package, []) == ["stackgate/commands/fleet.py: __all__ re-exports 'options'"]


def test_commands_re_export_nothing() -> None:
    readers = [*PACKAGE.rglob("*.py"), *TESTS.glob("*.py"), *(PACKAGE.parent / "benchmarks").glob("*.py")]
    found = reexports(PACKAGE, readers)
    assert found == [], "\n".join(found)


def test_a_re_export_and_a_name_taken_from_a_command_are_reported(tmp_path: Path) -> None:
    package = _package(
        tmp_path,
        {
            "__init__.py": "",
            "commands/__init__.py": "",
            "commands/gate.py": 'from stackgate.flows.gate import Stage\n__all__ = ["Stage", "run"]\ndef run(): ...\n',
        },
    )
    reader = tmp_path / "test_x.py"
    reader.write_text(
        "from stackgate.commands import gate\nfrom stackgate.commands.gate import Stage, run\ngate.run(gate.Stage)\n"
    )
    assert reexports(package, [reader]) == [
        "stackgate/commands/gate.py: __all__ re-exports 'Stage'",
        "test_x.py:2: Stage from commands.gate",
        "test_x.py:3: gate.Stage from commands.gate",
    ]


#: Class names more than one module defines today, each a rename still to make (one name per concept);
#: a name may leave this set, none may join it.
KNOWN_SHARED = frozenset(
    {"Change", "Completed", "Fingerprint", "Outcome", "Session", "Stage", "Step", "Sweep", "_Context"}
)


def shared_class_names(package: Path) -> dict[str, list[str]]:
    """Each class name that more than one module of ``package`` defines, with those modules."""
    where: dict[str, list[str]] = {}
    for path in sorted(package.rglob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef):
                where.setdefault(node.name, []).append(path.relative_to(package.parent).as_posix())
    return {name: paths for name, paths in where.items() if len(paths) > 1}


def test_no_new_class_name_is_shared_by_two_modules() -> None:
    found = {name: paths for name, paths in shared_class_names(PACKAGE).items() if name not in KNOWN_SHARED}
    assert found == {}, found


def test_no_import_cycles() -> None:
    found = cycles(PACKAGE)
    assert not found, "\n".join(found)


# --- the walker itself, on small packages written here -------------------------------------------


def _package(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / "stackgate" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root / "stackgate"


def test_the_walker_sees_imports_in_functions_relative_imports_and_import_module(tmp_path: Path) -> None:
    package = _package(
        tmp_path,
        {
            "__init__.py": "",
            "models/__init__.py": "",
            "models/spec.py": "def f():\n    from stackgate.facts import collect\n",
            "facts/__init__.py": "",
            "facts/collect.py": "from ..checks import core\n",
            "checks/__init__.py": "",
            "checks/core.py": "import importlib\nimportlib.import_module('stackgate.stack.plan')\n",
            "stack/__init__.py": "",
            "stack/plan.py": "from stackgate.models.spec import Lock\n",
        },
    )
    assert layer_violations(package) == [
        (
            "stackgate/checks/core.py:2: importlib.import_module('stackgate.stack.plan')  (peers: checks/ imports "
            "stackgate.stack.plan of stack/)"
        ),
        "stackgate/facts/collect.py:1: from ..checks import core  (facts imports stackgate.checks.core, up in "
        "checks | stack | serve)",
        "stackgate/models/spec.py:2: from stackgate.facts import collect  (models imports stackgate.facts.collect, "
        "up in facts)",
    ]
    assert cycles(package) == [
        "import cycle stackgate.checks.core -> stackgate.stack.plan -> stackgate.models.spec -> "
        "stackgate.facts.collect -> stackgate.checks.core: "
        "stackgate/checks/core.py:2: importlib.import_module('stackgate.stack.plan'); "
        "stackgate/stack/plan.py:1: from stackgate.models.spec import Lock; "
        "stackgate/models/spec.py:2: from stackgate.facts import collect; "
        "stackgate/facts/collect.py:1: from ..checks import core"
    ]


def test_a_cycle_inside_one_folder_and_a_module_in_no_layer_are_reported(tmp_path: Path) -> None:
    package = _package(
        tmp_path,
        {
            "__init__.py": "",
            "models/__init__.py": "from stackgate.models.scan import Scanner\n",
            "models/scan.py": "class Scanner:\n    def __init__(self):\n        from . import load\n",
            "extras/thing.py": "",
        },
    )
    assert cycles(package) == [
        "import cycle stackgate.models -> stackgate.models.scan -> stackgate.models: "
        "stackgate/models/__init__.py:1: from stackgate.models.scan import Scanner; "
        "stackgate/models/scan.py:3: from . import load"
    ]
    assert unplaced_modules(package) == ["stackgate/extras/thing.py: folder 'extras' is in no layer"]
    assert layer_violations(package) == []


@pytest.mark.parametrize(
    ("where", "expected"),
    [
        ("__init__", "version"),
        ("models", "models"),
        ("", "program"),
        ("serve", "checks | stack | serve"),
        ("extras", None),
    ],
)
def test_the_layer_of_a_folder(where: str, expected: str | None) -> None:
    index = rank(where)
    assert (LAYERS[index][0] if index is not None else None) == expected


# --- the size of a module ---------------------------------------------------------------------------

#: The most lines a module may have: past it, a newcomer reads a room with no walls (issue 30 item 5).
MAX_LINES = 700

#: Modules over MAX_LINES that another change is reshaping right now, each with the reason; each leaves
#: this list when it is split. None is now: the rule bites on every module, and on every new one.
KNOWN_LONG: frozenset[str] = frozenset()


def long_modules(package: Path, known: frozenset[str] = frozenset()) -> list[str]:
    """Each module over :data:`MAX_LINES` lines that ``known`` does not excuse, with its count."""
    found = []
    for path in sorted(package.rglob("*.py")):
        name = path.relative_to(package.parent).as_posix()
        count = len(path.read_text().splitlines())
        if count > MAX_LINES and name not in known:
            found.append(f"{name}: {count} lines (at most {MAX_LINES}: split it by what it does)")
    return found


def test_no_module_is_over_the_size() -> None:
    found = long_modules(PACKAGE, KNOWN_LONG)
    assert not found, "modules over the size, docs/architecture.md (Size):\n" + "\n".join(found)


def test_a_known_long_module_is_still_long() -> None:
    """An exception that no longer applies (the module split, renamed or gone) leaves the list, so that it
    cannot excuse the module's next growth."""
    root = PACKAGE.parent
    stale = sorted(
        name for name in KNOWN_LONG if not (root / name).is_file() or not long_modules(PACKAGE, KNOWN_LONG - {name})
    )
    assert not stale, "no longer over the size: take them off KNOWN_LONG in tests/test_layers.py:\n" + "\n".join(stale)


def test_a_long_module_is_reported_and_a_known_one_excused(tmp_path: Path) -> None:
    package = _package(
        tmp_path, {"__init__.py": "", "flows/big.py": "x = 1\n" * (MAX_LINES + 1), "flows/ok.py": "x = 1\n" * MAX_LINES}
    )
    assert long_modules(package) == [
        f"stackgate/flows/big.py: {MAX_LINES + 1} lines (at most {MAX_LINES}: split it by what it does)"
    ]
    assert long_modules(package, frozenset({"stackgate/flows/big.py"})) == []


# --- where a module's test is -----------------------------------------------------------------------

TESTS = PACKAGE.parent / "tests"
TESTING = PACKAGE.parent / "docs" / "testing.md"


def mapped_tests(text: str) -> set[str]:
    """The test files docs/testing.md's map names (its rows: ``| `test_x.py` | ... |``).

    >>> sorted(mapped_tests("| `test_docs.py` | the docs |\\n`test_x.py` in prose\\n"))
    ['test_docs.py']
    """
    return set(re.findall(r"^\| `(test_\w+\.py)` \|", text, flags=re.MULTILINE))


def module_under_test(name: str, package: Path) -> str | None:
    """The module or package of ``package`` a test file is named after by the rule of docs/testing.md
    (the longest ``_``-joined prefix of the name after ``test_``), None when none is."""
    names = {p.stem for p in package.rglob("*.py")} | {p.name for p in package.rglob("*") if p.is_dir()}
    parts = name.removeprefix("test_").removesuffix(".py").split("_")
    return next((n for n in ("_".join(parts[:i]) for i in range(len(parts), 0, -1)) if n in names), None)


def unplaced_tests(tests: Path, package: Path, mapped: set[str]) -> list[str]:
    """Each test file that neither names a module nor is on the map, and each map row whose file is gone."""
    files = sorted(p.name for p in tests.glob("test_*.py"))
    found = [
        f"tests/{name}: names no module of {package.name} and is not on the map"
        for name in files
        if name not in mapped and module_under_test(name, package) is None
    ]
    return found + [f"the map names tests/{name}, which does not exist" for name in sorted(mapped - set(files))]


def test_every_test_file_is_placed() -> None:
    found = unplaced_tests(TESTS, PACKAGE, mapped_tests(TESTING.read_text()))
    assert not found, "docs/testing.md (Where a module's test is):\n" + "\n".join(found)


def test_a_test_file_off_the_rule_and_off_the_map_is_reported(tmp_path: Path) -> None:
    package = _package(tmp_path, {"__init__.py": "", "runs/history.py": "", "checks/deep/common.py": ""})
    tests = tmp_path / "tests"
    tests.mkdir()
    for name in ("test_history.py", "test_deep_flashinfer.py", "test_everything.py", "test_docs.py"):
        (tests / name).write_text("")
    named = [module_under_test(n, package) for n in ("test_history.py", "test_deep_flashinfer.py")]
    assert named == ["history", "deep"]
    assert unplaced_tests(tests, package, {"test_docs.py", "test_gone.py"}) == [
        "tests/test_everything.py: names no module of stackgate and is not on the map",
        "the map names tests/test_gone.py, which does not exist",
    ]
