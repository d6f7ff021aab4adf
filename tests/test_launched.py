"""What stackgate launched, recorded under the state folder, and what a dead run left, reaped:
against real processes, each pid checked to be still the process that was recorded."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest
from smoke_support import dead_runs_server, living, wait_for

from stackgate.serve import launched
from stackgate.serve.procs import processes, read_stat


def test_a_dead_runs_group_is_ended_with_the_members_its_last_look_missed():
    pids, record = dead_runs_server(recorded=2)  # the leader and one worker recorded, one not
    try:
        (reaped,) = launched.reap()
        assert living(pids) == [] and not record.exists()
        assert sorted(int(text.split()[0]) for text in reaped.ended) == sorted(pids) and reaped.left == ()
        lines = launched.reaped_lines([reaped])
        assert lines[0].startswith("ended 3 process(es) that a dead stackgate run left running (launched ")
        assert lines[0].endswith("(python -m stackgate smoke --benchmark)):") and len(lines) == 4
    finally:
        for pid in living(pids):
            os.kill(pid, 9)


def test_a_launcher_s_recorded_command_line_is_told_on_one_line(dead_run):
    """A launcher started as ``python -c "<script>"`` recorded its line breaks: the message keeps one line."""
    pids, record = dead_run
    body = json.loads(record.read_text())
    body["launcher"]["command"] = "python -c 'import stackgate\nstackgate.main()'\x1b[2J"
    record.write_text(json.dumps(body))
    lines = launched.reaped_lines(launched.reap())
    assert living(pids) == [] and len(lines) == 4, lines
    assert lines[0].endswith("(python -c 'import stackgate\\nstackgate.main()'\\x1b[2J)):"), lines[0]


def test_a_pid_that_now_names_another_program_is_left_alone():
    other = subprocess.Popen(["sleep", "600"], start_new_session=True)
    try:
        wrong = read_stat(other.pid).starttime - 1  # type: ignore[union-attr]
        processes = {str(other.pid): wrong}
        record = plant(forged(other.pid, processes, ["sleep", "600"]))
        assert launched.reap() == []
        assert living([other.pid]) == [other.pid] and not record.exists()
    finally:
        other.kill()
        other.wait()


def test_the_record_of_a_running_launcher_is_left_alone_and_follows_its_processes():
    server = subprocess.Popen(["sleep", "600"], start_new_session=True)
    try:
        record = launched.Record(server.pid, ["sleep", "600"], launched.new_token())
        start = read_stat(server.pid).starttime  # type: ignore[union-attr]
        record.update({server.pid: start})
        written = json.loads(record.path.read_text())
        assert written["launcher"]["pid"] == os.getpid() and written["processes"] == {str(server.pid): start}
        assert launched.reap() == [] and living([server.pid]) == [server.pid] and record.path.exists()
        record.forget()
        assert not record.path.exists()
    finally:
        server.kill()
        server.wait()


def test_an_unreadable_record_is_removed_and_names_nothing():
    record = launched.folder() / "12-34.json"
    record.parent.mkdir(parents=True)
    record.write_text("{not json")
    assert launched.reap() == [] and not record.exists()


# --- forged, foreign and planted records: the attacks of issue 29 ---------------------------------


def forged(pgid: int, processes: dict[str, int], argv: list[str], token: str = "0" * 32, **more: Any) -> dict:
    """A well-formed record of this machine whose launcher (pid 1 at another start time) is not running."""
    return {
        "schema": launched.SCHEMA,
        "launcher": {"pid": 1, "starttime": -1, "command": "python -m stackgate smoke"},
        "launched_at": 0.0,
        **launched.this_machine(),
        "pgid": pgid,
        "argv": argv,
        "command_sha256": launched.command_sha256(argv),
        "token": token,
        "processes": processes,
        **more,
    }


def plant(body: dict, name: str | None = None) -> Path:
    record = launched.folder() / (name or f"{body['pgid']}-1.json")
    record.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    record.write_text(json.dumps(body))
    return record


def started(pid: int) -> int:
    """The process's start time, once its command line is in place (an exec just done may not show it yet)."""
    wait_for(lambda: Path(f"/proc/{pid}/cmdline").read_bytes() != b"")
    return read_stat(pid).starttime  # type: ignore[union-attr]


@pytest.fixture
def dead_run() -> Iterator[tuple[list[int], Path]]:
    """A dead run's server and its record (smoke_support.dead_runs_server); what a test left of it is killed."""
    pids, record = dead_runs_server()
    yield pids, record
    for pid in living(pids):
        os.kill(pid, 9)


@pytest.fixture
def bystanders() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes stackgate never launched (each test adds its own); killed afterwards."""
    made: list[subprocess.Popen[bytes]] = []
    yield made
    for process in made:
        process.kill()
        process.wait()


def test_a_forged_record_naming_an_unrelated_sleep_with_its_command_line_leaves_it_running(bystanders):
    """The pid, its real start time, its group and even its command line: no launch marker, no kill."""
    sleep = subprocess.Popen(["sleep", "600"], start_new_session=True)
    bystanders.append(sleep)
    record = plant(forged(sleep.pid, {str(sleep.pid): started(sleep.pid)}, ["sleep", "600"]))
    reaped = launched.reap()
    assert living([sleep.pid]) == [sleep.pid] and not record.exists()
    lines = launched.reaped_lines(reaped)
    assert lines[0] == (
        f"the launch record {record} is refused: its process {sleep.pid} does not run the recorded command line "
        "with the launch marker; they were not signalled"
    ), lines
    assert lines[1].startswith(f"  left running: {sleep.pid} (sleep 600)")


def test_a_forged_record_naming_one_member_of_another_session_spares_the_whole_session(bystanders):
    shell = subprocess.Popen(
        ["sh", "-c", "sleep 600 & sleep 600 & echo $!; wait"], stdout=subprocess.PIPE, start_new_session=True
    )
    bystanders.append(shell)
    member = int(shell.stdout.readline())  # type: ignore[union-attr]
    session = [shell.pid, *(s.pid for s in processes() if s.session == shell.pid and s.pid != shell.pid)]
    plant(forged(shell.pid, {str(member): started(member)}, ["sleep", "600"]))  # its leader is not named
    (reaped,) = launched.reap()
    assert sorted(living(session)) == sorted(session) and len(session) == 3
    assert reaped.ended == () and "carry no marker of its launch" in str(reaped.refused)


@pytest.mark.parametrize("group", ["init's", "stackgate's own"])
def test_a_record_naming_init_or_stackgates_own_group_is_refused_even_with_the_marker(group, bystanders):
    token = launched.new_token()
    env = {**os.environ, launched.MARKER: token}
    marked = subprocess.Popen(["sleep", "600"], env=env)  # in this process's group and session
    bystanders.append(marked)
    pgid = 1 if group == "init's" else os.getpgrp()
    plant(forged(pgid, {str(marked.pid): started(marked.pid)}, ["sleep", "600"], token), f"{pgid}-9.json")
    (reaped,) = launched.reap()
    assert living([marked.pid]) == [marked.pid] and reaped.ended == ()
    assert f"it names process group {pgid} and processes [{marked.pid}]: init's or this stackgate's own" in str(
        reaped.refused
    )


def test_a_symlinked_launched_folder_is_never_followed_and_its_targets_json_survive(tmp_path):
    elsewhere = tmp_path / "precious"
    elsewhere.mkdir()
    for name in ("settings.json", "12-34.json"):
        (elsewhere / name).write_text("{not a record")
    launched.folder().parent.mkdir(parents=True, exist_ok=True)
    launched.folder().symlink_to(elsewhere)
    (reaped,) = launched.reap()
    assert sorted(p.name for p in elsewhere.iterdir()) == ["12-34.json", "settings.json"]
    assert reaped.refused is not None and "is a symbolic link" in reaped.refused and "never followed" in reaped.refused
    record = launched.Record(os.getpid(), ["sleep"], launched.new_token())
    record.update({})
    assert "is a symbolic link" in str(record.error) and sorted(p.name for p in elsewhere.iterdir()) == [
        "12-34.json",
        "settings.json",
    ]


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_a_record_owned_by_another_user_is_refused_and_kept(dead_run):
    pids, record = dead_run
    os.chown(record, 65534, 65534)
    (reaped,) = launched.reap()
    assert living(pids) == pids and record.exists()
    assert reaped.refused == (
        f"the launch record {record} is refused: is owned by uid 65534, not by this user (uid 0): refused; "
        f"stackgate trusts only its own user's files here: `rm -- {record}` (after a look at it), "
        "or run as its owner"
    )


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_a_launched_folder_of_another_user_is_not_read_as_sudo_minus_e_would(dead_run):
    pids, record = dead_run
    os.chown(record.parent, 65534, 65534)
    (reaped,) = launched.reap()
    assert living(pids) == pids and record.exists()
    assert f"the launch records in {record.parent} are not read: is owned by uid 65534" in str(reaped.refused)
    assert "give this user a state folder of its own (sudo without -E, or XDG_STATE_HOME)" in str(reaped.refused)
    assert launched.reaped_lines([reaped]) == [f"{reaped.refused}; nothing was signalled"]


def test_a_record_others_may_write_is_refused(dead_run):
    pids, record = dead_run
    record.chmod(0o666)
    (reaped,) = launched.reap()
    assert living(pids) == pids and "is writable by others (mode 0666)" in str(reaped.refused)


def test_a_folder_others_may_write_is_refused_and_one_they_may_only_read_is_made_private(dead_run):
    pids, record = dead_run
    record.parent.chmod(0o777)
    (reaped,) = launched.reap()
    assert living(pids) == pids and "is writable by others (mode 0777)" in str(reaped.refused)
    assert f"`chmod 700 -- {record.parent}` (after a look at what is in it)" in str(reaped.refused)
    record.parent.chmod(0o755)  # as earlier stackgates made it
    (reaped,) = launched.reap()
    assert living(pids) == [] and len(reaped.ended) == 3 and record.parent.stat().st_mode & 0o777 == 0o700


def test_a_record_of_another_machine_or_namespace_is_left_alone_and_one_of_an_earlier_boot_names_nothing(dead_run):
    pids, record = dead_run
    body = json.loads(record.read_text())
    for other in ({"host": "elsewhere", "boot_id": "its-boot"}, {"pid_ns": "pid:[1]"}):  # a shared home; a container
        record.write_text(json.dumps({**body, **other}))
        assert launched.reap() == [] and living(pids) == pids and record.exists()
    record.write_text(json.dumps({**body, "boot_id": "an-earlier-boot"}))  # this host, before a reboot
    assert launched.reap() == [] and living(pids) == pids and not record.exists()
    record.write_text(json.dumps({**body, "host": "renamed-since"}))  # this boot: its pids are this machine's
    (reaped,) = launched.reap()
    assert living(pids) == [] and len(reaped.ended) == 3


def test_a_genuine_launch_is_written_privately_and_carries_its_marker(tmp_path):
    from stackgate.serve import launch

    server = launch.start([sys.executable, "-c", "import time; time.sleep(600)"], dict(os.environ), tmp_path / "s.log")
    try:
        body = json.loads(server.record.path.read_text())  # type: ignore[union-attr]
        environ = Path(f"/proc/{server.pid}/environ").read_bytes().split(b"\0")
        assert f"{launched.MARKER}={body['token']}".encode() in environ
        assert body["boot_id"] and body["host"] and body["pgid"] == server.pid
        assert server.record.path.stat().st_mode & 0o777 == 0o600  # type: ignore[union-attr]
        assert server.record.path.parent.stat().st_mode & 0o777 == 0o700  # type: ignore[union-attr]
    finally:
        launch.stop(server, 5.0)


def test_a_worker_whose_environment_shows_no_marker_is_ended_through_its_proven_group(bystanders):
    """As SGLang's schedulers look once setproctitle has overwritten their environment's copy in /proc."""
    script = (
        "import subprocess, time; w = subprocess.Popen(['sleep', '600'], env={}); "
        "print(w.pid, flush=True); time.sleep(600)"
    )
    argv = [sys.executable, "-c", script]
    token = launched.new_token()
    leader = subprocess.Popen(
        argv, stdout=subprocess.PIPE, env={**os.environ, launched.MARKER: token}, start_new_session=True
    )
    bystanders.append(leader)
    worker = int(leader.stdout.readline())  # type: ignore[union-attr]
    assert f"{launched.MARKER}=".encode() not in Path(f"/proc/{worker}/environ").read_bytes()
    plant(forged(leader.pid, {str(p): started(p) for p in (leader.pid, worker)}, argv, token))
    (reaped,) = launched.reap()
    assert living([leader.pid, worker]) == [] and reaped.refused is None and len(reaped.ended) == 2


@pytest.mark.parametrize("kind", ["a symbolic link", "a FIFO"])
def test_a_record_that_is_not_a_regular_file_is_refused_unread_and_what_it_names_survives(tmp_path, kind):
    elsewhere = tmp_path / "settings.json"
    elsewhere.write_text("{}")
    record = launched.folder() / "12-34.json"
    record.parent.mkdir(mode=0o700, parents=True)
    record.symlink_to(elsewhere) if kind == "a symbolic link" else os.mkfifo(record)
    (reaped,) = launched.reap()  # a FIFO is not waited on
    why = "is a symbolic link (to " if kind == "a symbolic link" else "is not a regular file"
    assert f"the launch record {record} is refused: {why}" in str(reaped.refused)
    assert elsewhere.read_text() == "{}" and os.path.lexists(record)
