"""A real Slurm cluster on this host for the tests: munged, one slurmctld and N ``slurmd -N nK``.

Everything lives in a folder of its own (made here, removed at the end): the munge key and
socket, slurm.conf, the controller's state, each node's spool, pid and log files. The
controller and every node listen on free loopback ports, so two clusters (two pytest-xdist
workers, two CI jobs) run side by side. Each slurmd runs in a mount namespace of its own with a
private folder mounted at :data:`NODE_LOCAL`: the node-local storage sbcast writes into, as on
separate machines. Every daemon is started here and stopped here by its pid (never by name).

Per-node differences come from the TaskProlog (FACTS.md, Slurm): each line it prints as
``export NAME=value`` lands in the task's environment; it reads ``<node dir>/env`` of the node
the task runs on (:meth:`Cluster.set_env`).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from smoke_support import free_port

SLURMCTLD, SLURMD, MUNGED = (shutil.which(p) or f"/usr/sbin/{p}" for p in ("slurmctld", "slurmd", "munged"))
SBIN = Path("/usr/bin")
#: Where each node's own node-local storage is mounted (in that node's mount namespace only).
NODE_LOCAL = Path("/run/stackgate-test-node")


def why_no_slurm() -> str | None:
    """Why a real Slurm cannot run here (None when it can)."""
    missing = [
        p
        for p in (SLURMCTLD, SLURMD, MUNGED, shutil.which("srun"), shutil.which("unshare"))
        if not p or not Path(p).exists()
    ]
    if missing:
        return "no Slurm here (Debian: apt-get install slurm-wlm munge; .ci/run installs them)"
    if os.geteuid() != 0:
        return "a test Slurm cluster runs its daemons as root (CI runs as root)"
    return None


@dataclass
class Cluster:
    """A running test cluster (see the module's docstring)."""

    home: Path
    nodes: tuple[str, ...]
    ctld_port: int = field(default_factory=free_port)
    node_ports: dict[str, int] = field(default_factory=dict)
    pids: dict[str, int] = field(default_factory=dict)
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    extra: str = ""

    @property
    def conf(self) -> Path:
        return self.home / "slurm.conf"

    @property
    def name(self) -> str:
        """The cluster's ClusterName (its jobs carry it as SLURM_CLUSTER_NAME)."""
        return next(
            line.split("=", 1)[1] for line in self.conf.read_text().splitlines() if line.startswith("ClusterName=")
        )

    @property
    def env(self) -> dict[str, str]:
        """The environment a Slurm client command of this cluster needs."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def node_dir(self, node: str) -> Path:
        return self.home / "nodes" / node

    def local(self, node: str) -> Path:
        """The node's node-local storage, as this host sees it."""
        return self.node_dir(node) / "local"

    def set_env(self, node: str, values: dict[str, str]) -> None:
        """What the TaskProlog exports into every task on ``node`` (replacing what it did)."""
        (self.node_dir(node) / "env").write_text("".join(f"{k}={v}\n" for k, v in values.items()))

    def run(self, *argv: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(list(argv), env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and done.returncode != 0:
            raise AssertionError(f"{' '.join(argv)}: exit {done.returncode}: {done.stdout}{done.stderr}")
        return done

    def states(self) -> dict[str, str]:
        """Each node's state as sinfo prints it (idle, drain, down, ...)."""
        done = self.run("sinfo", "-N", "-h", "-o", "%N %t")
        return dict(line.split() for line in done.stdout.splitlines() if line.strip())

    def reason(self, node: str) -> str:
        doc = json.loads(self.run("sinfo", "--json").stdout)
        return next(str(n.get("reason") or "") for n in doc["nodes"] if n["name"] == node)

    def wait_states(self, wanted: dict[str, str], timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            states = self.states()
            if all(states.get(node, "") == state for node, state in wanted.items()):  # "idle*": not responding yet
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"the nodes did not reach {wanted} within {timeout_s} s: {states}\n{self.logs()}")
            time.sleep(0.2)

    def reset(self) -> None:
        """Every node back to idle, whatever a test did to it: no health script any more (and none
        still running, which could drain a node after its resume), no environment, resumed."""
        for node in self.nodes:
            for hook in HOOKS:
                (self.node_dir(node) / hook).unlink(missing_ok=True)
            self.set_env(node, {})
        scripts = [str(self.node_dir(node) / hook).encode() for node in self.nodes for hook in HOOKS]
        deadline = time.monotonic() + 60
        while any(script in cmdline for cmdline in _cmdlines() for script in scripts) and time.monotonic() < deadline:
            time.sleep(0.1)
        for node in self.nodes:
            self.run("scontrol", "update", f"nodename={node}", "state=resume", check=False)
        self.wait_states(dict.fromkeys(self.nodes, "idle"))

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in sorted(self.home.glob("*.log"))
        )

    def stop(self) -> None:
        """Every daemon by its pid: the nodes, the controller, munged; then the folder."""
        for name, pid in reversed(list(self.pids.items())):
            _stop(pid, name)
        for process in self.processes:
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
        shutil.rmtree(self.home, ignore_errors=True)


def _cmdlines() -> list[bytes]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                found.append((entry / "cmdline").read_bytes())
            except OSError:
                continue
    return found


def _stop(pid: int, name: str, grace_s: float = 10.0) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if not Path(f"/proc/{pid}").exists() or Path(f"/proc/{pid}/stat").read_text().split(") ")[-1].startswith("Z"):
            return
        time.sleep(0.05)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _pid(path: Path, timeout_s: float = 20.0) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.is_file() and path.read_text().strip().isdigit():
            return int(path.read_text())
        time.sleep(0.05)
    raise AssertionError(f"{path}: no pid within {timeout_s} s")


def _munge(home: Path) -> tuple[int, Path]:
    """munged of this cluster: its own key and socket, as the munge user."""
    folder = home / "munge"
    folder.mkdir(mode=0o755)  # munged insists that everyone may reach its socket
    (folder / "key").mkdir(mode=0o700)
    key = folder / "key" / "munge.key"
    key.write_bytes(secrets.token_bytes(1024))
    key.chmod(0o400)
    for path in (folder, folder / "key", key):
        shutil.chown(path, "munge", "munge")
    socket = folder / "munge.socket"
    subprocess.run(
        [
            "runuser",
            "-u",
            "munge",
            "--",
            MUNGED,
            f"--key-file={key}",
            f"--socket={socket}",
            f"--pid-file={folder / 'munged.pid'}",
            f"--log-file={folder / 'munged.log'}",
            f"--seed-file={folder / 'munged.seed'}",
            "--num-threads=4",
        ],
        check=True,
        capture_output=True,
        timeout=30,
    )
    return _pid(folder / "munged.pid"), socket


TASK_PROLOG = """#!/bin/sh
# The node's differences (tests/slurm_cluster.py): NAME=value lines of <node dir>/env, exported.
f="{nodes}/$SLURMD_NODENAME/env"
[ -f "$f" ] || exit 0
while IFS= read -r line; do [ -n "$line" ] && printf 'export %s\\n' "$line"; done < "$f"
exit 0
"""

HOOK = """#!/bin/sh
# slurmd's {what} (tests/slurm_cluster.py): the node's <node dir>/{hook} script, where a test wrote one.
f="{nodes}/$SLURMD_NODENAME/{hook}"
[ -x "$f" ] || exit 0
exec "$f"
"""
#: slurm.conf's HealthCheckProgram, Prolog and Epilog (each this cluster's <home>/<file>): the node's own script.
HOOKS = {
    "health": ("HealthCheckProgram", "healthcheck"),
    "prolog": ("Prolog", "prolog"),
    "epilog": ("Epilog", "epilog"),
}
#: Each node's GPUs as Slurm schedules them: one H200 (the fake NVML's), its device file a stand-in.
GRES = "gpu:h200:1"


def _conf(cluster: Cluster, socket: Path) -> str:
    home = cluster.home
    lines = [
        f"ClusterName=sg{secrets.token_hex(3)}",
        "SlurmctldHost=localhost",
        f"SlurmctldPort={cluster.ctld_port}",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={socket}",
        f"StateSaveLocation={home / 'state'}",
        f"SlurmdSpoolDir={home / 'spool'}/%n",
        f"SlurmctldPidFile={home / 'slurmctld.pid'}",
        f"SlurmdPidFile={home / 'slurmd'}.%n.pid",
        f"SlurmctldLogFile={home / 'slurmctld.log'}",
        f"SlurmdLogFile={home / 'slurmd'}.%n.log",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SelectType=select/cons_tres",
        "SlurmUser=root",
        "SlurmdUser=root",
        "ReturnToService=1",
        "MpiDefault=none",
        f"TaskProlog={home / 'taskprolog'}",
        f"HealthCheckProgram={home / 'healthcheck'}",
        "HealthCheckInterval=2",
        "HealthCheckNodeState=ANY",
        "KillWait=5",
        "MessageTimeout=10",
        "SlurmdTimeout=300",
        "InactiveLimit=0",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "SchedulerParameters=sched_interval=1",
        "SlurmctldParameters=enable_configless",
        "GresTypes=gpu",
        f"Prolog={home / 'prolog'}",
        f"Epilog={home / 'epilog'}",
        cluster.extra,
    ]
    lines += [
        f"NodeName={n} NodeHostname=localhost Port={cluster.node_ports[n]} CPUs=1 Gres={GRES} State=UNKNOWN"
        for n in cluster.nodes
    ]
    lines.append(f"PartitionName=debug Nodes={','.join(cluster.nodes)} Default=YES MaxTime=INFINITE State=UP")
    return "\n".join(line for line in lines if line) + "\n"


def start(nodes: int = 4, *, extra: str = "", timeout_s: float = 60.0) -> Cluster:
    """A running cluster of ``nodes`` nodes (n1..nN), every one idle; stopped by :meth:`Cluster.stop`."""
    home = Path(tempfile.mkdtemp(prefix="stackgate-slurm."))
    home.chmod(0o755)  # munged, as its own user, reaches its folder inside
    names = tuple(f"n{i}" for i in range(1, nodes + 1))
    cluster = Cluster(home, names, node_ports={n: free_port() for n in names}, extra=extra)
    try:
        pid, socket = _munge(home)
        cluster.pids["munged"] = pid
        for folder in ("state", "spool", "nodes"):
            (home / folder).mkdir()
        for name in names:
            cluster.local(name).mkdir(parents=True)
            cluster.set_env(name, {})
        scripts = {"taskprolog": TASK_PROLOG.format(nodes=home / "nodes")}
        for hook, (what, file) in HOOKS.items():
            scripts[file] = HOOK.format(what=what, hook=hook, nodes=home / "nodes")
        for script, text in scripts.items():
            (home / script).write_text(text)
            (home / script).chmod(0o755)
        # gres.conf beside slurm.conf: the GPU's device file is /dev/null (Slurm only opens it with ConstrainDevices)
        (home / "gres.conf").write_text(
            f"AutoDetect=off\nNodeName={','.join(names)} Name=gpu Type=h200 File=/dev/null\n"
        )
        cluster.conf.write_text(_conf(cluster, socket))
        _daemons(cluster)
        cluster.wait_states(dict.fromkeys(names, "idle"), timeout_s)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _daemons(cluster: Cluster) -> None:
    home, env = cluster.home, cluster.env
    log = open(home / "daemons.out", "ab")
    cluster.processes.append(
        subprocess.Popen(
            [SLURMCTLD, "-D", "-i", "-f", str(cluster.conf)], env=env, stdout=log, stderr=log, start_new_session=True
        )
    )
    cluster.pids["slurmctld"] = cluster.processes[-1].pid
    NODE_LOCAL.mkdir(exist_ok=True)
    for name in cluster.nodes:
        # its own mount namespace: the node's private folder at NODE_LOCAL (its node-local storage)
        script = f'mount --bind "$1" {NODE_LOCAL} && exec {SLURMD} -D -N "$2" -f "$3"'
        argv = [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            script,
            "sh",
            str(cluster.local(name)),
            name,
            str(cluster.conf),
        ]
        cluster.processes.append(subprocess.Popen(argv, env=env, stdout=log, stderr=log, start_new_session=True))
        cluster.pids[f"slurmd {name}"] = cluster.processes[-1].pid
