"""Write the stand-in server's table of SGLang's server arguments, read from a released wheel.

The stand-in must refuse what SGLang refuses and report in /server_info what SGLang reports, so
it takes its flags and defaults from the wheel's own ``sglang/srt/server_args.py``, read with
``ast`` (nothing is imported: the wheel needs torch). Run it again for another release:

    python tests/fakes/make_server_args_table.py /tmp/wheels/sg > tests/fakes/sglang/server_args.json
"""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path
from typing import Any

_TYPES = {
    "str": "str",
    "int": "int",
    "float": "float",
    "nullable_str": "str",
    "json_list_type": "json",
    "loads": "json",
}


def _literal(node: ast.AST | None, module: dict[str, Any], fields: dict[str, Any]) -> Any:
    """A node's value when it is a literal, a module constant or a ServerArgs default; else None."""
    if node is None:
        return None
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "ServerArgs":
        return fields.get(node.attr)
    if isinstance(node, ast.Name):
        return module.get(node.id)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("list", "set", "sorted"):
        inner = _literal(node.args[0], module, fields) if node.args else []
        return sorted(inner) if isinstance(inner, (list, set, tuple)) else None
    try:
        value = ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError):
        return None
    return sorted(value) if isinstance(value, set) else value


def _field_default(node: ast.AST | None, module: dict[str, Any]) -> Any:
    if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "field":
        for kw in node.keywords:
            if kw.arg == "default":
                return _literal(kw.value, module, {})
            if kw.arg == "default_factory":
                return {"list": [], "dict": {}}.get(getattr(kw.value, "id", ""))
        return None
    return _literal(node, module, {})


def table(source: str) -> dict[str, Any]:
    tree = ast.parse(source)
    module: dict[str, Any] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            module[node.targets[0].id] = _literal(node.value, module, {})
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ServerArgs")
    fields = {
        n.target.id: _field_default(n.value, module)
        for n in cls.body
        if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
    }
    arguments = []
    for call in ast.walk(cls):
        if not (isinstance(call, ast.Call) and getattr(call.func, "attr", "") == "add_argument"):
            continue
        flags = [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        if not flags or not flags[0].startswith("--"):
            continue
        kw = {k.arg: k.value for k in call.keywords}
        action = _literal(kw.get("action"), module, fields) if "action" in kw else "store"
        if isinstance(kw.get("action"), ast.Name):
            action = kw["action"].id
        type_node = kw.get("type")
        type_name = getattr(type_node, "id", None) or getattr(type_node, "attr", None) or "str"
        dest = _literal(kw.get("dest"), module, fields) or flags[0][2:].replace("-", "_")
        arguments.append(
            {
                "flags": flags,
                "dest": dest,
                "action": action,
                "type": _TYPES.get(type_name, "str"),
                "nargs": _literal(kw.get("nargs"), module, fields),
                "choices": _literal(kw.get("choices"), module, fields),
                "required": bool(_literal(kw.get("required"), module, fields)),
                "default": _literal(kw.get("default"), module, fields) if "default" in kw else fields.get(dest),
            }
        )
    return {"fields": fields, "arguments": arguments, "renamed": _renamed(cls)}


def _renamed(cls: ast.ClassDef) -> dict[str, str]:
    """``from_cli_args`` copies some parsed names onto the field names: tp_size = tensor_parallel_size."""
    method = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "from_cli_args")
    renamed = {}
    for node in method.body:
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.targets[0], ast.Attribute)
            and isinstance(node.value, ast.Attribute)
        ):
            renamed[node.targets[0].attr] = node.value.attr
    return renamed


def main(wheel: str) -> None:
    root = Path(wheel) / "sglang"
    metadata = next(Path(wheel).glob("sglang-*.dist-info")) / "METADATA"
    version = next(
        line.split(":", 1)[1].strip() for line in metadata.read_text().splitlines() if line.startswith("Version:")
    )
    data = table((root / "srt" / "server_args.py").read_text())
    data = {"sglang_version": version, "source": "sglang/srt/server_args.py", **data}
    json.dump(data, sys.stdout, indent=1, sort_keys=False, default=str)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main(sys.argv[1])
