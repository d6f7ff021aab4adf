"""The run index: kept runs entered as they are written, a listing and a run by name read through
it, a stale index repaired (documents added, deleted or edited by hand), a damaged, newer or
locked database never losing a run (the documents are read instead, with a warning), two
writers at once, `report --reindex` and `report --regressed-since`."""

from __future__ import annotations

import io
import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from history_support import gate_doc, keep
from smoke_support import ROOT
from support import run_program

from stackgate.commands import report as reporting
from stackgate.models.result import Status
from stackgate.render.ui import UI
from stackgate.runs import catalog, history, index

TESTS = ROOT / "tests"


def stackgate(*args: str, folder: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return run_program("report", *args, env={"STACKGATE_HISTORY_DIR": str(folder), **(env or {})}, timeout=120)


def on_host(doc: dict, host: str, machine: str | None = None) -> dict:
    """The document as ``host`` wrote it (``machine`` None: a document of before the machine was recorded)."""
    return {**doc, "host": {**doc["host"], "hostname": host, "machine": machine}}


def day(n: int, hour: int = 10) -> str:
    return f"2026-11-{n:02d}T{hour:02d}:00:00+00:00"


def listing(folder: Path, last: int = 20) -> tuple[catalog.Listing, list[str]]:
    warnings: list[str] = []
    return catalog.listing(folder, last, warnings.append), warnings


def scanned(folder: Path, monkeypatch: pytest.MonkeyPatch, last: int = 20) -> catalog.Listing:
    with monkeypatch.context() as patch:
        patch.setenv("STACKGATE_HISTORY_INDEX", "off")
        return listing(folder, last)[0]


def rows(found: catalog.Listing) -> list[tuple]:
    return [(r.id, r.verdict, r.decode_tok_s, r.spec, r.short) for r in found.rows]


@pytest.fixture
def kept(tmp_path):
    folder = tmp_path / "runs"
    runs = [keep(folder, gate_doc(decode=90.0 + i, spec="standin" if i % 3 else "other"), day(1 + i)) for i in range(7)]
    return folder, runs


def test_a_kept_run_is_entered_and_the_listing_from_the_index_is_the_scans(kept, monkeypatch):
    folder, runs = kept
    assert index.database_path(folder).is_file()
    listing(folder)  # the first reader reconciles once: the folder's time was never seen complete
    with index.Store(folder) as db:
        assert db.fresh() and db.count() == 7 and db.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert db.db.execute("PRAGMA user_version").fetchone()[0] == index.SCHEMA_VERSION
        newest = db.newest(1)[0]
    assert (newest.id, newest.file, newest.kind, newest.decode_tok_s) == (
        runs[-1].id,
        runs[-1].path.name,
        "gate",
        pytest.approx(96.0),
    )
    indexed, warnings = listing(folder, last=3)
    assert warnings == [] and indexed.total == 7 and [r[0] for r in rows(indexed)] == [r.id for r in runs[-3:]]
    assert (
        rows(indexed) == rows(scanned(folder, monkeypatch, last=3))
        and indexed.trends == scanned(folder, monkeypatch).trends
    )
    assert indexed.trends[0][0] == "other" and indexed.trends[1] == (
        "standin",
        [pytest.approx(v) for v in (91.0, 92.0, 94.0, 95.0)],
    )


def test_documents_added_deleted_or_edited_by_hand_are_found_without_a_reindex(kept, monkeypatch):
    folder, runs = kept
    runs[0].path.unlink()
    copied = json.loads(runs[1].path.read_text())
    (folder / "by-hand.json").write_text(json.dumps({**copied, "run_id": "by-hand", "started": day(20)}))
    edited = json.loads(runs[-1].path.read_text())
    runs[-1].path.write_text(
        json.dumps({**edited, "verdict": "failed"}) + "\n" * 3
    )  # in place: the folder's time stays
    indexed, warnings = listing(folder)
    assert warnings == [] and indexed.total == 7
    assert rows(indexed) == rows(scanned(folder, monkeypatch))
    assert (
        indexed.rows[-1].id == "by-hand"
        and indexed.rows[-2].verdict == "failed"
        and runs[0].id not in [r.id for r in indexed.rows]
    )
    assert catalog.find("-1", folder, warnings.append).id == "by-hand"


def test_report_a_b_reads_only_the_two_documents(kept):
    folder, runs = kept
    for run in runs[1:-2]:
        run.path.write_text("garbage, written in place")  # a scan would warn about each of these
    done = stackgate("-2", "-1", folder=folder)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[:2] == [
        f"A: {runs[-2].label()}, started {runs[-2].started}",
        f"B: {runs[-1].label()}, started {runs[-1].started}",
    ]
    assert "warning" not in done.stderr
    assert stackgate(runs[0].id[:16], runs[-1].id, folder=folder).returncode == 0


def test_the_listing_shows_the_last_n_and_counts_every_run(kept):
    folder, runs = kept
    done = stackgate("--last", "2", folder=folder)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"the last 2 of 7 run(s) in {folder}, oldest first"
    assert [line.split()[0] for line in lines[2:4]] == [runs[-2].id, runs[-1].id]
    assert lines[4].startswith("trend other (decode tok/s, last 3 run(s))") and lines[5].startswith(
        "trend standin (decode tok/s, last 4 run(s))"
    )
    for args, text in [
        (("--last", "0"), "--last: 0"),
        (("--last", "x"), "--last: 'x' is not a whole number"),
        (("--threshold", "200", "--regressed-since", "2026-11-01"), "--threshold: 200"),
        (("--regressed-since", "monday"), "--regressed-since: 'monday' is not a date"),
        (("--reindex", "-1"), "--reindex takes no run"),
    ]:
        bad = stackgate(*args, folder=folder)
        assert bad.returncode == 2 and text in bad.stderr and "Traceback" not in bad.stderr, bad.stderr


def test_a_damaged_database_falls_back_to_the_scan_with_a_warning_and_reindex_repairs_it(kept, monkeypatch):
    folder, runs = kept
    for name in ("runs.sqlite3-wal", "runs.sqlite3-shm"):
        (folder / index.FOLDER / name).unlink(missing_ok=True)
    index.database_path(folder).write_bytes(b"this is not a database" * 100)
    done = stackgate(folder=folder)
    assert done.returncode == 0 and "Traceback" not in done.stderr
    assert (
        f"warning: the run index of {folder} cannot be used" in done.stderr and "--reindex` rebuilds it" in done.stderr
    )
    assert f"7 run(s) in {folder}" in done.stdout
    assert stackgate("-1", folder=folder).returncode == 0
    keep(folder, gate_doc(decode=99.0), day(28))  # still kept: the document is the truth
    assert len(list(folder.glob("*.json"))) == 8 and (folder / index.FOLDER / index.DIRTY).exists()
    rebuilt = stackgate("--reindex", folder=folder)
    assert rebuilt.returncode == 0 and f"indexed 8 run(s) of {folder}" in rebuilt.stdout, rebuilt.stderr
    after = stackgate(folder=folder)
    assert "warning" not in after.stderr and f"8 run(s) in {folder}" in after.stdout


def test_a_database_of_a_newer_stackgate_is_not_touched(kept):
    folder, _ = kept
    with sqlite3.connect(index.database_path(folder)) as db:
        db.execute(f"PRAGMA user_version = {index.SCHEMA_VERSION + 1}")
    found, warnings = listing(folder)
    assert (
        found.total == 7
        and len(warnings) == 1
        and f"schema version {index.SCHEMA_VERSION + 1}, newer than this stackgate's {index.SCHEMA_VERSION}"
        in warnings[0]
    )


def test_migrations_run_in_order_from_an_empty_database(tmp_path, monkeypatch):
    version = index.SCHEMA_VERSION + 1
    later = (version, "ALTER TABLE runs ADD COLUMN note TEXT; CREATE TABLE extra (x INTEGER)")
    index.Store(tmp_path).close()
    monkeypatch.setattr(index, "MIGRATIONS", (*index.MIGRATIONS, later))
    monkeypatch.setattr(index, "SCHEMA_VERSION", version)
    with index.Store(tmp_path) as db:
        assert db.db.execute("PRAGMA user_version").fetchone()[0] == version
        assert (
            "note" in [c[1] for c in db.db.execute("PRAGMA table_info(runs)")]
            and db.db.execute("SELECT count(*) FROM extra").fetchone()[0] == 0
        )


def test_a_version_2_index_keeps_its_rows_when_its_lock_column_becomes_spec(kept):
    folder, _ = kept
    listing(folder)
    path = index.database_path(folder)
    old = sqlite3.connect(path, isolation_level=None)  # the index as the version before the rename left it
    old.executescript(
        "ALTER TABLE runs RENAME COLUMN spec TO lock; DROP INDEX runs_spec;"
        "CREATE INDEX runs_lock ON runs (lock, started, id); PRAGMA user_version = 2;"
    )
    assert sorted(r for (r,) in old.execute("SELECT DISTINCT lock FROM runs")) == ["other", "standin"]
    old.close()
    with index.Store(folder) as db:
        assert db.db.execute("PRAGMA user_version").fetchone()[0] == index.SCHEMA_VERSION == 3
        assert db.count() == 7 and db.specs() == ["other", "standin"]
        assert [i[1] for i in db.db.execute("PRAGMA index_list(runs)") if "spec" in i[1]] == ["runs_spec"]


def test_a_locked_database_never_loses_a_run(kept, monkeypatch):
    folder, runs = kept
    monkeypatch.setattr(index, "BUSY_TIMEOUT_S", 0.2)
    holder = sqlite3.connect(index.database_path(folder), isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        said: list[str] = []
        path = history.store(
            {**gate_doc(decode=77.0), "started": day(29), "run_id": "while-locked"}, folder, said.append
        )
        assert path.is_file() and "not entered in the run index" in said[0] and "locked" in said[0]
        found, warnings = listing(folder)
        assert found.rows[-1].id == "while-locked" and "cannot be used" in warnings[0]  # the scan found it
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    found, warnings = listing(folder)
    assert warnings == [] and found.rows[-1].id == "while-locked" and found.total == 8


WRITER = """
import sys
sys.path[:0] = [sys.argv[3], sys.argv[4]]
from pathlib import Path
from history_support import gate_doc
from stackgate.runs import history
doc, folder, said = gate_doc(decode=100.0), Path(sys.argv[1]), []
for i in range(int(sys.argv[2])):
    history.store({**doc, "started": f"2026-11-30T{i // 60:02d}:{i % 60:02d}:00+00:00", "run_id": f"{sys.argv[5]}-{i:04d}"}, folder, said.append)
print(len(said))
"""  # noqa: E501 (a script for its own process, kept as written)


def test_two_writers_at_once_both_get_every_run_in(tmp_path):
    folder = tmp_path / "runs"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    writers = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, str(folder), "120", str(ROOT), str(TESTS), name],
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        for name in ("a", "b")
    ]
    assert [w.communicate(timeout=300)[0].strip() for w in writers] == [
        "0",
        "0",
    ]  # no writer had to give up on the index
    with index.Store(folder) as db:
        assert db.count() == 240
    found, warnings = listing(folder)
    assert (
        warnings == []
        and found.total == 240
        and [r.id for r in found.rows] == [f"{w}-{i:04d}" for i in range(110, 120) for w in "ab"]
    )
    assert catalog.reindex(folder).runs == 240


def regression_history(folder: Path) -> None:
    """Three hosts: a got slower after torch moved, b failed on the same stack, c moved within the threshold."""
    keep(folder, on_host(gate_doc(decode=100.0), "node-a"), day(20, 10))
    keep(folder, on_host(gate_doc(decode=None), "node-a"), day(21, 10))  # a fast-only gate: no figure, not a baseline
    keep(folder, on_host(gate_doc(decode=90.0, torch="2.10.0"), "node-a"), day(24, 10))
    keep(folder, on_host(gate_doc(decode=100.0), "node-b"), day(21, 11))
    keep(folder, on_host(gate_doc(decode=100.0, status=Status.FAIL), "node-b"), day(24, 11))
    keep(folder, on_host(gate_doc(decode=100.0), "node-c"), day(20, 12))
    keep(folder, on_host(gate_doc(decode=98.0), "node-c"), day(24, 12))
    keep(folder, on_host(gate_doc(decode=50.0), "node-d"), day(22))  # nothing since: not asked about


def test_which_hosts_regressed_since_a_time_and_what_changed_on_them(tmp_path, monkeypatch):
    folder = tmp_path / "runs"
    regression_history(folder)
    found, hosts = catalog.regressed_since(folder, catalog.parse_since("2026-11-23"), pytest.fail)
    assert hosts == 3 and [(r.node, r.reasons) for r in found] == [
        ("node-a", ("decode tok/s 100.00 -> 90.00 (-10.0%)",)),
        ("node-b", ("verdict passed -> failed",)),
    ]
    assert [(c.section, c.name, c.old, c.new) for c in found[0].changes] == [
        ("distributions", "torch", "2.9.1+cu130", "2.10.0")
    ]
    assert found[1].run.fingerprint == found[1].against.fingerprint and found[1].changes == ()
    monkeypatch.setenv("STACKGATE_HISTORY_INDEX", "off")
    assert catalog.regressed_since(folder, "2026-11-23", pytest.fail) == (found, hosts)
    monkeypatch.delenv("STACKGATE_HISTORY_INDEX")
    assert catalog.regressed_since(folder, "2026-11-23", pytest.fail, threshold=0.01)[0][-1].node == "node-c"


def test_report_regressed_since_prints_each_host_and_what_changed(tmp_path):
    folder = tmp_path / "runs"
    regression_history(folder)
    done = stackgate("--regressed-since", "2026-11-23", folder=folder)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == (
        "2 of 3 node(s) with runs since 2026-11-23T00:00:00+00:00 regressed (decode tok/s more than 5% below "
        "the "
        "node's "
        "previous measured run, or passed -> failed)"
    )
    assert lines[1].startswith("node-a: ") and lines[1].endswith(
        ": decode tok/s 100.00 -> 90.00 (-10.0%); against " + lines[1].split()[-1]
    )
    assert (
        lines[2].startswith("  what changed (1 component(s), fingerprint ")
        and lines[3] == "    distributions: torch: 2.9.1+cu130 -> 2.10.0"
    )
    assert (
        lines[4].startswith("node-b: ")
        and "verdict passed -> failed" in lines[4]
        and lines[5].startswith("  nothing changed in the stack (fingerprint ")
    )


def test_the_command_lists_through_the_index_after_a_run_was_kept(tmp_path):
    folder = tmp_path / "runs"
    keep(folder, gate_doc(decode=91.0), day(1))
    stream = io.StringIO()
    reporting.run(reporting.ReportRequest(runs_dir=folder), UI(stream=stream, force_plain=True))
    assert stream.getvalue().splitlines()[0] == f"1 run(s) in {folder}, oldest first"


def test_a_rebuilt_index_has_seen_the_folder_complete(kept):
    folder, runs = kept
    shutil.rmtree(folder / index.FOLDER)
    assert catalog.reindex(folder).runs == len(runs)
    with index.Store(folder) as db:
        assert db.fresh()  # the next listing reads rows only: making the index's own folder is no document


def test_a_document_copied_in_while_a_writer_is_inside_store_is_listed(kept, monkeypatch):
    folder, runs = kept
    listing(folder)  # the index has seen the folder complete
    copied = {**json.loads(runs[1].path.read_text()), "run_id": "copied-in", "started": day(25)}
    real = history.write_json

    def copy_in_then_write(path, doc):  # another process copies a document in while this one writes its own
        (folder / "copied-in.json").write_text(json.dumps(copied))
        real(path, doc)

    monkeypatch.setattr(history, "write_json", copy_in_then_write)
    history.store({**gate_doc(decode=80.0), "started": day(26), "run_id": "written"}, folder, pytest.fail)
    found, warnings = listing(folder)
    assert warnings == [] and found.total == 9 and [r.id for r in found.rows[-2:]] == ["copied-in", "written"]
    with index.Store(folder) as db:
        assert db.fresh()  # the reader reconciled once; the next one reads rows only


def test_a_writer_sweeps_the_temporary_files_killed_writes_left(kept):
    folder, _ = kept
    old, young = (
        folder / ".20261101T100000Z-gate-0a0b0c.json.k3j4h5g6",
        folder / ".20261102T100000Z-gate-0a0b0d.json.a1b2c3d4",
    )
    for path in (old, young):
        path.write_bytes(b"")
    hour_ago = old.stat().st_mtime - 3600
    os.utime(old, (hour_ago, hour_ago))
    history.store({**gate_doc(decode=80.0), "started": day(26), "run_id": "written"}, folder, pytest.fail)
    assert not old.exists() and young.exists()  # a young one may be another writer's, still writing
    assert listing(folder)[0].total == 8


def test_regressions_are_judged_per_node_not_per_hostname(tmp_path, monkeypatch):
    """Nodes cloned from one image share the hostname "vm": a slow node and a fast one, each
    steady, are no regression of each other, told apart by their fleet names or their machines."""
    folder = tmp_path / "runs"
    for hour, (name, machine, rate) in enumerate([("n1", "m1", 100.0), ("n2", "m2", 60.0)] * 3):
        fleet = {"fleet": {"node": name, "address": f"{name}:22", "fleet_run_id": "f"}}
        keep(folder, {**on_host(gate_doc(decode=rate), "vm"), **fleet}, day(20 + hour // 2, 10 + 2 * hour))
        keep(folder, on_host(gate_doc(decode=rate), "vm", machine), day(20 + hour // 2, 11 + 2 * hour))
    keep(folder, on_host(gate_doc(decode=50.0), "vm", "m2"), day(24))  # the one real regression
    found, nodes = catalog.regressed_since(folder, "2026-11-21", pytest.fail)
    assert nodes == 4 and [(r.node, r.reasons) for r in found] == [
        ("vm (machine m2)", ("decode tok/s 60.00 -> 50.00 (-16.7%)",))
    ]
    monkeypatch.setenv("STACKGATE_HISTORY_INDEX", "off")
    assert catalog.regressed_since(folder, "2026-11-21", pytest.fail) == (found, nodes)


def test_a_report_records_this_machine_as_a_hash_of_its_machine_id(tmp_path):
    from stackgate.models.verdict import machine

    (tmp_path / "machine-id").write_text("0123456789abcdef0123456789abcdef\n")
    found = machine((str(tmp_path / "none"), str(tmp_path / "machine-id")))
    assert found is not None and len(found) == 16 and "0123456789abcdef" not in found
    assert machine((str(tmp_path / "none"),)) is None
    assert gate_doc()["host"]["machine"] == machine()
