"""Hostile settings files through the real command line: an inventory or a slurm-health --config
nested hundreds deep, an inventory of 10,000 hosts full of duplicates. Each is bad input: exit 2,
the file named, a bounded message, no traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_pylock_hostile import stackgate

DEEP = "[" * 500 + "]" * 500


@pytest.mark.parametrize(
    ("text", "command"),
    [
        (f'[[node]]\nhost = "a"\nx = {DEEP}\n', ["fleet", "verify", "--inventory"]),
        (f"[slurm-health]\nchecks = {DEEP}\n", ["slurm-health", "--config"]),
    ],
    ids=["inventory", "slurm-health-config"],
)
def test_a_file_nested_500_deep_exits_2_naming_it(tmp_path: Path, text: str, command: list[str]) -> None:
    path = tmp_path / "deep.toml"
    path.write_text(text)
    done = stackgate(*command, str(path), home=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"stackgate: {path}: not valid TOML: nested too deeply" in done.stderr and "Traceback" not in done.stderr


def test_an_inventory_of_10000_hosts_with_duplicates_lists_the_first_problems_and_counts_the_rest(
    tmp_path: Path,
) -> None:
    path = tmp_path / "nodes.toml"
    path.write_text("".join(f'[[node]]\nhost = "h{i % 5000}"\n' for i in range(10_000)))
    done = stackgate("fleet", "verify", "--inventory", str(path), home=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.splitlines()
    assert lines[0] == f"stackgate: {path}: 5000 problems:" and lines[1] == "  node: the node name 'h0' is given twice"
    assert lines[-1] == "  ... and 4980 more (fix these and run it again to see the rest)" and len(lines) == 22
