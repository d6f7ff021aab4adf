"""stackgate's commands. Each task turns its flags into a request and calls the library.

The `stackgate` program (stackgate.program) is built from these tasks, and the checkout's tasks.py
re-exports them for `invoke`: bare `stackgate` lists them, `stackgate TASK --help` shows a task's flags.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from stackgate import cli, express
from stackgate.cli import task
from stackgate.models import fleetoptions, settings
from stackgate.models.exitcodes import UsageError

__all__ = [
    "diagnose",
    "fleet",
    "gate",
    "init",
    "lock",
    "provision",
    "report",
    "rollback",
    "slurm_health",
    "smoke",
    "upgrade",
    "verify",
]

LOCK_HELP = (
    f"lockfile to use (default: ${settings.LOCK.env}, stackgate.toml here or above, /etc/stackgate/stack.toml, "
    "then the blackwell-sm120-cu130 profile shipped with stackgate)"
)

#: --check NAME, the one meaning of --check wherever it takes a value (verify, fleet verify, slurm-health).
CHECK_HELP = "run only the checks matching this name or glob (repeatable), e.g. 'gpu.*'"


def _path(value: str | None) -> Path | None:
    return Path(value) if value else None


_ui = express.console  # the console; on standard error when a report goes to standard output (``--json -``)


@task(
    help={
        "out": "write the spec here (default: ./stackgate.toml, which every command then uses)",
        "profile": "copy this shipped profile (and its pylock) out of the package instead of describing this machine",
        "list": "list the shipped profiles with their descriptions",
        "system": "write /etc/stackgate/stack.toml (the machine's spec for every user) instead of ./stackgate.toml",
        "python": "the interpreter whose environment is the stack (default: the first here that holds torch)",
        "force": "replace a spec (and pylock), or health units, that are already there",
        "health_units": (
            "write the health check's systemd service and timer into this folder (/etc/systemd/system), "
            "running this installed stackgate's `verify --cached` every minute"
        ),
        "lock": "with --health-units: the spec the health check judges (default: /etc/stackgate/stack.toml)",
        "dry_run": "with --health-units: print the units and write nothing",
    },
)
def init(
    c,
    out=None,
    profile=None,
    list=False,
    system=False,
    python=None,
    force=False,
    health_units=None,
    lock=None,
    dry_run=False,
):
    """Describe this machine as a spec (./stackgate.toml), or copy a shipped profile out."""
    from stackgate.commands import init as command

    paths: dict[str, Any] = {name: _path(value) for name, value in [("out", out), ("python", python), ("spec", lock)]}
    paths["health_units"] = _path(health_units)
    request = command.InitRequest(**paths, profile=profile, list_only=list, system=system, force=force, dry_run=dry_run)
    cli.run_command(lambda: command.run(request, _ui()))


@task(
    iterable=["check"],
    incrementable=["verbose"],
    help={
        "lock": LOCK_HELP,
        "deep": (
            "after the static checks, run real work on every GPU and an NCCL all-reduce sweep (seconds to a minute)"
        ),
        "check": CHECK_HELP,
        "list": "list the checks and exit",
        "json": "write the JSON report here",
        "junit": "write a JUnit XML report here",
        "strict": "fail on warnings too",
        "verbose": "show details of passing checks and tracebacks (-vv for more)",
        "cached": (
            "reuse the static checks' results while what they judged is unchanged (distributions, toolkits, driver, "
            "spec, pylock); the GPUs' state is measured every time"
        ),
        "prom": "write Prometheus metrics here for node_exporter's textfile collector (a .prom file in its directory)",
    },
)
def verify(
    c,
    lock=None,
    deep=False,
    check=None,
    list=False,
    json=None,
    junit=None,
    strict=False,
    verbose=0,
    cached=False,
    prom=None,
):
    """Check the machine and the stack against the lockfile."""
    from stackgate.commands import verify as command

    request = command.VerifyRequest.from_flags(
        lock=lock, deep=deep, check=check, list=list, json=json, junit=junit, strict=strict, cached=cached, prom=prom
    )
    cli.run_command(lambda: command.run(request, _ui(verbose, json, junit, prom)))


@task(
    help={
        "lock": LOCK_HELP,
        "dry_run": "print the plan and change nothing",
        "only": "plan and apply only one area: toolkit, python or patches",
        "yes": "do not ask before changing the machine (needed without a terminal)",
        "wait": "wait for a provision that is already running instead of failing at once",
        "wheelhouse": (
            "install every locked file from this folder (filled by `stackgate lock --wheelhouse`), with no index at all"
        ),
    },
)
def provision(c, lock=None, dry_run=False, only=None, yes=False, wait=False, wheelhouse=None):
    """Install the locked CUDA toolkit and Python stack, then verify them."""
    from stackgate.commands import provision as command

    request = command.ProvisionRequest(
        spec_path=_path(lock), dry_run=dry_run, only=only, yes=yes, wait=wait, wheelhouse=_path(wheelhouse)
    )
    cli.run_command(lambda: command.run(request, _ui()))


@task(
    incrementable=["verbose"],
    help={
        "lock": LOCK_HELP,
        "benchmark": "measure single-stream decode tok/s (the lock's warm-ups, runs and length) against the baseline",
        "compare": (
            "also launch the baseline configuration ([smoke.compare], or the lock's flags without fusion) and compare"
        ),
        "concurrency": (
            "stream counts to run at once, e.g. 1,10,30: aggregate and per-stream tok/s, TTFT and inter-token "
            "latency (p50/p90/p99) at each"
        ),
        "rates": (
            "request rates to sweep (requests per second), e.g. 2,4,8: Poisson arrivals of [smoke.sweep]'s prompts; "
            "TTFT, ITL, TPOT and E2E (p50/p90/p99), throughput, the knee and goodput at each"
        ),
        "fast": (
            "random weights (--load-format dummy) and only [smoke] fast_layers layers: proves the launch in a "
            "fraction of a load"
        ),
        "model": "model directory (default: [smoke] model)",
        "tp": "tensor-parallel size (default: [smoke] tp)",
        "port": "server port (default: [smoke] port)",
        "keep_server": "leave the server running afterwards and print how to stop it",
        "dry_run": "print the exact server command, its environment (secrets hidden) and the checks; launch nothing",
        "json": "write the JSON report here",
        "strict": "fail on warnings too (a quality-guard difference, for instance)",
        "verbose": "show details of passing checks",
    },
)
def smoke(
    c,
    lock=None,
    benchmark=False,
    compare=False,
    concurrency=None,
    rates=None,
    fast=False,
    model=None,
    tp=None,
    port=None,
    keep_server=False,
    dry_run=False,
    json=None,
    strict=False,
    verbose=0,
):
    """Launch the serving engine as production will, prove what runs, benchmark it."""
    from stackgate.commands import smoke as command
    from stackgate.flows.smoke import SmokeRequest

    def go():
        request = SmokeRequest(
            spec_path=_path(lock),
            model=model,
            tp=command.parse_number("--tp", tp),
            port=command.parse_number("--port", port),
            benchmark=benchmark,
            compare=compare,
            concurrency=command.parse_levels(concurrency),
            rates=command.parse_rates(rates),
            fast=fast,
            keep_server=keep_server,
            json_path=_path(json),
            strict=strict,
            dry_run=dry_run,
        )
        return command.run(request, _ui(verbose, json))

    cli.run_command(go)


@task(
    incrementable=["verbose"],
    help={
        "lock": LOCK_HELP,
        "json": (
            "write the JSON report here: every stage's results, status, reason and time, the fingerprint, the benchmark"
        ),
        "junit": "write a JUnit XML report here: one testsuite per stage",
        "markdown": "write a Markdown summary here, for a CI job summary (the file is replaced, not appended to)",
        "prom": "write Prometheus metrics here for node_exporter's textfile collector (a .prom file in its directory)",
        "fast_only": (
            "stop after the fast smoke (random weights, a few layers): a gate in minutes, without the benchmark"
        ),
        "model": "model directory the smoke stages launch (default: [smoke] model)",
        "strict": "fail on warnings too",
        "verbose": "show details of passing checks",
    },
)
def gate(
    c, lock=None, json=None, junit=None, markdown=None, prom=None, fast_only=False, model=None, strict=False, verbose=0
):
    """Run the pre-deploy gate: environment, verify --deep, fast smoke, benchmark; one verdict."""
    from stackgate.commands import gate as command
    from stackgate.flows.gate import GateRequest

    request = GateRequest(
        spec_path=_path(lock),
        json_path=_path(json),
        junit_path=_path(junit),
        markdown_path=_path(markdown),
        prom_path=_path(prom),
        fast_only=fast_only,
        model=model,
        strict=strict,
    )
    cli.run_command(lambda: command.run(request, _ui(verbose, json, junit, markdown, prom)))


@task(
    iterable=["upgrade_package"],
    help={
        "lock": LOCK_HELP,
        "up_to_date": (
            "whether the pylock is up to date with the spec, offline, changing nothing: exit 1 naming what differs"
        ),
        "all": "with --up-to-date: check every shipped spec that has a pylock",
        "upgrade_package": (
            "resolve again moving only this package and what it drags (repeatable); refused when a frozen package "
            "would move"
        ),
        "wheelhouse": (
            "also download every file of the pylock into this folder, hash-checked, for `stackgate provision "
            "--wheelhouse`"
        ),
        "refresh": "resolve against the indexes even when the pylock matches the spec (else that pylock is the answer)",
    },
)
def lock(c, lock=None, up_to_date=False, all=False, upgrade_package=None, wheelhouse=None, refresh=False):
    """Resolve the spec into its pylock: every distribution, file and sha256 (PEP 751)."""
    from stackgate.commands import lock as command

    request = command.LockRequest(
        spec_path=_path(lock),
        check=up_to_date,
        all_specs=all,
        upgrade=tuple(upgrade_package or ()),
        wheelhouse=_path(wheelhouse),
        refresh=refresh,
    )
    cli.run_command(lambda: command.run(request, _ui()))


@task(
    help={
        "lock": LOCK_HELP,
        "force": "switch even to a generation whose pins or guard no longer hold (a package moved torch in it)",
    }
)
def rollback(c, lock=None, force=False):
    """Switch back to the previous good generation of the stack."""
    from stackgate.commands import provision as command

    request = command.RollbackRequest(spec_path=_path(lock), force=force)
    cli.run_command(lambda: command.rollback(request, _ui()))


@task(
    iterable=["run"],
    rest="run",
    help={
        "run": (
            "a run: its id, a unique prefix, its JSON file, or -1 (the newest), -2 ...; twice to compare (or just "
            "name them: stackgate report -2 -1; with invoke, after --: invoke report -- -2 -1)"
        ),
        "lock": "lockfile whose history to read (<python.root>/runs; default as for the other commands)",
        "html": "write a self-contained HTML page here: the history, or the one run named",
        "runs_dir": (
            f"read the runs kept in this folder instead (default: ${settings.HISTORY_DIR.env}, the lock's root, "
            "~/.local/state/stackgate/runs)"
        ),
        "last": "list this many of the newest runs (default 20); the trends and the count cover every run",
        "reindex": "rebuild the run index (<runs>/.index/runs.sqlite3) from the run documents, and exit",
        "regressed_since": (
            "which hosts regressed since this date or time (2026-11-23, or ISO 8601 with a time), and what changed "
            "on them"
        ),
        "threshold": (
            "with --regressed-since: the drop in decode tok/s, in percent of the host's previous measured run, that "
            "counts (default 5)"
        ),
    },
)
def report(
    c, run=None, lock=None, html=None, runs_dir=None, last=None, reindex=False, regressed_since=None, threshold=None
):
    """List past runs and their trend, show one, or show what changed between two."""
    import shlex

    from stackgate.commands import report as command

    def go():
        runs = (*(run or ()), *shlex.split(c.remainder or ""))
        request = command.ReportRequest(
            runs=tuple(runs),
            spec_path=_path(lock),
            html_path=_path(html),
            runs_dir=_path(runs_dir),
            last=command.parse_number("--last", last, 20),
            reindex=reindex,
            regressed_since=regressed_since,
            threshold_pct=command.parse_number("--threshold", threshold, 5.0),
        )
        return command.run(request, _ui())

    cli.run_command(go)


@task(
    iterable=["path"],
    rest="path",
    incrementable=["verbose"],
    help={
        "path": (
            "a log to read (repeatable; .gz is read too); or just name them: stackgate diagnose a.log b.log (with "
            "invoke, after --: invoke diagnose -- a.log b.log)"
        ),
        "stdin": "read a log from standard input",
        "json": "write the JSON report here",
        "lock": (
            "lockfile whose values the findings quote (attention backend, torch build, toolkit prefix); installer "
            "versions are read against it"
        ),
        "kernel": (
            "also read this boot's kernel log (dmesg, else journalctl -k): Xid, PCIe AER and NVRM events, by GPU index"
        ),
        "kernel_log": "a saved kernel log to read instead of this boot's (any input is read for kernel lines)",
        "bundle": "write a support bundle (.tar.gz, secrets redacted) to attach to an upstream issue",
        "verbose": "show every line of each event, the references and the captured values",
    },
)
def diagnose(c, path=None, stdin=False, json=None, lock=None, kernel=False, kernel_log=None, bundle=None, verbose=0):
    """Explain logs of this stack: each known failure with its cause and fix."""
    import shlex

    from stackgate.commands import diagnose as command

    paths = tuple(Path(p) for p in [*(path or ()), *shlex.split(c.remainder or "")])
    request = command.DiagnoseRequest(
        paths=paths,
        stdin=stdin,
        json_path=_path(json),
        spec_path=_path(lock),
        kernel=kernel,
        kernel_path=_path(kernel_log),
        bundle_path=_path(bundle),
    )
    cli.run_command(lambda: command.run(request, _ui(verbose, json)))


@task(
    positional=["action"],
    actions=fleetoptions.ACTIONS,
    iterable=["check", "slurm_arg", "engine_option"],
    help={
        "action": "what to run on every node: gate, verify, provision or upgrade (`stackgate fleet --help` lists them)",
        "hosts": "[--engine ssh] the nodes: comma-separated [user@]host[:port] (or --inventory)",
        "inventory": (
            "[--engine ssh] the nodes: a TOML inventory ([fleet] defaults, one [[node]] per node; docs/fleet.md)"
        ),
        "lock": LOCK_HELP + "; shipped to every node with its pylock, sha256 checked there "
        "(upgrade: the live spec, default each node's own)",
        "parallel": "nodes run at once (default 8)",
        "batch": "nodes moved at a time; the first batch with a failure stops the rollout (default 1)",
        "to": "the new spec (its pylock beside it), shipped to every node and built beside its live stack",
        "canary": "nodes upgraded first; the rest only if every one of them won (default 1)",
        "switch": "each node's stackgate upgrade --switch: if-better (default) or if-passes",
        "accept_output_change": "accept greedy outputs that differ from the live stack's (still reported)",
        "model": "model directory both sides launch on each node (default: the specs' [smoke] model)",
        "fast_only": "stop each node's gate after the fast smoke",
        "check": f"{CHECK_HELP}, on each node",
        "timeout": "seconds each node's whole run may take (default: the inventory's timeout_s, else 7200)",
        "connect_timeout": (
            "[--engine ssh] seconds to connect and log in to a node (default: the inventory's connect_timeout_s, "
            "else 10)"
        ),
        "json": "write the fleet's JSON report here: every node, the stacks (fingerprint groups), the outliers",
        "junit": "write a JUnit XML report here: one testsuite per node",
        "markdown": "write a Markdown summary here, for a CI job summary",
        "prom": "write Prometheus metrics here (one series per node) for node_exporter's textfile collector",
        "html": "write a self-contained HTML page here",
        "strict": "fail on warnings too: the nodes' own, and the fleet's outliers",
        "max_nodes": "refuse a fleet of more nodes than this (default 1000): a runaway inventory is not dialled",
        "engine": "where the nodes come from: ssh (default: --hosts/--inventory) or slurm (docs/slurm.md)",
        "engine_option": (
            "an option of the chosen engine (repeatable; docs/fleet.md lists each engine's); "
            "the flags below are shorthands for the Slurm engine's"
        ),
        **{name.replace("-", "_"): f"[--engine slurm] {option.help}" for name, option in fleetoptions.SLURM.items()},
    },
)
def fleet(
    c,
    action,
    hosts=None,
    inventory=None,
    lock=None,
    parallel=None,
    batch=None,
    fast_only=False,
    check=None,
    timeout=None,
    connect_timeout=None,
    json=None,
    junit=None,
    markdown=None,
    prom=None,
    html=None,
    strict=False,
    to=None,
    canary=None,
    switch="if-better",
    accept_output_change=False,
    model=None,
    max_nodes=None,
    engine="ssh",
    partition=None,
    nodes=None,
    nodelist=None,
    time=None,
    slurm_arg=None,
    stackgate=None,
    node_dir=None,
    shared_dir=None,
    count_unavailable=False,
    engine_option=None,
):
    """Run gate, verify, provision or upgrade on every node over SSH (or Slurm): one report, one verdict."""
    from stackgate.commands import fleet as command
    from stackgate.flows import fleetengines
    from stackgate.flows.fleetrequest import MAX_NODES, FleetRequest, seconds, whole

    def go():
        given = {  # the documented flags: shorthands for --engine-option NAME=VALUE (the engine checks them)
            "partition": [partition] if partition is not None else [],
            "nodes": [nodes] if nodes is not None else [],
            "nodelist": [nodelist] if nodelist is not None else [],
            "time": [time] if time is not None else [],
            "slurm-arg": list(slurm_arg or ()),
            "stackgate": [stackgate] if stackgate is not None else [],
            "node-dir": [node_dir] if node_dir is not None else [],
            "shared-dir": [shared_dir] if shared_dir is not None else [],
            "count-unavailable": [""] if count_unavailable else [],
        }
        request = FleetRequest(
            engine=engine,
            options=fleetengines.engine_options(engine, given, engine_option or ()),
            action=action,
            hosts=hosts,
            inventory=_path(inventory),
            spec_path=_path(lock),
            parallel=whole("--parallel", parallel, 8),
            batch=whole("--batch", batch, 1),
            fast_only=fast_only,
            checks=tuple(check or ()),
            timeout_s=seconds("--timeout", timeout),
            connect_timeout_s=seconds("--connect-timeout", connect_timeout),
            strict=strict,
            json_path=_path(json),
            junit_path=_path(junit),
            markdown_path=_path(markdown),
            prom_path=_path(prom),
            html_path=_path(html),
            to_path=_path(to),
            canary=whole("--canary", canary, 1),
            switch=switch,
            accept_output_change=accept_output_change,
            model=model,
            max_nodes=whole("--max-nodes", max_nodes, MAX_NODES),
        )
        return command.run(request, _ui(0, json, junit, markdown, prom, html))

    cli.run_command(go)


@task(
    help={
        "to": "the new spec to upgrade to (its pylock beside it, as provision needs); built beside the live stack",
        "lock": "the live spec (default: the one the live generation was built from)",
        "model": "model directory both sides launch (default: the specs' [smoke] model)",
        "switch": (
            "if-better (default: passes, same greedy tokens, not slower beyond the measured noise), if-passes, or "
            "never (report only)"
        ),
        "dry_run": "print the plan (what changes, what would be built) and change nothing",
        "accept_output_change": (
            "with if-better: accept greedy outputs that differ from the live stack's (still reported, with the first "
            "differing position)"
        ),
        "json": "write the JSON report here",
        "markdown": "write a Markdown report here (the file is replaced)",
        "html": "write a self-contained HTML report here",
    },
)
def upgrade(
    c,
    to=None,
    lock=None,
    model=None,
    switch="if-better",
    dry_run=False,
    accept_output_change=False,
    json=None,
    markdown=None,
    html=None,
):
    """Build a new stack beside the live one, A/B it on the GPUs, switch only if it wins."""
    from stackgate.commands import upgrade as command
    from stackgate.flows.upgraderun import UpgradeRequest

    def go():
        if not to:
            raise UsageError(
                "--to NEW_SPEC is required: the spec to upgrade to",
                hint="stackgate upgrade --to NEW_SPEC.toml --dry-run",
            )
        request = UpgradeRequest(
            to=Path(to),
            spec_path=_path(lock),
            model=model,
            switch=switch,
            dry_run=dry_run,
            accept_output_change=accept_output_change,
            json_path=_path(json),
            markdown_path=_path(markdown),
            html_path=_path(html),
        )
        return command.run(request, _ui(0, json, markdown, html))

    cli.run_command(go)


@task(
    iterable=["check"],
    help={
        "config": "a TOML file with a [slurm-health] table (docs/slurm.md): what slurmd's HealthCheckProgram points at",
        "lock": "the spec to check against (an absolute path; default: the config's lock)",
        "prom": "write verify's Prometheus metrics here, as verify --cached --prom does",
        "timeout": "seconds verify may take before it is killed and the node counts as failing (default 30)",
        "check": f"{CHECK_HELP} (default: verify --cached's)",
        "stackgate": "the stackgate program that runs verify (default: this one's interpreter)",
        "slurm_bin": "the folder of Slurm's scontrol and sinfo (slurmd gives the check no PATH)",
        "slurm_conf": "the slurm.conf those commands read (default: Slurm's own)",
        "node": "this node's Slurm name (default: $SLURMD_NODENAME, else the short hostname)",
        "state_dir": "where each node's failure counts and reason history are kept (/var/lib/stackgate/slurm-health)",
        "role": "check (HealthCheckProgram, the default), prolog, epilog (slurm.conf's Prolog=, Epilog=), judge (NHC)",
        "summary": "check nothing: the cluster's nodes by verdict, by drift and by drain reason, from Slurm",
        "partition": "[--summary] only this partition's nodes",
        "json": "[--summary] write the summary as JSON here (- for standard output)",
        "markdown": "[--summary] write the summary as Markdown here",
    },
)
def slurm_health(
    c,
    config=None,
    lock=None,
    prom=None,
    timeout=None,
    check=None,
    stackgate=None,
    slurm_bin=None,
    slurm_conf=None,
    node=None,
    state_dir=None,
    role=None,
    summary=False,
    partition=None,
    json=None,
    markdown=None,
):
    """Slurm's HealthCheckProgram: verify --cached under a time cap; drain on a failure, resume only what it drained."""
    from stackgate.commands import slurmhealth as command

    flags = {
        "lock": lock,
        "prom": prom,
        "timeout_s": timeout,
        "checks": tuple(check or ()),
        "stackgate": stackgate,
        "slurm_bin": slurm_bin,
        "slurm_conf": slurm_conf,
        "node": node,
        "state_dir": state_dir,
        "role": role,
    }
    if summary:
        outputs = {"--json": _path(json), "--markdown": _path(markdown)}
        cli.run_command(lambda: command.summary(_path(config), flags, partition, outputs, _ui(0, json)))
        return
    cli.run_command(lambda: command.run(_path(config), flags, _ui(), _verify_here))


def _verify_here(lock: Path, json: Path, prom: Path | None, checks: tuple[str, ...], mode: str) -> int:
    """`stackgate verify` in this process (slurm-health's forked child; ``mode``: cached, verify or deep)."""

    from stackgate.commands import verify

    request = verify.VerifyRequest(
        spec_path=lock, checks=checks, json_path=json, cached=mode == "cached", deep=mode == "deep", prom_path=prom
    )
    try:
        return int(verify.run(request, _ui()))
    except UsageError as exc:
        print(f"stackgate verify: {express.usage_text(exc)}", file=sys.stderr)
        return 2
