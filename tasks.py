"""stackgate's commands. Each task turns its flags into a request and calls the library.

`invoke --list` shows them; `invoke --help TASK` shows a task's flags.
"""

from __future__ import annotations

from pathlib import Path

from invoke import task
from invoke.exceptions import Exit

from stackgate import cli
from stackgate.ui import UI

LOCK_HELP = "lockfile to use (default: $STACKGATE_LOCK, then lockfiles/blackwell-sm120-cu130.toml)"


def _path(value: str | None) -> Path | None:
    return Path(value) if value else None


def _not_yet(name: str) -> None:
    raise Exit(f"stackgate: `invoke {name}` is not implemented yet", code=2)


@task(
    iterable=["check"],
    incrementable=["verbose"],
    help={
        "lock": LOCK_HELP,
        "deep": "after the static checks, run real work on every GPU and an NCCL all-reduce sweep (seconds to a minute)",
        "check": "run only checks matching this name or glob (repeatable), e.g. 'gpu.*'",
        "list": "list the checks and exit",
        "json": "write the JSON report here",
        "junit": "write a JUnit XML report here",
        "strict": "fail on warnings too",
        "verbose": "show details of passing checks and tracebacks (-vv for more)",
    },
)
def verify(c, lock=None, deep=False, check=None, list=False, json=None, junit=None, strict=False, verbose=0):
    """Check the machine and the stack against the lockfile."""
    from stackgate import verify as command

    request = command.VerifyRequest(_path(lock), tuple(check or ()), deep, _path(json), _path(junit), strict, list)
    cli.run_command(lambda: command.run(request, UI(verbose=verbose)))


@task(
    help={
        "lock": LOCK_HELP,
        "dry_run": "print the plan and change nothing",
        "only": "plan and apply only one area: toolkit, python or patches",
        "yes": "do not ask before changing the machine (needed without a terminal)",
        "wait": "wait for a provision that is already running instead of failing at once",
    },
)
def provision(c, lock=None, dry_run=False, only=None, yes=False, wait=False):
    """Install the locked CUDA toolkit and Python stack, then verify them."""
    from stackgate import provision as command

    request = command.ProvisionRequest(_path(lock), dry_run, only, yes, wait)
    cli.run_command(lambda: command.run(request, UI()), usage_errors=(command.ProvisionUsage,))


@task(
    incrementable=["verbose"],
    help={
        "lock": LOCK_HELP,
        "benchmark": "measure single-stream decode tok/s (the lock's warm-ups, runs and length) against the baseline",
        "compare": "also launch the baseline configuration ([smoke.compare], or the lock's flags without fusion) and compare",
        "concurrency": "stream counts to run at once, e.g. 1,10,30: aggregate and per-stream tok/s at each",
        "fast": "random weights (--load-format dummy) and only [smoke] fast_layers layers: proves the launch in a fraction of a load",
        "model": "model directory (default: [smoke] model)",
        "tp": "tensor-parallel size (default: [smoke] tp)",
        "port": "server port (default: [smoke] port)",
        "keep_server": "leave the server running afterwards and print how to stop it",
        "json": "write the JSON report here",
        "strict": "fail on warnings too (a quality-guard difference, for instance)",
        "verbose": "show details of passing checks",
    },
)
def smoke(c, lock=None, benchmark=False, compare=False, concurrency=None, fast=False, model=None, tp=None, port=None, keep_server=False, json=None, strict=False, verbose=0):
    """Launch the serving engine as production will, prove what runs, benchmark it."""
    from stackgate import smoke as command

    def go():
        request = command.SmokeRequest(
            _path(lock), model, command.parse_number("--tp", tp), command.parse_number("--port", port), benchmark, compare,
            command.parse_levels(concurrency), fast, keep_server, _path(json), strict,
        )  # fmt: skip
        return command.run(request, UI(verbose=verbose))

    cli.run_command(go, usage_errors=(command.LaunchError, command.SmokeUsageError))


@task(help={"lock": LOCK_HELP, "json": "write the JSON report here", "junit": "write a JUnit XML report here"})
def gate(c, lock=None, json=None, junit=None):
    """Run the whole pre-deploy gate: verify --deep, then smoke --benchmark; one verdict."""
    _not_yet("gate")


@task(help={"lock": LOCK_HELP})
def rollback(c, lock=None):
    """Switch back to the previous good generation of the stack."""
    from stackgate import provision as command

    request = command.RollbackRequest(_path(lock))
    cli.run_command(lambda: command.rollback(request, UI()), usage_errors=(command.ProvisionUsage,))


@task(help={})
def report(c):
    """List past runs, or show what changed between two of them."""
    _not_yet("report")


@task(
    iterable=["path"],
    incrementable=["verbose"],
    help={
        "path": "a log to read (repeatable; .gz is read too); or give the paths after --: invoke diagnose -- a.log b.log",
        "stdin": "read a log from standard input",
        "json": "write the JSON report here",
        "lock": "lockfile whose values the findings quote (attention backend, torch build, toolkit prefix)",
        "verbose": "show every line of each event, the references and the captured values",
    },
)
def diagnose(c, path=None, stdin=False, json=None, lock=None, verbose=0):
    """Explain logs of this stack: each known failure with its cause and fix."""
    import shlex

    from stackgate import diagnose as command

    paths = tuple(Path(p) for p in [*(path or ()), *shlex.split(c.remainder or "")])
    request = command.DiagnoseRequest(paths, stdin, _path(json), _path(lock))
    cli.run_command(lambda: command.run(request, UI(verbose=verbose)), usage_errors=(command.DiagnoseError,))
