"""`stackgate init --health-units DIR`: the health check's systemd service and timer written with the
installed program's real path (a console script in a venv, reached through a pipx-style symlink) and
the spec `init --system` writes; systemd-analyze verifies what was written and rates its sandbox;
a differing file is kept without --force, --dry-run writes nothing, a path systemd would read as
syntax and a stackgate that is not installed are refused (exit 2, nothing written)."""

from __future__ import annotations

import os
import re
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest

from stackgate.stack import healthunits

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
SERVICE, TIMER = healthunits.SERVICE, healthunits.TIMER


def systemd_analyze() -> str:
    """The path of systemd-analyze; the test skips, with the reason, where it is absent."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed (Debian: apt-get install -y systemd)")
    return analyze


def exposure(unit: Path) -> float:
    """systemd's exposure score of ``unit`` (0 sandboxed .. 10 not at all), from `systemd-analyze security`."""
    done = subprocess.run(
        [systemd_analyze(), "security", "--offline=true", "--no-pager", str(unit)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    found = re.search(rf"Overall exposure level for {re.escape(unit.name)}: (\d+\.\d) ", done.stdout)
    assert found is not None, done.stdout[-2000:] + done.stderr
    return float(found[1])


def unit_settings(text: str) -> dict[str, list[str]]:
    """A unit's settings: each key's values in order (comments and section headers left out)."""
    settings: dict[str, list[str]] = {}
    for line in text.splitlines():
        key, equals, value = line.partition("=")
        if equals and not line.startswith(("#", ";", "[")):
            settings.setdefault(key.strip(), []).append(value.strip())
    return settings


class Installed:
    """stackgate installed as pipx and uv tool install it: a console script in a venv's bin/
    (this checkout's package, run by this Python) and a symlink to it in a bin/ on PATH."""

    def __init__(self, tmp_path: Path) -> None:
        self.script = tmp_path / "tools" / "stackgate" / "bin" / "stackgate"
        self.script.parent.mkdir(parents=True)
        self.script.write_text(
            f"#!{sys.executable}\nimport sys\nsys.path.insert(0, {str(ROOT)!r})\n"
            "from stackgate.main import run\nsys.exit(run())\n"
        )
        self.script.chmod(0o755)
        self.link = tmp_path / "local" / "bin" / "stackgate"
        self.link.parent.mkdir(parents=True)
        self.link.symlink_to(self.script)
        self.system = tmp_path / "etc-stackgate"
        self.units = tmp_path / "systemd"

    def run(self, *args: str, cwd: Path = Path("/")) -> subprocess.CompletedProcess[str]:
        """``stackgate ARGS`` as a user types it: through the symlink, from ``cwd``."""
        env = {k: v for k, v in os.environ.items() if k not in ("STACKGATE_LOCK", "VIRTUAL_ENV")}
        env.update(NO_COLOR="1", STACKGATE_SYSTEM_DIR=str(self.system), PYTHONPATH=str(TESTS))
        return subprocess.run([str(self.link), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture
def installed(tmp_path: Path) -> Installed:
    return Installed(tmp_path)


def test_the_units_run_the_installed_program_on_the_spec_init_system_wrote_and_verify(installed):
    """init --system, then --health-units: ExecStart is the venv's script (the symlink resolved), the
    spec and the condition are the file init --system wrote, and systemd-analyze verify takes both units."""
    done = installed.run("init", "--profile", "hopper-sm90-cu130", "--system")
    assert done.returncode == 0, done.stderr
    spec = installed.system / "stack.toml"
    assert spec.is_file()
    done = installed.run("init", "--health-units", str(installed.units))
    assert done.returncode == 0, done.stderr
    assert f"wrote {installed.units / SERVICE}" in done.stdout and "systemctl enable --now" in done.stdout
    unit = unit_settings((installed.units / SERVICE).read_text())
    assert unit["ExecStart"] == [
        f"{installed.script} verify --cached --prom /var/lib/prometheus/node-exporter/stackgate_verify.prom"
    ]
    assert unit["ConditionPathExists"] == [str(spec)] and f"STACKGATE_LOCK={spec}" in unit["Environment"]
    assert (installed.units / TIMER).read_text() == (healthunits.TEMPLATES / TIMER).read_text()
    # the program the unit runs answers from /, with no checkout or venv around it
    version = subprocess.run([str(installed.script), "--version"], cwd="/", capture_output=True, text=True, timeout=60)
    assert version.returncode == 0 and "stackgate" in version.stdout.lower(), version.stderr
    analyze = systemd_analyze()
    units = [str(installed.units / SERVICE), str(installed.units / TIMER)]
    done = subprocess.run([analyze, "verify", "--man=no", *units], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "stackgate-health" not in done.stderr, done.stderr
    broken = installed.units.parent / "broken.service"
    broken.write_text((installed.units / SERVICE).read_text().replace("Type=oneshot", "Type=oneshoot"))
    failed = subprocess.run([analyze, "verify", "--man=no", str(broken)], capture_output=True, text=True, timeout=120)
    assert "Failed to parse service type" in failed.stderr


def test_a_differing_unit_is_kept_without_force_and_dry_run_writes_nothing(installed):
    spec = installed.system / "node.toml"
    first = installed.run("init", "--health-units", str(installed.units), "--lock", str(spec))
    assert first.returncode == 0, first.stderr
    assert f"{spec} does not exist: the timer does nothing until it does" in first.stderr
    again = installed.run("init", "--health-units", str(installed.units), "--lock", str(spec))
    assert again.returncode == 0 and f"unchanged {installed.units / SERVICE}" in again.stdout, again.stderr
    timer = installed.units / TIMER
    timer.write_text(timer.read_text().replace("OnUnitActiveSec=1min", "OnUnitActiveSec=5min"))
    edited = timer.read_text()
    refused = installed.run("init", "--health-units", str(installed.units), "--lock", str(spec))
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert f"{timer} exists and differs" in refused.stderr and "--force" in refused.stderr
    assert timer.read_text() == edited
    dry = installed.run("init", "--health-units", str(installed.units), "--lock", str(spec), "--dry-run", "--force")
    assert dry.returncode == 0, dry.stderr
    assert f"--- {timer} (differs: --force would replace it)" in dry.stdout and "OnUnitActiveSec=1min" in dry.stdout
    assert f"ExecStart={installed.script} verify --cached" in dry.stdout and timer.read_text() == edited
    forced = installed.run("init", "--health-units", str(installed.units), "--lock", str(spec), "--force")
    assert forced.returncode == 0 and "OnUnitActiveSec=1min" in timer.read_text(), forced.stderr


def test_the_written_service_is_sandboxed_to_an_exposure_of_4_or_less(installed, tmp_path):
    """`systemd-analyze security` rates the written unit; the same unit with its sandbox taken out
    (every line after TimeoutStartSec=, as it shipped before) rates above 4, so the score is read right."""
    assert installed.run("init", "--health-units", str(installed.units)).returncode == 0
    service = installed.units / SERVICE
    assert exposure(service) <= 4.0
    text = service.read_text()
    bare = tmp_path / SERVICE
    bare.write_text(text[: text.index("\n", text.index("TimeoutStartSec=")) + 1])
    assert exposure(bare) > 4.0


def test_the_health_unit_s_sandbox_leaves_what_the_health_check_reads_and_writes():
    """What a cached verify needs on a node, kept through the sandbox: the GPUs' device nodes (NVML;
    nvidia-uvm for the CUDA probe of the stack's torch on a miss), the kernel's record device and the
    capability to read it under kernel.dmesg_restrict=1 (gpu.kernel_events), every process's /proc
    entry (gpu.processes names the processes on a GPU), /proc/driver (NVML), a cache it may write and the
    collector's folder, whose files node_exporter (another user) must be able to read."""
    written = healthunits.render_units(Path("/opt/stackgate/bin/stackgate"), Path("/etc/stackgate/stack.toml"))[0]
    unit = unit_settings(written.text)

    def setting(key: str, default: str = "no") -> str:
        return unit.get(key, [default])[-1]

    assert setting("PrivateDevices") == "no" and setting("DevicePolicy") == "closed"
    gpus = {"char-nvidia rw", "char-nvidia-frontend rw", "char-nvidia-uvm rw"}  # 195 is "nvidia" under the open driver
    assert gpus | {"/dev/kmsg r"} <= set(unit["DeviceAllow"])
    assert setting("ProtectKernelLogs") == "no" and setting("CapabilityBoundingSet").split() == ["CAP_SYSLOG"]
    assert setting("PrivateUsers") == "no"  # capabilities in a user namespace of its own do not open /dev/kmsg
    assert setting("ProtectProc", "default") == "default" and setting("ProcSubset", "all") == "all"
    assert setting("ProtectSystem") == "strict" and setting("UMask", "0022") == "0022"
    prom = Path(setting("ExecStart").split("--prom ", 1)[1].split()[0])
    assert f"-{prom.parent}" in unit["ReadWritePaths"]
    assert "XDG_CACHE_HOME=%C" in unit["Environment"] and setting("CacheDirectory") == "stackgate"


@pytest.mark.parametrize("spec", ["/etc/stack guard/stack.toml", "/etc/100%/stack.toml", "/etc/$HOME/stack.toml"])
def test_a_spec_path_systemd_would_read_as_syntax_is_refused_and_nothing_is_written(installed, spec):
    done = installed.run("init", "--health-units", str(installed.units), "--lock", spec)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert f"the spec (--lock) {spec!r} holds" in done.stderr and "which systemd reads as syntax" in done.stderr
    assert not installed.units.exists()


def test_a_relative_spec_is_made_absolute_from_the_folder_it_is_given_in(installed, tmp_path):
    done = installed.run("init", "--health-units", str(installed.units), "--lock", "stack.toml", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    unit = unit_settings((installed.units / SERVICE).read_text())
    assert unit["ConditionPathExists"] == [str(tmp_path / "stack.toml")]


def test_a_stackgate_that_is_not_installed_is_refused_with_how_to_install_one(tmp_path):
    """The checkout's `python -m stackgate` (no `stackgate` beside this Python): no unit could run it."""
    # The interpreter behind this one (a venv's, as CI's .ci/venv, may hold an installed stackgate beside it),
    # with this environment's packages on its path.
    python = Path(os.path.realpath(sys.executable))
    if (python.parent / "stackgate").exists():
        pytest.skip(f"a stackgate is installed beside {python}")
    code = f"import runpy, sys; sys.path.insert(0, {str(ROOT)!r}); runpy.run_module('stackgate', run_name='__main__')"
    units = tmp_path / "systemd"
    packages = os.pathsep.join(site.getsitepackages())
    done = subprocess.run(
        [str(python), "-c", code, "init", "--health-units", str(units)],
        cwd=tmp_path,
        env={**os.environ, "NO_COLOR": "1", "PYTHONPATH": packages},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "is not an installed program" in done.stderr and "pipx install stackgate" in done.stderr
    assert not units.exists()


def test_a_spec_that_does_not_load_is_refused_now_not_every_minute(installed, tmp_path):
    spec = tmp_path / "stack.toml"
    spec.write_text("[hardware]\ngpu_count = 'eight'\n")
    done = installed.run("init", "--health-units", str(installed.units), "--lock", str(spec))
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert f"{spec}: " in done.stderr and "hardware.gpu_count: must be an integer" in done.stderr, done.stderr
    assert not installed.units.exists()
