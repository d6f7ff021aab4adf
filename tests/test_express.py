"""The express lane of `stackgate verify --cached` (stackgate.express): every command line it takes is
parsed as the program's own parser (invoke's, through stackgate.program) parses it, and every one it
does not take is left to that parser, whose errors stay the only ones. The lane's run against the
program's is in tests/test_verify_cached.py."""

from __future__ import annotations

from typing import Any

import pytest
from support import parsed

from stackgate import express
from stackgate import program as cliprogram

#: The verify task's arguments the lane sets, with the program's defaults.
DEFAULTS: dict[str, Any] = {
    "lock": None,
    "json": None,
    "junit": None,
    "prom": None,
    "check": [],
    "cached": False,
    "strict": False,
    "deep": False,
    "list": False,
    "verbose": 0,
}

TAKEN = [
    ["verify", "--cached"],
    ["verify", "--cached", "--prom", "/var/lib/node/stackgate.prom"],
    ["verify", "--lock", "a.toml", "--cached", "--json", "-"],
    ["verify", "--cached", "-l", "a b.toml", "-j", "r.json", "--junit", "r.xml", "--strict"],
    ["verify", "-s", "--cached", "--lock=a.toml", "--prom=n.prom", "--json=-"],
    ["verify", "--cached", "--check", "gpu.*", "-c", "cuda.home", "--check=abi.elf"],
]
LEFT = [
    ["verify"],  # not cached
    ["verify", "--lock", "a.toml"],
    ["verify", "--cached", "--deep"],  # the command says it is bad usage
    ["verify", "--cached", "-v"],
    ["verify", "--cached", "-vv"],
    ["verify", "--cached", "--help"],
    ["verify", "--cached", "--list"],
    ["verify", "--cached", "--json"],  # a flag without its value
    ["verify", "--cached", "--json", "--strict"],  # a value that looks like a flag
    ["verify", "--cached", "--lock", "a.toml", "--lock", "b.toml"],
    ["verify", "--cached", "--cached"],
    ["verify", "--cached", "-l=a.toml"],
    ["verify", "--cached", "--lock="],
    ["verify", "--cached", "--bogus"],
    ["verify", "--cached", "extra-word"],
    ["--version"],
    ["smoke", "--cached"],
    [],
]


def program_arguments(argv: list[str]) -> dict[str, Any]:
    """The verify task's arguments as the program's parser reads ``argv`` (nothing runs)."""
    (context,) = parsed(*argv)
    assert context.name == "verify"
    values = {name.replace("-", "_"): argument.value for name, argument in context.args.items()}
    return {key: values[key] for key in DEFAULTS}


@pytest.mark.parametrize("argv", TAKEN, ids=" ".join)
def test_the_lane_reads_a_command_line_as_the_program_does(argv: list[str]) -> None:
    taken = express.flags(argv)
    assert taken is not None
    assert {**DEFAULTS, **taken} == program_arguments(argv)


@pytest.mark.parametrize("argv", LEFT, ids=" ".join)
def test_what_the_lane_does_not_take_is_left_to_the_program(argv: list[str]) -> None:
    assert express.flags(argv) is None
    assert express.health(argv) is None  # nothing ran, nothing printed: the program parses it


def test_every_flag_of_the_lane_is_one_of_the_verify_tasks() -> None:
    arguments = {flag for a in cliprogram.namespace["verify"].get_arguments() for flag in a.names}
    flags = {word.lstrip("-").replace("-", "_") for word in (*express.VALUED, *express.SWITCHES)}
    assert flags <= arguments, flags - arguments
    assert set(express.VALUED.values()) | set(express.SWITCHES.values()) <= set(DEFAULTS)
