"""Command text shown to users says `stackgate X`, the program that works from any directory, not
the checkout's `invoke X` (the same task collection): every string literal of the package is read."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from stackgate import tasks

PACKAGE = Path(tasks.__file__).parent
#: Where `invoke X` is meant: a help text saying how the checkout's invoke takes positional words.
ALLOWED = (re.compile(r"with invoke, after --: invoke \w+ --"),)


def _strings(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    ]


def test_no_string_tells_users_to_run_invoke():
    said = re.compile(rf"\binvoke ({'|'.join(tasks.__all__)})\b")
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for line, text in _strings(path):
            for allowed in ALLOWED:
                text = allowed.sub("", text)
            found += [f"{path.relative_to(PACKAGE.parent)}:{line}: {m.group(0)}" for m in said.finditer(text)]
    assert found == []


def test_the_check_sees_a_planted_command(tmp_path):
    planted = tmp_path / "m.py"
    planted.write_text('FIX = f"run `invoke provision --lock {1}`"\n')
    assert [text for _, text in _strings(planted) if re.search(r"\binvoke provision\b", text)] == [
        "run `invoke provision --lock "
    ]
