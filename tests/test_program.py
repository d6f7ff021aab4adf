"""The `stackgate` program: built from the same tasks as the checkout's `invoke`, consistent short
flags (none takes -h), bare words for diagnose's logs and report's runs, one usage-error type
(exit 2), keyword-only requests; and, installed from the checkout into a fresh venv, it works
from any directory with the lock and patch shipped in the package."""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import invoke
import pytest
from invoke.exceptions import Exit
from support import ROOT, SHOW_MODULES, isolated_environ, parsed, run_program

from stackgate import __version__, cli
from stackgate import program as main
from stackgate.commands import diagnose, init, provision, report, verify
from stackgate.flows import gate, smoke, upgrade
from stackgate.flows.provision import ProvisionError
from stackgate.models.exitcodes import ExitCode, UsageError
from stackgate.models.spec import SpecError
from stackgate.serve.launch import LaunchError

ATTENTION = "Attention backend not specified. Use triton backend by default.\n"
CUDART = "ImportError: libcudart.so.12: cannot open shared object file: No such file or directory\n"


def arguments() -> dict[str, list[invoke.parser.Argument]]:
    """Every task of the program, with its arguments as the parser sees them."""
    return {name: main.namespace[name].get_arguments() for name in main.namespace.task_names}


def in_checkout(*args: str, program: str = "stackgate") -> subprocess.CompletedProcess[str]:
    """``python -m stackgate ARGS`` (or ``python -m invoke``) with this checkout's package."""
    return run_program(*args, program=program, timeout=120)


# --- short flags ------------------------------------------------------------------------------


def test_no_flag_of_any_task_takes_h_and_a_long_flag_has_one_short_flag_everywhere():
    shorts: dict[str, set[tuple[str, ...]]] = {}
    for task, args in arguments().items():
        for arg in args:
            assert "h" not in arg.names, (task, arg.names)
            shorts.setdefault(str(arg.name), set()).add(tuple(n for n in arg.names if len(n) == 1))
    assert {name: forms for name, forms in shorts.items() if len(forms) > 1} == {}
    assert {name: forms.pop() for name, forms in shorts.items() if forms != {()}} == {
        name: (letter,) for name, letter in cli.SHORT_FLAGS.items()
    }
    assert len(set(cli.SHORT_FLAGS.values())) == len(cli.SHORT_FLAGS)  # a letter means one flag


def test_h_after_a_command_is_its_help():
    done = in_checkout("diagnose", "-h")
    assert done.returncode == 0 and "Usage: stackgate diagnose [LOG...] [--options]" in done.stdout, done.stderr
    assert "-p LOG, --path=LOG" in done.stdout and "-v, -vv, --verbose" in done.stdout, done.stdout


def test_a_new_task_gets_short_flags_from_the_table_only():
    # invoke would give --hosts the free letter h (then --help has none after the task), and
    # --strict the letter its position in the signature leaves free.
    @cli.task(help={"hosts": "nodes", "strict": "s", "inventory": "i", "model": "m"})
    def fleet(c, hosts=None, inventory=None, strict=False, model=None):
        """A fleet command."""

    names = {arg.name: arg.names for arg in fleet.get_arguments()}
    assert names == {
        "hosts": ("hosts",),
        "inventory": ("inventory",),
        "strict": ("strict", "s"),
        "model": ("model", "m"),
    }
    assert [arg.help for arg in fleet.get_arguments()] == ["nodes", "i", "s", "m"]  # a second read keeps the help


def test_the_docs_table_is_the_short_flag_table():
    text = (ROOT / "docs" / "cli.md").read_text()
    rows = re.findall(r"^\| `-(\w)` \| `--([\w-]+)`[^|]*\| ([^|]+) \|$", text, re.MULTILINE)
    have: dict[str, list[str]] = {}
    for task, args in arguments().items():
        for arg in args:
            have.setdefault(str(arg.name), []).append(task)
    table = {
        long.replace("-", "_"): (
            short,
            {"every command"} if c.strip() == "every command" else set(c.strip().split(", ")),
        )
        for short, long, c in rows
    }
    everywhere = {name for name, tasks in have.items() if len(tasks) == len(main.namespace.task_names)}
    assert table == {
        name: (letter, {"every command"} if name in everywhere else set(have[name]))
        for name, letter in cli.SHORT_FLAGS.items()
    }


def test_verbose_counts():
    assert [
        parsed("verify", *flags)[0].args["verbose"].value for flags in ([], ["-v"], ["-vv"], ["-v", "--verbose"])
    ] == [0, 1, 2, 2]
    assert parsed("diagnose", "-vvv", "-l", "x.toml")[0].args["lock"].value == "x.toml"


# --- bare words -------------------------------------------------------------------------------


def test_bare_words_after_diagnose_are_its_logs_and_after_report_its_runs():
    [context] = parsed("diagnose", "server.log", "-j", "r.json", "install.log.gz", "--lock", "l.toml", "third.log")
    assert context.args["path"].value == ["server.log", "install.log.gz", "third.log"]
    assert (context.args["json"].value, context.args["lock"].value) == ("r.json", "l.toml")
    [context] = parsed("report", "-2", "-1", "--runs-dir", "/r")
    assert context.args["run"].value == ["-2", "-1"] and context.args["runs_dir"].value == "/r"


def test_a_task_name_still_starts_that_task_and_the_words_after_a_double_dash_are_left():
    first, second = parsed("diagnose", "a.log", "verify", "--strict")
    assert (first.name, first.args["path"].value, second.name, second.args["strict"].value) == (
        "diagnose",
        ["a.log"],
        "verify",
        True,
    )
    [context] = parsed("diagnose", "a.log", "--", "b.log")
    assert context.args["path"].value == ["a.log"]


def test_invoke_alone_takes_one_word_per_positional_argument():
    # Why the program spreads bare words itself: with invoke's own parsing, a second log is read
    # as the name of a next task, and an iterable positional argument never takes a word.
    @invoke.task(positional=["path"], iterable=["path"])
    def diagnose(c, path=None):
        """Read logs."""

    parser = invoke.Parser(contexts=invoke.Collection(diagnose).to_contexts())
    with pytest.raises(invoke.ParseError, match="No idea what 'a.log' is"):
        parser.parse_argv(["diagnose", "a.log", "b.log"])


def test_diagnose_reads_the_logs_named_bare(tmp_path):
    for name, text in {"server.log": ATTENTION, "install.log": CUDART}.items():
        (tmp_path / name).write_text(text)
    done = in_checkout(
        "diagnose", str(tmp_path / "server.log"), str(tmp_path / "install.log"), "-j", str(tmp_path / "r.json")
    )
    assert done.returncode == ExitCode.FAILED, done.stderr  # libcudart.so.12 is an error finding
    doc = json.loads((tmp_path / "r.json").read_text())
    assert [Path(i["name"]).name for i in doc["inputs"]] == ["server.log", "install.log"]
    assert "libcudart.so.12" in json.dumps(doc["findings"]) and "triton" in json.dumps(doc["findings"])


# --- one program, one set of tasks, one usage error -------------------------------------------


def test_invoke_in_the_checkout_and_the_program_list_the_same_tasks():
    listed = in_checkout("--list", "--list-format", "json", program="invoke")
    assert listed.returncode == 0, listed.stderr
    names = sorted(task["name"] for task in json.loads(listed.stdout)["tasks"])
    helped = in_checkout()  # bare `stackgate`: its commands
    commands = helped.stdout.split("Commands:")[1].split("Global options:")[0]
    assert re.findall(r"^  ([\w-]+) ", commands, re.MULTILINE) == names == sorted(main.namespace.task_names)
    assert {"verify", "provision", "smoke", "gate", "rollback", "report", "diagnose", "upgrade"} <= set(names)


@pytest.mark.parametrize("argv", [["--version"], ["--help"], ["verify", "--help"]])
def test_the_program_starts_without_its_commands_checks_facts_or_console(argv, tmp_path):
    out = tmp_path / "modules.txt"
    environ = {**os.environ, "NO_COLOR": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", SHOW_MODULES, str(out), "stackgate", *argv],
        cwd=ROOT,
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and done.stdout, done.stderr
    imported = out.read_text().split()
    assert {"stackgate.main", "stackgate.program", "stackgate.tasks", "invoke"} <= set(imported)  # the program's
    heavy = ("stackgate.commands", "stackgate.checks", "stackgate.facts", "stackgate.render", "rich", "packaging")
    assert [name for name in imported if name.split(".")[0] == "rich" or name.startswith(heavy)] == []


@pytest.mark.parametrize("flags", [[], ["-B"]])
def test_the_program_leaves_writing_bytecode_to_python(flags):
    """invoke turns it off unless given its --write-pyc (no stackgate flag): every module a command
    imports would be compiled from its source again on each run."""
    environ = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"} | {"PYTHONPATH": str(ROOT)}
    code = (
        "import sys\nfrom stackgate.program import program\ntry:\n    program.run(['stackgate', '--version'])\n"
        "finally:\n"
    )
    done = subprocess.run(
        [sys.executable, *flags, "-c", code + "    print(sys.dont_write_bytecode)"],
        cwd=ROOT,
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.stdout.split() == ["stackgate", __version__, str(bool(flags))], done.stderr


def test_bare_stackgate_and_help_show_its_commands_and_global_flags_only():
    bare, helped = in_checkout(), in_checkout("--help")
    assert (bare.returncode, helped.returncode, bare.stdout) == (0, 0, helped.stdout), bare.stderr
    flags = re.findall(r"^  (-\S.*?)   ", bare.stdout.split("Global options:")[1], re.MULTILINE)
    assert flags == [
        "--color=COLOR",
        "--complete",
        "--print-completion-script=SHELL",
        "-h [COMMAND], --help[=COMMAND]",
        "-q, --quiet",
        "-V, --version",
    ]
    for invoke_only in ("--prompt-for-sudo-password", "--dry", "--debug", "--list", "--pty", "--echo", "core-opts"):
        assert invoke_only not in bare.stdout
    for flag in ("--list", "-R", "--dry", "-d", "--debug", "--prompt-for-sudo-password"):
        refused = in_checkout(flag, "verify", "--list")
        assert refused.returncode == ExitCode.USAGE, (flag, refused.stderr)
        assert f"no option or command '{flag}'" in refused.stderr, (flag, refused.stderr)


def test_a_flag_without_its_value_says_which_value_it_needs():
    done = in_checkout("verify", "--json")
    assert done.returncode == ExitCode.USAGE
    assert done.stderr == "stackgate: verify --json needs a value: write the JSON report here\n"
    tp = in_checkout("smoke", "--tp").stderr
    assert tp == "stackgate: smoke --tp needs a value: tensor-parallel size (default: [smoke] tp)\n"
    assert "Argument" not in in_checkout("report", "--last").stderr


@pytest.mark.parametrize(
    "argv",
    [
        ["verify", "--check"],
        ["verify", "--check", "--strict"],
        ["verify", "-c", "gpu.*", "--check"],
        ["verify", "--check="],
        ["lock", "--upgrade-package"],
        ["diagnose", "--path", "--", "a.log"],
        ["report", "--run"],
        ["fleet", "verify", "--check", "--strict"],
    ],
    ids=" ".join,
)
def test_a_repeatable_flag_without_its_value_is_refused(argv):
    with pytest.raises(Exit) as stopped:
        parsed(*argv)
    flag = next(word for word in reversed(argv) if word.startswith(("--check", "-c", "--upgrade", "--path", "--run")))
    flag = {"-c": "--check", "--check=": "--check"}.get(flag, flag)
    assert stopped.value.code == ExitCode.USAGE
    assert str(stopped.value.message).startswith(f"stackgate: {argv[0]} {flag} needs a value: "), stopped.value.message


def test_a_refused_flag_exits_2_before_anything_runs():
    done = in_checkout("verify", "--check")
    assert (done.returncode, done.stdout) == (ExitCode.USAGE, ""), done.stderr
    assert done.stderr.startswith("stackgate: verify --check needs a value: run only the checks matching")


def test_fleet_shows_its_help_and_names_the_action_it_lacks():
    for flag in ("--help", "-h"):
        helped = in_checkout("fleet", flag)
        assert helped.returncode == 0, helped.stderr
        assert helped.stdout.startswith("Usage: stackgate fleet ACTION [--options]\n"), helped.stdout
        assert "--hosts=HOSTS" in helped.stdout and "--action" not in helped.stdout  # --action stays a spelling
    bare = in_checkout("fleet")
    assert bare.returncode == ExitCode.USAGE
    assert bare.stderr.startswith("stackgate: fleet needs ACTION: what to run on every node: gate, verify"), bare.stderr
    unknown = in_checkout("fleet", "--bogus", "gate")
    assert unknown.returncode == ExitCode.USAGE and "fleet has no option '--bogus'" in unknown.stderr, unknown.stderr
    # the action is a bare word wherever it stands, a command's name included; a next command still starts
    [context] = parsed("fleet", "--strict", "verify", "-c", "gpu.*")
    assert (context.args["action"].value, context.args["check"].value) == ("verify", ["gpu.*"])
    first, second = parsed("fleet", "gate", "--hosts", "a,b", "verify")
    assert (first.args["action"].value, first.args["hosts"].value, second.name) == ("gate", "a,b", "verify")
    first, second = parsed("fleet", "--action", "gate", "verify")  # the flag fills the ACTION: verify is a command
    assert (first.args["action"].value, second.name) == ("gate", "verify")


def _sections(text: str) -> dict[str, str]:
    """A help text's sections by heading (``Options:``, ``Options of --engine slurm:``, ``Actions:``)."""
    found: dict[str, str] = {}
    heading = "head"
    for line in text.splitlines():
        if line and not line.startswith(" ") and line.endswith(":"):
            heading = line
            continue
        found[heading] = found.get(heading, "") + line + "\n"
    return found


def test_fleet_help_lists_the_actions_and_the_options_all_of_them_take_grouped_per_engine():
    helped = in_checkout("fleet", "--help")
    assert helped.returncode == 0, helped.stderr
    sections = _sections(helped.stdout)
    assert list(sections) == ["head", "Actions:", "Options:", "Options of --engine slurm:", "Options of --engine ssh:"]
    actions = [
        line.split()[0] for line in sections["Actions:"].splitlines() if line.startswith("  ") and line[2] != " "
    ]
    assert actions == ["gate", "verify", "provision", "upgrade", "`stackgate"]  # then how to see one's options
    assert "`stackgate fleet ACTION --help` shows an action's options" in sections["Actions:"]
    common = sections["Options:"]
    assert "--engine-option=NAME=VALUE" in common and "-j PATH, --json=PATH" in common
    for only_some in (
        "--parallel",
        "--batch",
        "--fast-only",
        "--check",
        "--to=",
        "--canary",
        "--partition",
        "--hosts=",
    ):
        assert only_some not in common, only_some
    slurm, ssh = sections["Options of --engine slurm:"], sections["Options of --engine ssh:"]
    assert "--partition=NAME" in slurm and "--slurm-arg=FLAG" in slurm and "--count-unavailable" in slurm
    assert "--hosts=HOSTS" in ssh and "--inventory=PATH" in ssh and "--connect-timeout=SECONDS" in ssh
    assert "[--engine" not in helped.stdout and "[fleet " not in helped.stdout  # the groups' words are headings


@pytest.mark.parametrize(
    ("action", "own", "others"),
    [
        ("gate", ["--parallel=N", "--fast-only"], ["--batch", "--check", "--canary", "--to="]),
        ("verify", ["--parallel=N", "-c NAME, --check=NAME"], ["--batch", "--fast-only", "--canary"]),
        ("provision", ["--batch=N"], ["--parallel", "--fast-only", "--check", "--canary", "--to="]),
        (
            "upgrade",
            ["--batch=N", "--to=SPEC", "--canary=N", "--switch=RULE", "--accept-output-change", "-m PATH, --model"],
            ["--parallel", "--fast-only", "--check"],
        ),
    ],
)
def test_each_fleet_action_has_its_own_help_with_only_its_options(action, own, others):
    for argv in (
        ["fleet", action, "--help"],
        ["fleet", "--hosts", "a", action, "-h"],
        ["fleet", "--action", action, "-h"],
    ):
        helped = in_checkout(*argv)
        assert helped.returncode == 0, helped.stderr
        assert helped.stdout.startswith(f"Usage: stackgate fleet {action} [--options]\n"), helped.stdout
        sections = _sections(helped.stdout)
        assert list(sections)[1:] == ["Options:", "Options of --engine slurm:", "Options of --engine ssh:"], argv
        assert all(flag in sections["Options:"] for flag in own), sections["Options:"]
        assert not any(flag in helped.stdout for flag in [*others, "--action"]), helped.stdout
        assert "--hosts=HOSTS" in sections["Options of --engine ssh:"]


def test_an_option_of_another_fleet_action_is_refused_before_anything_runs(tmp_path):
    for argv, said in (
        (["verify", "--canary", "2"], "fleet verify takes no --canary: it is an option of fleet upgrade"),
        (["gate", "--batch", "2"], "fleet gate takes no --batch: it is an option of fleet provision, upgrade"),
        (["provision", "--check", "gpu.*"], "fleet provision takes no --check: it is an option of fleet verify"),
        (["upgrade", "--fast-only"], "fleet upgrade takes no --fast-only: it is an option of fleet gate"),
    ):
        done = run_program("fleet", *argv, "--hosts", "127.0.0.1:9", cwd=tmp_path)
        assert (done.returncode, done.stdout) == (ExitCode.USAGE, ""), (argv, done.stderr)
        action = argv[0]
        assert done.stderr.strip() == f"stackgate: {said} (`stackgate fleet {action} --help` lists its options)"


def test_the_fleet_actions_name_only_options_the_fleet_task_has():
    from stackgate.models.fleetoptions import ACTIONS

    names = {str(argument.name) for argument in main.namespace["fleet"].get_arguments()}
    assert {option for action in ACTIONS.values() for option in action.options} <= names
    assert list(ACTIONS) == ["gate", "verify", "provision", "upgrade"]


def test_usage_lines_show_the_bare_words_a_command_takes():
    assert {name: main.usage_line("stackgate", name, main.namespace) for name in ("fleet", "diagnose", "report")} == {
        "fleet": "stackgate fleet ACTION [--options]",
        "diagnose": "stackgate diagnose [LOG...] [--options]",
        "report": "stackgate report [RUN...] [--options]",
    }


def test_help_names_every_value_and_the_table_names_no_flag_that_is_gone():
    contexts = main.namespace.to_contexts(ignore_unknown_help=True)
    rows = [row for context in [main.program.initial_context, *contexts] for row in main.flag_tuples(context)]
    assert [flags for flags, _ in rows if "STRING" in flags or "INT" in flags] == []
    names = {str(a.name) for context in [main.program.initial_context, *contexts] for a in context.flags.values()}
    assert set(cli.VALUE_NAMES) - names == set()
    assert ("-l PATH, --lock=PATH", "-c NAME, --check=NAME") == (
        next(flags for flags, _ in rows if flags.startswith("-l ")),
        next(flags for flags, _ in rows if flags.startswith("-c ")),
    )


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["verfy"], "no option or command 'verfy' here: did you mean verify?"),
        (["--help", "diagnse"], "no option or command 'diagnse' here: did you mean diagnose?"),
        (["verify", "--chek", "gpu.*"], "verify has no option '--chek' here: did you mean --check?"),
        (
            ["lock", "--upgrade-pakage=torch"],
            "lock has no option '--upgrade-pakage' here: did you mean --upgrade-package?",
        ),
        (["verify", "--zzzzzz"], "verify has no option '--zzzzzz' here (`stackgate verify --help` lists its options)"),
    ],
)
def test_a_mistyped_command_or_flag_names_the_nearest(argv, said):
    done = in_checkout(*argv)
    assert done.returncode == ExitCode.USAGE and done.stderr.startswith(f"stackgate: {said}"), done.stderr


def test_lock_check_is_the_old_spelling_of_lock_up_to_date_and_c_picks_checks_only():
    assert [parsed("lock", flag)[0].args["up_to_date"].value for flag in ("--up-to-date", "--check")] == [True, True]
    assert parsed("verify", "-c", "gpu.*")[0].args["check"].value == ["gpu.*"]
    with pytest.raises(Exit):
        parsed("lock", "-c")  # -c means --check NAME, the checks to run: lock runs none


@pytest.mark.parametrize("how", ["pipe", "dash", "dash and a file"])
def test_diagnose_reads_standard_input_for_a_dash_and_from_a_pipe(how, tmp_path):
    (tmp_path / "install.log").write_text(CUDART)
    args = {"pipe": [], "dash": ["-"], "dash and a file": [str(tmp_path / "install.log"), "-"]}[how]
    environ = {**os.environ, "NO_COLOR": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "stackgate", "diagnose", *args, "-j", str(tmp_path / "r.json")],
        input=ATTENTION,
        cwd=ROOT,
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode in (ExitCode.PASSED, ExitCode.FAILED), done.stderr
    doc = json.loads((tmp_path / "r.json").read_text())
    assert [Path(i["name"]).name for i in doc["inputs"]] == [Path(a).name for a in args if a != "-"] + ["<stdin>"]
    assert "triton" in json.dumps(doc["findings"])


def test_diagnose_with_nothing_named_and_no_pipe_says_so():
    done = subprocess.run(
        [sys.executable, "-m", "stackgate", "diagnose"],
        stdin=subprocess.DEVNULL,
        cwd=ROOT,
        env={**os.environ, "NO_COLOR": "1", "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == ExitCode.USAGE and "nothing to diagnose" in done.stderr, done.stderr


def test_help_shows_verbose_as_it_counts():
    done = in_checkout("verify", "--help")
    assert "-v, -vv, --verbose" in done.stdout and "INT" not in done.stdout
    assert "-c NAME, --check=NAME" in done.stdout
    assert parsed("verify", "-vv")[0].args["verbose"].value == 2


def test_a_command_line_that_cannot_be_parsed_is_bad_usage():
    for args in (["verify", "--bogus"], ["verify", "--lock"], ["--help", "nosuchtask"]):
        done = in_checkout(*args)
        assert (done.returncode, done.stderr.startswith("stackgate: ")) == (ExitCode.USAGE, True), (args, done.stderr)


@pytest.mark.parametrize("error", [SpecError, UsageError, LaunchError])
def test_every_usage_error_is_one_type_and_exits_2(error):
    assert issubclass(error, UsageError)
    instance = error("lockfiles/x.toml", ["a: wrong"]) if error is SpecError else error("wrong")

    def command() -> ExitCode:
        raise instance

    with pytest.raises(Exit) as stopped:
        cli.run_command(command)
    assert stopped.value.code == ExitCode.USAGE and str(stopped.value.message).startswith("stackgate: ")


def test_usage_errors_are_one_type_but_two_that_carry_more():
    """Every command raises UsageError itself; SpecError carries the lockfile's path and problems, and
    LaunchError is the one the gate's and upgrade's smoke stages turn into a failed result."""
    found = {
        node.name: path.relative_to(ROOT).as_posix()
        for path in sorted((ROOT / "stackgate").rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef) and any(getattr(base, "id", None) == "UsageError" for base in node.bases)
    }
    assert found == {"SpecError": "stackgate/models/spec/reader.py", "LaunchError": "stackgate/serve/launch.py"}


def test_a_usage_error_shows_its_hint_on_a_line_of_its_own(tmp_path):
    done = run_program("verify", "--check", "gpu.nosuch", cwd=tmp_path)
    assert done.returncode == ExitCode.USAGE, done.stderr
    assert done.stderr.splitlines()[-2:] == [
        "stackgate: no check matches 'gpu.nosuch'",
        "  fix: stackgate verify --list",
    ]


def test_an_error_that_is_not_usage_is_not_turned_into_exit_2():
    def command() -> ExitCode:
        raise ProvisionError("the resolution failed")

    with pytest.raises(ProvisionError):
        cli.run_command(command)


@pytest.mark.parametrize(
    "request_type",
    [
        verify.VerifyRequest,
        provision.ProvisionRequest,
        provision.RollbackRequest,
        smoke.SmokeRequest,
        gate.GateRequest,
        report.ReportRequest,
        diagnose.DiagnoseRequest,
        upgrade.UpgradeRequest,
        init.InitRequest,
    ],
)
def test_every_request_is_built_by_keyword(request_type):
    assert all(field.kw_only for field in dataclasses.fields(request_type))
    with pytest.raises(TypeError):
        request_type(None)


# --- installed from the checkout, run from / --------------------------------------------------


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with the checkout installed (not editable): its bin folder.

    The checkout is copied first (a build writes build/ and *.egg-info beside the sources, and
    two runs of the suite may build at once); uv resolves the dependencies from the default
    index with this machine's pip/uv configuration kept out."""
    home = tmp_path_factory.mktemp("installed")
    source = home / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "stackgate", source / "stackgate", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    environ = isolated_environ()
    environ.pop("PYTHONPATH", None)
    uv = [sys.executable, "-m", "uv"]
    subprocess.run(
        [*uv, "venv", "-q", "--python", sys.executable, str(home / "venv")], env=environ, check=True, timeout=120
    )
    subprocess.run(
        [*uv, "pip", "install", "-q", "--python", str(home / "venv" / "bin" / "python"), str(source)],
        env=environ,
        check=True,
        timeout=600,
    )
    return home / "venv" / "bin"


def run_installed(bin_dir: Path, *argv: str, cwd: Path | str = "/") -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in isolated_environ(NO_COLOR="1").items() if k not in ("PYTHONPATH", "STACKGATE_LOCK")}
    return subprocess.run(
        [str(bin_dir / argv[0]), *argv[1:]],
        check=False,
        cwd=cwd,
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_installed_program_runs_from_any_directory(installed):
    version = run_installed(installed, "stackgate", "--version")
    assert (version.returncode, version.stdout) == (0, f"stackgate {__version__}\n"), version.stderr
    assert run_installed(installed, "python", "-m", "stackgate", "--version").stdout == version.stdout
    listed = run_installed(installed, "stackgate", "verify", "--list")  # loads the default lock first
    assert listed.returncode == 0, listed.stderr
    assert "gpu.driver" in listed.stdout and "abi.imports" in listed.stdout
    helped = run_installed(installed, "stackgate", "--help")
    assert helped.returncode == 0 and "Usage: stackgate" in helped.stdout and "verify" in helped.stdout, helped.stderr


def test_the_installed_package_holds_the_default_lock_and_its_patch(installed):
    script = (
        "import stackgate; from stackgate.models import spec; lock = spec.load_spec(); patch = lock.patches[0]; "
        "print(stackgate.__file__, lock.path, patch.file, spec.patch_location_problem(lock, patch), sep='\\n')"
    )
    done = run_installed(installed, "python", "-c", script)
    assert done.returncode == 0, done.stderr
    package, spec, patch, problem = done.stdout.splitlines()
    site = Path(package).parent
    assert ROOT not in Path(package).parents and "site-packages" in site.parts
    assert (Path(spec), Path(patch), problem) == (
        site / "lockfiles" / "blackwell-sm120-cu130.toml",
        site / "patches" / "sglang-0.5.9-sm120-torch-symm-mem.patch",
        "None",
    )


def test_the_installed_program_diagnoses_logs_named_bare(installed, tmp_path):
    (tmp_path / "some.log").write_text(ATTENTION)
    (tmp_path / "other.log").write_text(CUDART)
    done = run_installed(installed, "stackgate", "diagnose", "some.log", "other.log", "--json", "r.json", cwd=tmp_path)
    assert done.returncode == ExitCode.FAILED, done.stderr
    doc = json.loads((tmp_path / "r.json").read_text())
    assert [i["name"] for i in doc["inputs"]] == ["some.log", "other.log"]
    assert "libcudart.so.12" in json.dumps(doc["findings"]) and "triton" in json.dumps(doc["findings"])


# --- tab completion -----------------------------------------------------------------------------


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_the_completion_script_is_stackgate_s_however_the_program_is_started(shell):
    """`python -m stackgate` too: the script names and completes `stackgate` (invoke would name the
    function after `__main__.py`) and its header says whose script it is."""
    done = in_checkout("--print-completion-script", shell)
    assert done.returncode == 0, done.stderr
    first = done.stdout.splitlines()[0]
    assert first.startswith("# stackgate's tab-completion script") and "Invoke tab-completion" not in done.stdout
    assert re.search(r"\bstackgate\b.*--complete", done.stdout) and "__main__" not in done.stdout
    if shell == "bash":
        assert "complete -F _complete_stackgate -o default stackgate" in done.stdout
        assert subprocess.run(["bash", "-n"], input=done.stdout, text=True, timeout=60).returncode == 0


def test_a_completion_script_for_an_unknown_shell_is_bad_usage():
    done = in_checkout("--print-completion-script", "tcsh")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "bash, fish, zsh" in done.stderr and done.stdout == ""


def test_color_and_quiet_are_global_options_before_or_after_the_command():
    for args in (("--color", "never", "-q", "lock", "--check"), ("lock", "--check", "--quiet", "--color=never")):
        done = in_checkout(*args)
        assert done.returncode in (ExitCode.PASSED, ExitCode.FAILED), done.stderr
    bad = in_checkout("--color", "blue", "verify")
    assert bad.returncode == ExitCode.USAGE
    assert bad.stderr == "stackgate: --color 'blue': give one of auto, always, never\n"
    coloured = in_checkout("--color", "always", "verify", "--check", "gpu.driver")  # NO_COLOR=1 is set: asked by name
    assert coloured.returncode in (ExitCode.PASSED, ExitCode.FAILED) and "\x1b[" in coloured.stdout, coloured.stderr
    listed = in_checkout("--help")
    assert "--color" in listed.stdout and "-q, --quiet" in listed.stdout
