"""The check framework: registry, selection, the parallel runner, the verdict."""

from __future__ import annotations

import threading

import pytest

from stackgate.checks import core
from stackgate.checks.core import Check, run_checks, select
from stackgate.models.exitcodes import ExitCode, UsageError
from stackgate.models.result import Status, failed, passed, skipped, warned
from stackgate.models.verdict import judge


def make(name, function, timeout_s=5.0, slow=False, named_only=False):
    return Check(name, function, name, (), timeout_s, slow, named_only)


def registry(*checks):
    return {c.name: c for c in checks}


def test_statuses_are_ordered_by_severity():
    assert Status.PASS < Status.SKIP < Status.WARN < Status.FAIL < Status.ERROR
    assert max([Status.WARN, Status.ERROR, Status.PASS]) is Status.ERROR


def test_the_real_registry_names_are_stable_and_dotted():
    from stackgate.checks.all import REGISTRY

    expected = {
        "gpu.driver",
        "gpu.driver_cuda",
        "gpu.count",
        "gpu.capability",
        "gpu.pcie",
        "gpu.ecc",
        "gpu.processes",
        "cuda.toolkits",
        "cuda.home",
        "cuda.ptxas_arch",
        "cuda.triton_ptxas",
        "python.interpreter",
        "python.pins",
        "python.frozen",
        "python.consistency",
        "torch.build",
        "torch.arch",
        "flashinfer.cubin",
        "nccl.version",
        "abi.imports",
        "abi.elf",
        "environment.generation",
        "environment.drift",
    }
    assert expected <= set(REGISTRY)
    for check in REGISTRY.values():
        assert check.title.endswith(".") and check.needs, check.name


def test_registering_a_name_twice_is_refused():
    name = next(iter(core.REGISTRY))
    with pytest.raises(UsageError, match="registered twice"):
        core.check(name)(lambda spec, facts: passed("x"))


def test_select_by_exact_name_glob_and_area_prefix():
    checks = registry(make("gpu.a", None), make("gpu.b", None), make("cuda.x", None), make("deep.y", None, slow=True))
    assert [c.name for c in select(["gpu.*"], checks)] == ["gpu.a", "gpu.b"]
    assert [c.name for c in select(["cuda"], checks)] == ["cuda.x"]
    assert [c.name for c in select(["cuda.x", "gpu.b"], checks)] == ["gpu.b", "cuda.x"]
    assert [c.name for c in select([], checks, include_slow=False)] == ["gpu.a", "gpu.b", "cuda.x"]


def test_a_check_that_runs_only_when_named_is_left_out_until_a_pattern_names_it():
    checks = registry(
        make("python.a", None),
        make("environment.g", None, named_only=True),
        make("environment.d", None, named_only=True),
    )
    assert [c.name for c in select([], checks)] == ["python.a"]
    assert [c.name for c in select(["environment.*"], checks)] == ["environment.g", "environment.d"]
    assert [c.name for c in select(["environment.d", "python"], checks)] == ["python.a", "environment.d"]


def test_a_pattern_that_matches_nothing_is_an_error_not_a_green_run():
    with pytest.raises(UsageError, match="no check matches 'gpu.drvier'"):
        select(["gpu.drvier"], registry(make("gpu.driver", None)))


def test_checks_run_in_parallel_and_keep_their_order():
    barrier = threading.Barrier(3, timeout=10)

    def waits(spec, facts):
        barrier.wait()  # only returns when all three checks run at the same time
        return passed("met")

    checks = [make(f"t.{i}", waits) for i in range(3)]
    results = run_checks(checks, spec=None, facts=None)
    assert [r.check for r in results] == ["t.0", "t.1", "t.2"]
    assert all(r.status is Status.PASS for r in results)


def test_a_crashing_check_becomes_error_and_the_others_still_report():
    def crashes(spec, facts):
        raise ValueError("boom")

    results = run_checks([make("t.crash", crashes), make("t.ok", lambda spec, facts: passed("fine"))], None, None)
    assert results[0].status is Status.ERROR and results[0].summary == "the check crashed: ValueError: boom"
    assert results[0].details == ()
    assert results[1].status is Status.PASS


def test_verbose_runs_carry_the_traceback():
    def crashes(spec, facts):
        raise ValueError("boom")

    (result,) = run_checks([make("t.crash", crashes)], None, None, verbose=True)
    assert result.details[0] == "Traceback (most recent call last):" and "ValueError: boom" in result.details[-1]


def test_a_check_returning_the_wrong_type_is_an_error():
    (result,) = run_checks([make("t.bad", lambda spec, facts: "ok")], None, None)
    assert result.status is Status.ERROR and "returned str, not Result" in result.summary


def test_a_check_past_its_timeout_is_an_error():
    release = threading.Event()

    def hangs(spec, facts):
        release.wait(30)
        return passed("late")

    try:
        (result,) = run_checks([make("t.hang", hangs, timeout_s=0.2)], None, None)
    finally:
        release.set()
    assert result.status is Status.ERROR and result.summary == "timed out after 0.2 s"


def test_keyboard_interrupt_propagates():
    def interrupted(spec, facts):
        raise KeyboardInterrupt

    # The worker thread's KeyboardInterrupt reaches the caller through the future.
    with pytest.raises(KeyboardInterrupt):
        run_checks([make("t.int", interrupted)], None, None)


@pytest.mark.parametrize(
    ("statuses", "strict", "code", "reason"),
    [
        ([passed("a"), warned("b")], False, ExitCode.PASSED, "passed"),
        ([passed("a"), warned("b")], True, ExitCode.FAILED, "1 warning(s) with --strict"),
        ([passed("a"), failed("b")], False, ExitCode.FAILED, "1 check(s) failed"),
        ([core.error("x")], False, ExitCode.FAILED, "1 check(s) failed"),
        ([skipped("a"), skipped("b")], False, ExitCode.FAILED, "nothing was checked: every check was skipped"),
        ([], False, ExitCode.FAILED, "nothing was checked: every check was skipped"),
        ([passed("a"), skipped("b")], False, ExitCode.PASSED, "passed"),
    ],
)
def test_the_verdict(statuses, strict, code, reason):
    verdict = judge(statuses, strict=strict)
    assert (verdict.exit_code, verdict.reason) == (code, reason)
