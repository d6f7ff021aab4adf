"""Generations, the atomic switch, pruning, rollback and the one-provision-at-a-time lock."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from stackgate.stack import generations

ROOT = Path(__file__).resolve().parents[1]


def _ready(root: Path, count: int) -> list[generations.Generation]:
    made = []
    for _ in range(count):
        state = generations.read(root)
        generation = generations.create(
            generations.generations_dir(root) / state.next_id, {"lock": {"path": "/x.toml"}, "spec": {"n": len(made)}}
        )
        (generation.path / "bin").mkdir()
        (generation.path / "bin" / "python").write_text("")
        made.append(generations.mark(generation, "ready"))
    return made


def test_an_empty_root_has_no_current(tmp_path: Path) -> None:
    state = generations.read(tmp_path / "root")
    assert state.current is None and state.generations == () and state.current_error is None
    assert state.next_id.startswith("0001-")


def test_ids_count_up_and_a_new_generation_is_building(tmp_path: Path) -> None:
    first, second = _ready(tmp_path, 2)
    assert (first.number, second.number) == (1, 2)
    third = generations.create(generations.generations_dir(tmp_path) / generations.read(tmp_path).next_id, {})
    assert third.number == 3 and third.state == "building"
    assert json.loads((third.path / generations.MARKER).read_text())["state"] == "building"


def test_switch_points_current_at_a_ready_generation_by_a_relative_link(tmp_path: Path) -> None:
    first, second = _ready(tmp_path, 2)
    generations.switch(tmp_path, first)
    generations.switch(tmp_path, second)
    link = tmp_path / "current"
    assert os.readlink(link) == f"generations/{second.id}"
    assert generations.read(tmp_path).current.id == second.id
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".current")] == []


def test_switch_refuses_a_generation_that_is_not_ready(tmp_path: Path) -> None:
    building = generations.create(generations.generations_dir(tmp_path) / "0001-x", {})
    with pytest.raises(generations.GenerationError, match="building, not ready"):
        generations.switch(tmp_path, building)
    assert not (tmp_path / "current").exists()


def test_a_current_link_to_elsewhere_is_reported_not_followed(tmp_path: Path) -> None:
    (tmp_path / "elsewhere").mkdir()
    os.symlink(tmp_path / "elsewhere", tmp_path / "current")
    state = generations.read(tmp_path)
    assert state.current is None
    assert (
        state.current_error
        == f"{tmp_path / 'current'} points at {tmp_path / 'elsewhere'}, which is not a generation of {tmp_path}"
    )


def test_discard_removes_unfinished_generations_but_never_current(tmp_path: Path) -> None:
    (good,) = _ready(tmp_path, 1)
    generations.switch(tmp_path, good)
    broken = generations.create(generations.generations_dir(tmp_path) / generations.read(tmp_path).next_id, {})
    (generations.generations_dir(tmp_path) / "0009-no-marker").mkdir()  # killed before its marker
    removed = generations.discard_unfinished(generations.read(tmp_path))
    assert sorted(g.id for g in removed) == sorted([broken.id, "0009-no-marker"])
    assert [g.id for g in generations.read(tmp_path).generations] == [good.id]


def test_sweep_removes_what_a_run_killed_while_removing_left_and_nothing_else(tmp_path: Path) -> None:
    (good,) = _ready(tmp_path, 1)
    generations.switch(tmp_path, good)
    half = generations.generations_dir(tmp_path) / ".0002-x.removing"  # renamed, then the kill came
    (half / "lib").mkdir(parents=True)
    (half / "lib" / "torch.so").write_bytes(b"\0" * 1000)
    os.symlink("generations/0002-x", tmp_path / ".current.4242.part")  # a switch killed before its rename
    (tmp_path / ".hidden-by-the-user").mkdir()
    assert generations.read(tmp_path).unfinished == ()  # invisible to the plan: only sweep sees them
    removed = generations.sweep(tmp_path)
    assert removed == [half, tmp_path / ".current.4242.part"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [".hidden-by-the-user", "current", "generations"]
    assert [p.name for p in generations.generations_dir(tmp_path).iterdir()] == [good.id]
    assert generations.sweep(tmp_path) == [] and generations.sweep(tmp_path / "nothing-here") == []


def test_prune_keeps_current_and_the_ones_current_before_it(tmp_path: Path) -> None:
    made = _ready(tmp_path, 6)
    for generation in made[:4]:
        generations.switch(tmp_path, generation)
    generations.create(generations.generations_dir(tmp_path) / "0007-x", {})
    removed = generations.prune(generations.read(tmp_path), keep=3)
    # made[4] and made[5] are ready but were never current: left by runs that did not switch.
    assert sorted(g.id for g in removed) == sorted([made[0].id, made[4].id, made[5].id, "0007-x"])
    assert [g.id for g in generations.read(tmp_path).generations] == [made[1].id, made[2].id, made[3].id]


def test_a_ready_generation_never_switched_to_is_resumable(tmp_path: Path) -> None:
    first, second = _ready(tmp_path, 2)
    generations.switch(tmp_path, first)
    assert generations.resumable(generations.read(tmp_path), {"other": 1}) is None
    spec_of_second = dict(second.marker or {}).get("spec")
    assert (
        generations.resumable(generations.read(tmp_path), spec_of_second) == generations.read(tmp_path).generations[1]
    )
    generations.switch(tmp_path, second)
    generations.rollback(tmp_path)  # rolled back from: never resumed
    assert generations.resumable(generations.read(tmp_path), spec_of_second) is None


def test_rollback_goes_back_one_generation_that_was_current_at_a_time(tmp_path: Path) -> None:
    made = _ready(tmp_path, 4)
    for generation in (made[0], made[1], made[3]):
        generations.switch(tmp_path, generation)  # made[2] was built but never current: skipped
    before, after = generations.rollback(tmp_path)
    assert (before.id, after.id) == (made[3].id, made[1].id)
    before, after = generations.rollback(tmp_path)
    assert (before.id, after.id) == (made[1].id, made[0].id)
    with pytest.raises(
        generations.GenerationError, match=f"no earlier ready generation .* \\(current: {made[0].id}\\)"
    ):
        generations.rollback(tmp_path)
    assert generations.read(tmp_path).current.id == made[0].id
    generations.switch(tmp_path, generations.read(tmp_path).generations[2])  # a new one, later
    before, after = generations.rollback(tmp_path)
    assert after.id == made[0].id  # not made[1] or made[3]: both were rolled back from


def test_rollback_without_current_says_so(tmp_path: Path) -> None:
    with pytest.raises(generations.GenerationError, match="nothing to roll back"):
        generations.rollback(tmp_path)


_HOLD = """
import sys, time
from pathlib import Path
from stackgate.stack import generations
with generations.exclusive(Path(sys.argv[1]), wait=False, command="invoke provision --lock held.toml"):
    print("held", flush=True)
    time.sleep(float(sys.argv[2]))
    Path(sys.argv[1], "released").write_text("")  # the last thing done while holding it
"""


def _holder(root: Path, seconds: float) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        [sys.executable, "-c", _HOLD, str(root), str(seconds)], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    assert process.stdout is not None and process.stdout.readline().strip() == "held"
    return process


def test_a_second_provision_fails_at_once_naming_the_holder(tmp_path: Path) -> None:
    holder = _holder(tmp_path, 30)
    try:
        with pytest.raises(generations.Busy) as caught:
            with generations.exclusive(tmp_path, wait=False):
                pass
        assert holder.poll() is None  # refused while the holder still runs: at once, not after it
        message = str(caught.value)
        assert f"pid {holder.pid}, started " in message
        assert "command: invoke provision --lock held.toml" in message
    finally:
        holder.kill()
        holder.wait()


def test_the_busy_message_gives_the_callers_advice(tmp_path: Path) -> None:
    holder = _holder(tmp_path, 30)
    try:
        with pytest.raises(generations.Busy, match=r"command: invoke provision --lock held.toml; run it again later$"):
            with generations.exclusive(tmp_path, wait=False, busy_advice="run it again later"):
                pass
    finally:
        holder.kill()
        holder.wait()


def test_wait_waits_for_the_holder(tmp_path: Path) -> None:
    holder = _holder(tmp_path, 1.5)
    waited = []
    with generations.exclusive(tmp_path, wait=True, on_wait=waited.append):
        assert (tmp_path / "released").exists()  # we got the lock only once the holder let it go
    assert waited and f"pid {holder.pid}" in waited[0]
    holder.wait()


def test_a_holder_killed_by_sigkill_releases_the_lock(tmp_path: Path) -> None:
    holder = _holder(tmp_path, 60)
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    with generations.exclusive(tmp_path, wait=False, command="next"):
        text = json.loads((tmp_path / generations.LOCK_FILE).read_text())
        assert text["pid"] == os.getpid() and text["command"] == "next"


def test_a_failed_generation_is_kept_for_inspection_never_switched_or_rolled_back_to(tmp_path: Path) -> None:
    first, second = _ready(tmp_path, 2)
    generations.switch(tmp_path, first)
    failed = [
        generations.mark(
            generations.create(generations.generations_dir(tmp_path) / generations.read(tmp_path).next_id, {}),
            "failed",
            failures=[f"gpu.count: {n}"],
        )
        for n in (1, 2)
    ]
    state = generations.read(tmp_path)
    assert state.unfinished == () and [g.id for g in state.failed] == [g.id for g in failed]
    removed = generations.discard_unfinished(state)
    assert [g.id for g in removed] == [failed[0].id] and failed[1].path.is_dir()  # the newest failed one stays
    with pytest.raises(generations.GenerationError, match="failed, not ready"):
        generations.switch(tmp_path, failed[1])
    with pytest.raises(
        generations.GenerationError,
        match=(
            f"generation {failed[1].id} .*failed its checks \\(gpu.count: 2\\): it is kept for inspection, never "
            "rolled "
            "back to"
        ),
    ):
        generations.rollback(tmp_path, failed[1])
    generations.switch(tmp_path, second)
    assert generations.rollback_target(generations.read(tmp_path)).id == first.id
    assert failed[1].path.is_dir() and failed[1].id not in [
        g.id for g in generations.prune(generations.read(tmp_path), keep=2)
    ]
