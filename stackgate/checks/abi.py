"""Checks that the stack's compiled parts fit together: imports, and the CUDA majors they link."""

from __future__ import annotations

import os
import re
from typing import Any, Callable, Mapping

from stackgate.checks.core import check
from stackgate.checks.unexplained import swept
from stackgate.facts import Facts, ImportOutcome, Missing
from stackgate.facts.evidencesweep import damaged_objects, explain
from stackgate.models.finding import Finding, Fix
from stackgate.models.result import Result, failed, passed, skipped
from stackgate.models.spec import Spec

__all__ = ["classify_import", "explain_import", "shadowed"]


@check("abi.imports", needs=("imports", "env"), timeout_s=300.0)
def imports(spec: Spec, facts: Facts) -> Result:
    """Each of the stack's modules imports, each in its own interpreter."""
    outcomes = facts.imports
    if isinstance(outcomes, Missing):
        return skipped("no stack interpreter to import with (see python.interpreter)", [outcomes.reason])
    if not outcomes:
        return skipped("the lock lists no import names (python.imports)")
    broken = [o for o in outcomes.values() if not o.ok]
    data: dict[str, Any] = {
        o.name: {"ok": o.ok, "seconds": round(o.duration_s, 3), "error": o.error_line or None}
        for o in outcomes.values()
    }
    timings = ", ".join(f"{o.name} {o.duration_s:.1f}s" for o in outcomes.values() if o.ok)
    if broken:
        known = {o.name: explain_import(o, spec) for o in broken}
        for name, finding in known.items():
            data[name]["finding"] = finding.to_dict() if finding else None
        said = [
            classify_import(o, spec, known[o.name], facts.env.environ, lambda out: swept(facts, out)) for o in broken
        ]
        details = [f"import {o.name}: {text}" for o, (text, _) in zip(broken, said, strict=True)]
        commands = tuple(dict.fromkeys(c for _, fix in said for c in fix.commands))
        fix = Fix(" ".join(dict.fromkeys(fix.text for _, fix in said)), commands)
        return failed(f"{len(broken)} of {len(outcomes)} import(s) fail: {details[0]}", details, fix, data)
    return passed(f"{len(outcomes)} module(s) import ({timings})", data=data)


def explain_import(outcome: ImportOutcome, spec: Spec) -> Finding | None:
    """What the knowledge base knows about an import's failure (its output read as the input
    ``import <name>``); None for a hang, or an error it does not know."""
    if outcome.timed_out:
        return None
    from stackgate.models import knowledge  # the knowledge base loads only to explain a failure: a cached verify
    from stackgate.scan import match_first  # skips both

    return match_first(
        outcome.output, stage="verify", context=knowledge.spec_context(spec), source=f"import {outcome.name}"
    )


def classify_import(
    outcome: ImportOutcome,
    spec: Spec,
    finding: Finding | None,
    environ: Mapping[str, str] | None = None,
    sweep: Callable[[str], tuple[str, Fix | None]] | None = None,
) -> tuple[str, Fix]:
    """What an import failure means in one line, and its fix: the finding's; where the knowledge base knows nothing,
    the file PYTHONPATH put ahead of the stack's own when the traceback came from one, else what the evidence sweep
    (``sweep(output)``) finds abnormal, else the raw error, what the sweep checked and the way to see it whole (never
    a reinstall on a guess)."""
    by_hand = f"{spec.python.target} -c 'import {outcome.name}'"
    if outcome.timed_out:
        return (
            f"timed out after {outcome.duration_s:.0f} s (a hang at import: a lock, a network call, a GPU init)",
            Fix(
                "Run the import by hand to see where it stops.",
                (f"{spec.python.target} -X importtime -c 'import {outcome.name}'",),
            ),
        )
    said = outcome.error_line or "failed with no message"
    text, fix = sweep(outcome.output) if sweep is not None else ("the cause is not known from this error", None)
    if fix is not None:  # evidence first: a damaged library or a limit is the cause, whatever the error reads like
        return f"{said}: {text}", Fix(fix.text, (*fix.commands, by_hand))
    if finding is None:
        shadow = shadowed(outcome.output, (environ or {}).get("PYTHONPATH", ""))
        if shadow is not None:
            file, entry = shadow
            value = (environ or {})["PYTHONPATH"]
            return f"{said}: it came from {file}, which PYTHONPATH={value} puts ahead of the stack's own packages", Fix(
                f"Take {entry} out of PYTHONPATH (or unset it) where the stack runs: it shadows the installed "
                f"{outcome.name}.",
                (f"env -u PYTHONPATH {by_hand}",),
            )
        unknown = Fix("The cause is not known from this error: run the import by hand to see it whole.", (by_hand,))
        return f"{said}; {text}", unknown
    evidence = finding.evidence
    text = f"{evidence.lines[evidence.line - (evidence.start_line or evidence.line)].strip()} -> {finding.cause}"
    if finding.id == "undefined-symbol":
        symbol = finding.values["symbol"]
        demangled = outcome.demangled.get(symbol, symbol)
        text = f"undefined symbol {demangled}: ABI mismatch with {finding.values['provider']}; {finding.cause}"
    return text, finding.fix


_FRAME = re.compile(r'^\s*File "([^"]+)", line \d+', re.MULTILINE)


def shadowed(output: str, pythonpath: str) -> tuple[str, str] | None:
    """(the file, the PYTHONPATH entry holding it) of the first traceback frame that PYTHONPATH put on the path.

    >>> trace = 'Traceback (most recent call last):\\n  File "<string>", line 1\\n'
    >>> trace += '  File "/tmp/s/triton/__init__.py", line 1'
    >>> shadowed(trace, "/x:/tmp/s/")
    ('/tmp/s/triton/__init__.py', '/tmp/s/')
    >>> shadowed('  File "/usr/lib/python3/triton/__init__.py", line 1', "/tmp/s") is None
    True
    """
    entries = [e for e in pythonpath.split(os.pathsep) if e]
    for file in _FRAME.findall(output):
        for entry in entries:
            if file.startswith(entry.rstrip("/") + "/"):
                return file, entry
    return None


@check("abi.elf", needs=("elf", "probe", "dists"))
def elf_links(spec: Spec, facts: Facts) -> Result:
    """Every shared object of the stack is whole, and no locked package's links a CUDA major but torch's."""
    scan, dists = facts.elf, facts.dists
    if isinstance(scan, Missing) or isinstance(dists, Missing):
        reason = scan.reason if isinstance(scan, Missing) else getattr(dists, "reason", "")
        return skipped("no stack environment to scan (see python.interpreter)", [reason])
    whole, damage = damaged_objects(dists)
    if damage:
        text, fix = explain(facts.sweep)
        details = [f"{d.path} ({d.distribution} {d.version}): {d.why}" for d in damage]
        return failed(f"{len(damage)} of {whole} shared object(s) of the stack are damaged: {text}", details, fix)
    if not scan.files:
        names = ", ".join(p.name for p in spec.python.packages) or "none listed"
        return passed(
            f"{whole} shared object(s) of the stack checked whole; the lock's packages hold no shared object: no "
            f"CUDA link to judge (python.packages: {names})",
            data={"files": 0, "checked_whole": whole},
        )
    probe = facts.probe
    torch_cuda = (probe.torch or {}).get("cuda") if not isinstance(probe, Missing) else None
    want = torch_cuda or spec.python.torch_cuda
    if not want:
        return skipped("no CUDA version to compare with (torch is not a CUDA build and the lock names none)")
    major = int(want.split(".")[0])
    wrong = [(f, need) for f in scan.files for need in f.cuda if need.major != major]
    linked = sum(1 for f in scan.files if f.cuda)
    data = {
        "files": len(scan.files),
        "cuda_linked": linked,
        "want_major": major,
        "mismatches": [{"file": f.path, "package": f.distribution, "needs": n.library} for f, n in wrong],
    }
    if wrong:
        details = [f"{_short(f.path)} ({f.distribution}) links {n.library}" for f, n in wrong]
        packages = sorted({f.distribution for f, _ in wrong})
        fix = Fix(
            f"Install the CUDA {want} build of {', '.join(packages)} (e.g. the +cu{want.replace('.', '')} wheel); "
            "PyPI's sgl-kernel 0.3.21 is a CUDA 12.9 build.",
            ("stackgate provision --only python",),
        )
        summary = (
            f"{len(wrong)} shared object(s) link CUDA {wrong[0][1].major} libraries but torch is CUDA {want}: "
            f"{details[0]}"
        )
        return failed(summary, details, fix, data)
    extra = [f"unreadable: {u}" for u in scan.unreadable]
    return passed(
        f"{len(scan.files)} shared object(s) scanned, {linked} link CUDA, all CUDA {major}; {whole} of the stack "
        "checked whole",
        extra,
        {**data, "checked_whole": whole},
    )


def _short(path: str) -> str:
    marker = f"site-packages{os.sep}"
    return path.split(marker, 1)[1] if marker in path else path
