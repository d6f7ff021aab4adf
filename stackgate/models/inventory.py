"""A fleet's nodes: ``--hosts a,b,c`` or an inventory TOML, read as hostile input.

Every problem of an inventory is collected with its key path (``node[2].port: ...``) and the
command exits 2 before it connects anywhere. What a node's values may hold is narrow on purpose,
because they end up in SSH connections, in file names, in Prometheus labels and on terminals:
names and hosts are plain words (no spaces, no shell characters, no leading ``-``).

An inventory::

    [fleet]                      # defaults for every node (all optional)
    user = "ops"
    port = 22
    identity = "~/.ssh/fleet_ed25519"
    known_hosts = "~/.ssh/known_hosts"
    stackgate = "stackgate"      # the installed program on the nodes
    connect_timeout_s = 10
    timeout_s = 7200             # one node's whole run

    [[node]]
    name = "gpu01"               # default: the host
    host = "10.0.0.11"
    port = 2222                  # any [fleet] key may be set per node
"""

from __future__ import annotations

import difflib
import ipaddress
import math
import re
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping

from stackgate.models import inputfile
from stackgate.models.exitcodes import UsageError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - the 3.10 floor
    import tomli as tomllib

__all__ = [
    "DEFAULT_CONNECT_TIMEOUT_S",
    "DEFAULT_TIMEOUT_S",
    "Node",
    "host_problem",
    "load_inventory",
    "parse_hosts",
    "parse_inventory",
]

DEFAULT_CONNECT_TIMEOUT_S = 10.0
DEFAULT_TIMEOUT_S = 7200.0  #: a full gate loads real weights: minutes, not seconds
_WORD = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,62}$")
#: One label of a host name (RFC 1123, and the ``_`` some inventories hold): no empty label, no
#: leading or trailing ``-``.
_LABEL = re.compile(r"^[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?$")
_USER = re.compile(r"^[A-Za-z_][A-Za-z0-9._-]{0,31}$")
_PROGRAM = re.compile(r"^[A-Za-z0-9_./~+-]{1,4096}$")
NODE_KEYS = ("name", "host", "port", "user", "identity", "known_hosts", "stackgate", "connect_timeout_s", "timeout_s")
FLEET_KEYS = tuple(k for k in NODE_KEYS if k not in ("name", "host"))
#: An error lists this many problems and counts the rest.
SHOWN_PROBLEMS = 20


@dataclass(frozen=True)
class Node:
    """One node: where to reach it, as whom, and which stackgate to run there."""

    name: str
    host: str
    port: int = 22
    user: str | None = None  #: None: the controller's user
    identity: Path | None = None  #: None: the SSH agent and ~/.ssh's usual keys
    known_hosts: Path | None = None  #: None: ~/.ssh/known_hosts (an unknown host key is refused)
    stackgate: str = "stackgate"
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S
    timeout_s: float = DEFAULT_TIMEOUT_S
    engine: str = "ssh"  #: ssh, or slurm: a Slurm node, reached through srun by its Slurm name

    @property
    def address(self) -> str:
        """``user@host:port`` as a person reads it (``slurm:NAME`` for a Slurm node)."""
        if self.engine == "slurm":
            return f"slurm:{self.name}"
        return f"{self.user + '@' if self.user else ''}{self.host}:{self.port}"


def host_problem(host: str) -> str | None:
    """Why ``host`` is not a host name or an IP address (None when it is one); read as text only,
    never looked up: an IPv6 address (bare, or in brackets) must be one, digits and dots an IPv4
    address, anything else a host name of labels.

    >>> [host_problem(h) for h in ("gpu01.example", "10.0.0.1", "[::1]", "fe80::1")]
    [None, None, None, None]
    >>> {host_problem(h) for h in ("127.0.0.1:65536", ":", "1:2:3:4:5:6:7:8:9:10")}
    {'a colon makes it an IPv6 address, and it is none; a port goes in `port` (in --hosts: host:port)'}
    >>> host_problem("300.1.1.1"), host_problem("a..b") == host_problem("-oProxyCommand=x")
    ('digits and dots make it an IPv4 address, and it is none', True)
    """
    inner = host[1:-1] if host.startswith("[") and host.endswith("]") else None
    if inner is not None or ":" in host:
        try:
            ipaddress.IPv6Address(inner if inner is not None else host)
        except ValueError:
            return "a colon makes it an IPv6 address, and it is none; a port goes in `port` (in --hosts: host:port)"
        return None
    if re.fullmatch(r"[0-9.]+", host):
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            return "digits and dots make it an IPv4 address, and it is none"
        return None
    if len(host) > 253 or not all(_LABEL.match(label) for label in host.split(".")):
        return "a host name is labels of letters, digits, '-' and '_', joined by dots"
    return None


def parse_hosts(text: str) -> list[Node]:
    """``--hosts``: comma-separated ``[user@]host[:port]``, each node named after its host.

    >>> [n.address for n in parse_hosts("a, ops@b:2222")]
    ['a:22', 'ops@b:2222']
    >>> parse_hosts("a,-oProxyCommand=x")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    stackgate.models.exitcodes.UsageError: --hosts: 1 problem:
      --hosts[1]: '-oProxyCommand=x' is not a host name or address (a host name is labels of ...)
    """
    problems: list[str] = []
    nodes = []
    words = [w.strip() for w in text.split(",")]
    for index, word in enumerate(words):
        node = _host_word(word, f"--hosts[{index}]", problems)
        if node is not None:
            nodes.append(node)
    if not [w for w in words if w]:
        problems.append("--hosts: no host given")
    _unique(nodes, "--hosts", problems)
    return _checked(nodes, "--hosts", problems)


def _host_word(word: str, where: str, problems: list[str]) -> Node | None:
    user, _, rest = word.rpartition("@") if "@" in word else ("", "", word)
    host, port_text = rest, ""
    if rest.count(":") == 1 or (rest.startswith("[") and "]:" in rest):
        host, _, port_text = rest.rpartition(":")
    if not word:
        return None
    before = len(problems)
    if user and not _USER.match(user):
        problems.append(f"{where}: user {user!r} is not a user name")
    why = host_problem(host)
    if why is not None:
        problems.append(f"{where}: {word!r} is not a host name or address ({why})")
    port = _port(port_text, where, problems) if port_text else 22
    if len(problems) > before:
        return None
    return Node(name=host.strip("[]"), host=host.strip("[]"), port=port, user=user or None)


def _port(value: Any, where: str, problems: list[str]) -> int:
    number = (
        value
        if isinstance(value, int) and not isinstance(value, bool)
        else int(value)
        if isinstance(value, str) and value.isdigit()
        else None
    )
    if number is None or not 1 <= number <= 65535:
        problems.append(f"{where}: port {value!r} is not a port number (1-65535)")
        return 22
    return number


def load_inventory(path: Path) -> list[Node]:
    """The nodes of an inventory file (see the module's docstring)."""
    try:
        text = inputfile.read_capped(path, inputfile.MAX_INVENTORY_BYTES).decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path}: cannot read the inventory: {getattr(exc, 'strerror', None) or exc}") from exc
    return parse_inventory(text, str(path), base=path.parent)


def parse_inventory(text: str, source: str = "inventory", *, base: Path | None = None) -> list[Node]:
    """The nodes of an inventory's text; relative paths are taken from ``base``."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{source}: not valid TOML: {exc}") from exc
    except RecursionError:
        raise UsageError(f"{source}: not valid TOML: nested too deeply") from None
    problems: list[str] = []
    _unknown(raw, ("fleet", "node"), "", problems)
    fleet = raw.get("fleet", {})
    if not isinstance(fleet, dict):
        problems.append(f"fleet: a table, not {type(fleet).__name__}")
        fleet = {}
    _unknown(fleet, FLEET_KEYS, "fleet.", problems)
    defaults = _values(fleet, "fleet", base, problems)
    entries = raw.get("node", [])
    if not isinstance(entries, list) or not entries:
        problems.append("node: no [[node]] table (each node is one [[node]] with at least its host)")
        entries = []
    nodes = [n for i, entry in enumerate(entries) if (n := _node(entry, i, defaults, base, problems)) is not None]
    _unique(nodes, "node", problems)
    return _checked(nodes, source, problems)


def _node(entry: Any, index: int, defaults: Mapping[str, Any], base: Path | None, problems: list[str]) -> Node | None:
    where = f"node[{index}]"
    if not isinstance(entry, dict):
        problems.append(f"{where}: a table, not {type(entry).__name__}")
        return None
    _unknown(entry, NODE_KEYS, f"{where}.", problems)
    host = entry.get("host")
    why = host_problem(host) if isinstance(host, str) else "a string"
    if host is None:
        problems.append(f"{where}.host: missing")
        return None
    if why is not None:
        problems.append(f"{where}.host: {host!r} is not a host name or address ({why})")
        return None
    name = entry.get("name", host)
    if not isinstance(name, str) or not _WORD.match(name):
        problems.append(f"{where}.name: {name!r} is not a node name (letters, digits, '.', '_', '-'; at most 63)")
        return None
    own = _values(entry, where, base, problems)
    return replace(Node(name=name, host=host.strip("[]")), **{**defaults, **own})


def _values(table: Mapping[str, Any], where: str, base: Path | None, problems: list[str]) -> dict[str, Any]:
    """The settable keys of a [fleet] or [[node]] table, each checked."""
    found: dict[str, Any] = {}
    for key in FLEET_KEYS:
        if key not in table:
            continue
        value, path = table[key], f"{where}.{key}"
        if key == "port":
            found[key] = _port(value, path, problems)
        elif key == "user":
            _text(value, _USER, path, "a user name", problems, found, key)
        elif key == "stackgate":
            _text(
                value,
                _PROGRAM,
                path,
                "a program path (letters, digits, '/', '.', '_', '-', '~', '+')",
                problems,
                found,
                key,
            )
        elif key in ("identity", "known_hosts"):
            if isinstance(value, str) and value and "\x00" not in value:
                found[key] = _path(value, base)
            else:
                problems.append(f"{path}: {value!r} is not a file path")
        else:
            _seconds(value, path, problems, found, key)
    return found


def _text(
    value: Any, pattern: re.Pattern[str], path: str, what: str, problems: list[str], found: dict[str, Any], key: str
) -> None:
    if isinstance(value, str) and pattern.match(value) and not value.startswith("-"):
        found[key] = value
    else:
        problems.append(f"{path}: {value!r} is not {what}")


def _seconds(value: Any, path: str, problems: list[str], found: dict[str, Any], key: str) -> None:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0:
        found[key] = float(value)
    else:
        problems.append(f"{path}: {value!r} is not a number of seconds above 0")


def _path(value: str, base: Path | None) -> Path:
    path = Path(value).expanduser()
    return path if path.is_absolute() or base is None else base / path


def _unknown(table: Mapping[str, Any], known: tuple[str, ...], prefix: str, problems: list[str]) -> None:
    for key in table:
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            problems.append(f"{prefix}{key}: unknown key" + (f" (did you mean {close[0]!r}?)" if close else ""))


def _unique(nodes: list[Node], where: str, problems: list[str]) -> None:
    """Each name once, and each address (host and port) once: two names for one node would dial
    it twice and run the action on it twice at once."""
    seen: set[str] = set()
    addresses: dict[tuple[str, int], str] = {}
    for node in nodes:
        if node.name in seen:
            problems.append(f"{where}: the node name {node.name!r} is given twice")
        seen.add(node.name)
        key = (_canonical(node.host), node.port)
        if key in addresses and addresses[key] != node.name:
            first = addresses[key]
            address = f"{node.host}:{node.port}"
            problems.append(f"{where}: {node.name!r} has the address {address} of {first!r} (the same node twice)")
        addresses.setdefault(key, node.name)


def _canonical(host: str) -> str:
    """A host as one text per node: an IP address in its compressed form, a name in lower case
    (no lookup: ``localhost`` and ``127.0.0.1`` stay two)."""
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return host.lower()


def _checked(nodes: list[Node], source: str, problems: list[str]) -> list[Node]:
    """``nodes``, or the problems raised at once: the first :data:`SHOWN_PROBLEMS` of them listed,
    the rest counted (an inventory of 10,000 hosts names each of its duplicates otherwise)."""
    if problems:
        count = f"{len(problems)} problem{'s' if len(problems) > 1 else ''}"
        shown = problems[:SHOWN_PROBLEMS]
        more = len(problems) - len(shown)
        rest = [f"... and {more} more (fix these and run it again to see the rest)"] if more else []
        raise UsageError(f"{source}: {count}:\n  " + "\n  ".join([*shown, *rest]))
    return nodes
