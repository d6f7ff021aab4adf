"""What stackgate launched, recorded under the state folder, and what a dead run left, reaped:
against real processes, each pid checked to be still the process that was recorded."""

from __future__ import annotations

import json
import os
import subprocess

from smoke_support import dead_runs_server, living

from stackgate.serve import launched
from stackgate.serve.procs import read_stat


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


def test_a_pid_that_now_names_another_program_is_left_alone():
    other = subprocess.Popen(["sleep", "600"], start_new_session=True)
    try:
        wrong = read_stat(other.pid).starttime - 1  # type: ignore[union-attr]
        processes = {str(other.pid): wrong}
        launcher = {"pid": 1, "starttime": -1}  # init, started at another time: not a running launcher
        body = {"schema": launched.SCHEMA, "launcher": launcher, "pgid": other.pid, "argv": [], "processes": processes}
        record = launched.folder() / f"{other.pid}-1.json"
        record.parent.mkdir(parents=True)
        record.write_text(json.dumps(body))
        assert launched.reap() == []
        assert living([other.pid]) == [other.pid] and not record.exists()
    finally:
        other.kill()
        other.wait()


def test_the_record_of_a_running_launcher_is_left_alone_and_follows_its_processes():
    server = subprocess.Popen(["sleep", "600"], start_new_session=True)
    try:
        record = launched.Record(server.pid, ["sleep", "600"])
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
