"""The failure knowledge base: every entry finds its own real examples, healthy logs stay quiet,
and the scanner reads streams of any shape the same way."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest

from stackgate import scan as engine
from stackgate.checks.abi import classify_import, explain_import
from stackgate.facts import ImportOutcome
from stackgate.models import knowledge as signatures
from stackgate.models.finding import Finding
from stackgate.models.knowledge import CONTEXT_KEYS, SignatureError
from stackgate.models.spec import load_spec
from stackgate.scan import Scanner, extract
from stackgate.scan.events import GENERIC_KEYS
from stackgate.scan.keys import quoted_names, required_literal
from stackgate.scan.scanner import _anchor, _sought

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(__file__).resolve().parent / "data"
LOCK = ROOT / "lockfiles" / "blackwell-sm120-cu130.toml"
ALL = engine.load()
#: The default profile's values: an installer entry reads versions against the lock's pins.
LOCKED = signatures.spec_context(load_spec(LOCK))
EXAMPLES = [pytest.param(s, i, id=f"{s.id}[{i}]") for s in ALL for i in range(len(s.examples))]
SOURCE = re.compile(r"^(https://github\.com/[\w.-]+/[\w.-]+/(issues|pull)/\d+|[\w.-]+ \d[\w.]* wheel: \S.*)$")

#: Ids other modules use: verify's import classifier, smoke's scan. They must not be renamed.
USED_ELSEWHERE = {
    "undefined-symbol",
    "cuda-major-mismatch",
    "glibcxx-too-old",
    "module-not-installed",
    "flashinfer-cubin-version-mismatch",
    "sglang-attention-backend-default",
    "sglang-deepgemm-scale-fmt",
    "flashinfer-fusion-arch-unsupported",
    "sglang-symm-mem-keyerror",
    "cuda-out-of-memory",
    "cuda-no-kernel-image",
    "nccl-error",
    "nccl-watchdog-timeout",
}


def scan(text: str, **kwargs: object) -> Scanner:
    scanner = Scanner(**kwargs)  # type: ignore[arg-type]
    scanner.feed_text(text)
    scanner.finish()
    return scanner


def ids(scanner: Scanner) -> list[str]:
    return [f.id for f in scanner.findings]


# -- the knowledge base, entry by entry -------------------------------------------------------


@pytest.mark.parametrize(("signature", "index"), EXAMPLES)
def test_each_entry_finds_its_real_example(signature: signatures.Signature, index: int) -> None:
    assert signature.id in ids(scan(signature.examples[index], context=LOCKED))


@pytest.mark.parametrize(("signature", "index"), EXAMPLES)
def test_each_example_is_found_when_it_arrives_in_pieces(signature: signatures.Signature, index: int) -> None:
    data = signature.examples[index].encode()
    for size in (1, 7, 64):
        scanner = Scanner(context=LOCKED)
        for start in range(0, len(data), size):
            scanner.feed_bytes(data[start : start + size])
        scanner.finish()
        assert signature.id in ids(scanner), f"chunks of {size} bytes"


@pytest.mark.parametrize(("signature", "index"), EXAMPLES)
def test_each_example_is_found_by_match_all(signature: signatures.Signature, index: int) -> None:
    assert signature.id in [m.id for m in engine.match_all(signature.examples[index], context=LOCKED)]


@pytest.mark.parametrize("signature", ALL, ids=lambda s: s.id)
def test_each_entry_is_complete(signature: signatures.Signature) -> None:
    assert SOURCE.match(signature.source), (
        f"source must be an issue/PR URL or a released wheel's file: {signature.source!r}"
    )
    assert signature.title and signature.cause and signature.fix
    assert set(signature.stages) <= set(signatures.STAGES) and signature.component in signatures.COMPONENTS
    assert all(ref.startswith("https://") or " wheel: " in ref for ref in signature.references)
    assert quoted_names(signature) <= set(signature.group_names) | set(CONTEXT_KEYS) | set(
        extract.EXTRACTORS.get(signature.extract or "", extract.Extractor((), dict)).provides
    )


@pytest.mark.parametrize("signature", [s for s in ALL if s.counterexamples], ids=lambda s: s.id)
def test_counterexamples_do_not_match(signature: signatures.Signature) -> None:
    for text in signature.counterexamples:
        assert signature.id not in ids(scan(text))


def test_the_knowledge_base_is_large_and_keeps_the_ids_others_use() -> None:
    assert len(ALL) >= 40
    assert USED_ELSEWHERE <= {s.id for s in ALL}
    assert {s.component for s in ALL} >= {
        "sglang",
        "sgl-kernel",
        "flashinfer",
        "torch",
        "triton",
        "nccl",
        "cuda toolkit",
        "driver",
        "resolver",
    }


@pytest.mark.parametrize(
    "text",
    [
        (
            'id = "x"\ntitle = "t"\ncomponent = "nope"\nstages = ["smoke"]\nseverity = "fail"\npatterns = ["some '
            'literal text"]\ncause = "c"\nfix = "f"\nsource = "s"\nexamples = ["e"]'
        ),
        'id = "x"\ntitle = "t"\ncomponent = "torch"\nstages = ["smoke"]\nseverity = "fail"\npatterns = ["some '
        'literal text"]\ncause = "{nobody}"\nfix = "f"\nsource = "s"\nexamples = ["e"]',
        'id = "x"\ntitle = "t"\ncomponent = "torch"\nstages = ["smoke"]\nseverity = "fail"\npatterns = '
        '["(a|b)+"]\ncause = "c"\nfix = "f"\nsource = "s"\nexamples = ["e"]',
        'id = "x"\ntitle = "t"\ncomponent = "torch"\nstages = ["smoke"]\nseverity = "fail"\npatterns = '
        '["(unclosed"]\ncause = "c"\nfix = "f"\nsource = "s"\nexamples = ["e"]',
        'id = "x"\ncomponent = "torch"\nstages = ["smoke"]\nseverity = "fail"\npatterns = ["some literal '
        'text"]\ncause = "c"\nfix = "f"\nsource = "s"\nexamples = ["e"]',
        'id = "x"\ntitle = "t"\ncomponent = "torch"\nstages = ["smoke"]\nseverity = "fatal"\npatterns = ["some '
        'literal text"]\ncause = "c"\nfix = "f"\nsource = "s"\nexamples = ["e"]',
    ],
    ids=["component", "unknown-name", "no-literal", "bad-regex", "no-title", "severity"],
)
def test_a_malformed_entry_fails_at_load_with_its_file_and_id(tmp_path: Path, text: str) -> None:
    (tmp_path / "bad.toml").write_text("[[signature]]\n" + text + "\n")
    with pytest.raises(SignatureError, match=r"bad\.toml: (?:signature\[0\] \(x\)|x:)"):
        engine.load(tmp_path)


def test_duplicate_ids_fail_at_load(tmp_path: Path) -> None:
    entry = (
        '[[signature]]\nid = "x"\ntitle = "t"\ncomponent = "torch"\nstages = ["smoke"]\nseverity = "fail"\n'
        'patterns = ["some literal text"]\ncause = "c"\nfix = "f"\nsource = "s"\nexamples = ["e"]\n'
    )
    (tmp_path / "a.toml").write_text(entry)
    (tmp_path / "b.toml").write_text(entry)
    with pytest.raises(SignatureError, match="duplicate signature ids: x"):
        engine.load(tmp_path)


def test_required_literal_is_what_every_match_contains() -> None:
    assert (
        required_literal(re.compile(r"Watchdog caught (?P<x>\w+) timeout: WorkNCCL\(SeqNum=(?P<seq>\d+)"))
        == " timeout: WorkNCCL(SeqNum="
    )
    assert required_literal(re.compile(r"(?s)foo.{0,9}?KeyError: (?P<m>\d+)")) == "KeyError: "


# -- healthy logs stay quiet ------------------------------------------------------------------


def scan_file(name: str, **kwargs: object) -> Scanner:
    scanner = Scanner(source=name, **kwargs)  # type: ignore[arg-type]
    with open(DATA / name, "rb") as stream:
        scanner.scan_stream(stream)
    return scanner


def test_a_healthy_sglang_start_has_no_warning_or_error() -> None:
    scanner = scan_file("sglang-0.5.9-tp8-healthy.log")
    assert scanner.number == len((DATA / "sglang-0.5.9-tp8-healthy.log").read_text().splitlines())
    # Only the expected note that TP8 on PCIe runs all-reduce on NCCL.
    assert ids(scanner) == ["sglang-custom-allreduce-pcie"]
    assert scanner.findings[0].severity == "info" and scanner.findings[0].evidence.count == 8


@pytest.mark.parametrize("name", ["pip-install-healthy.log", "uv-install-healthy.log"])
def test_a_healthy_install_log_has_no_finding(name: str) -> None:
    assert ids(scan_file(name)) == []


# -- the scanner: streams, windows, ends ------------------------------------------------------

HEALTHY = (DATA / "sglang-0.5.9-tp8-healthy.log").read_text()
SYMM_MEM = next(s for s in ALL if s.id == "sglang-symm-mem-keyerror").examples[0]
UV = next(s for s in ALL if s.id == "uv-no-solution").examples[0]


def planted() -> tuple[str, dict[str, int]]:
    """A long healthy log with failures planted at known lines."""
    healthy = HEALTHY.splitlines()
    lines: list[str] = []
    where: dict[str, int] = {}
    for round_ in range(40):
        lines += healthy
        if round_ == 7:
            lines.append("[2026-02-03 09:10:00 TP3] RuntimeError: CUDA error: an illegal memory access was encountered")
            where["cuda-illegal-memory-access"] = len(lines)
        if round_ == 21:
            lines += SYMM_MEM.splitlines()
            where["sglang-symm-mem-keyerror"] = len(lines)
        if round_ == 33:
            lines += UV.splitlines()
            where["uv-no-solution"] = len(lines) - len(UV.splitlines()) + 1
    return "\n".join(lines) + "\n", where


@pytest.mark.parametrize("chunk", [1000, 4096, 65536, 1 << 23])
def test_line_numbers_are_right_whatever_the_block_size(chunk: int) -> None:
    text, where = planted()
    scanner = Scanner(source="planted.log")
    scanner.scan_stream(io.BytesIO(text.encode()), chunk=chunk)
    found = {f.id: f for f in scanner.findings}
    assert scanner.number == text.count("\n")
    for signature_id, line in where.items():
        assert found[signature_id].evidence.line == line, signature_id
        assert found[signature_id].evidence.file == "planted.log"
    assert found["sglang-symm-mem-keyerror"].evidence.lines[-1] == "KeyError: 12"
    assert found["sglang-symm-mem-keyerror"].evidence.start_line == where["sglang-symm-mem-keyerror"] - 2
    assert found["uv-no-solution"].values["package"] == "cuda-toolkit"


def test_the_prefilter_finds_every_key_wherever_it_stands() -> None:
    """The scan looks for its words in text translated so that each word's anchor byte reads as NUL:
    every word must still be found, behind and among other words' anchor bytes and real NULs, at
    any offset. The word of a pattern matched within one line may be another literal than its key:
    then every match holds it."""
    plan = Scanner(never_silent=True)._plan
    assert plan.keys is not None and plan.search is not None
    words = {_sought(s, i) for s in ALL if not s.at_end for i in range(len(s.keys))} | set(GENERIC_KEYS)
    noise = bytes(sorted({w[_anchor(w)] for w in words})) + b"\x00\x01 "
    for word in words:
        for line in (word, noise + word, word + noise, noise[::-1] + word[:-1] + noise + word + b"!"):
            assert plan.search.search(line.translate(plan.table)) is not None, (word, line)
    assert plan.keys.search(noise * 3) is None
    others = 0
    for signature in ALL:
        for index, pattern in enumerate(signature.patterns):
            word = _sought(signature, index).decode()
            if signature.at_end or word == signature.keys[index]:
                continue
            others += 1
            assert signature.window == 1 and not signature.after, signature.id
            for example in signature.examples:
                assert all(word in hit.group() for hit in pattern.finditer(example)), (signature.id, word)
    assert others >= 10  # the rarer literal is the one sought for many one-line patterns


def test_a_traceback_split_across_blocks_is_one_event() -> None:
    scanner = Scanner()
    data = SYMM_MEM.encode()
    cut = data.index(b"~")
    scanner.feed_bytes(data[:cut])
    scanner.feed_bytes(data[cut:] + b"\n")
    scanner.finish()
    (finding,) = [f for f in scanner.findings if f.id == "sglang-symm-mem-keyerror"]
    assert finding.values["major"] == "12" and finding.evidence.count == 1 and len(finding.evidence.lines) == 3


def test_a_report_whose_explanation_arrives_later_is_completed() -> None:
    head, rest = UV.split("\n", 1)
    scanner = Scanner(context={"lock_pins": "torch==2.9.1+cu130"})
    assert scanner.feed(head) == []  # the explanation has not arrived yet
    for line in rest.splitlines():
        scanner.feed(line)
    new = scanner.finish()
    assert [f.id for f in new] == ["uv-no-solution"]
    assert new[0].values["culprit"] == "torch 2.11.0+cu130 (cuda-toolkit[cublas]==13.0.2)"


def test_init_complete_is_a_hang_only_at_the_end_of_the_log() -> None:
    init = next(s for s in ALL if s.id == "nccl-hang-after-init").examples[0]
    assert "nccl-hang-after-init" in ids(scan(HEALTHY + init))
    assert "nccl-hang-after-init" not in ids(scan(init + "\n" + HEALTHY))
    assert "nccl-hang-after-init" in ids(
        scan(init + "\nhost:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC\n\n")
    )
    nccl_only = "\n".join(line for line in init.splitlines() if "NCCL INFO" in line)
    assert "nccl-hang-after-init" not in ids(
        scan("NCCL version 2.27.7+cuda13.0\n" + nccl_only)
    )  # a pasted init excerpt: no context


def test_dist_init_without_its_end_is_a_hang_but_a_crash_is_not() -> None:
    begin = (
        "[2026-02-03 09:00:14 TP0] Init torch distributed begin.\n[2026-02-03 09:00:15 TP0] sglang is using "
        "nccl==2.27.7\n"
    )
    assert "sglang-hang-at-dist-init" in ids(scan(begin))
    assert "sglang-hang-at-dist-init" not in ids(
        scan(begin + "Traceback (most recent call last):\nRuntimeError: boom\n")
    )
    assert "sglang-hang-at-dist-init" not in ids(scan(HEALTHY))


def test_a_start_that_never_became_ready_names_the_most_specific_hang() -> None:
    start = HEALTHY.split("Load weight begin")[0].rsplit("\n", 1)[0] + "\n"  # up to the weights
    assert ids(scan(start + "[2026-02-03 09:00:18 TP0] Load weight begin. avail mem=93.62 GB\n")) == [
        "sglang-never-ready",
        "sglang-custom-allreduce-pcie",
    ]
    stuck = ids(scan(HEALTHY.split("[2026-02-03 09:00:16")[0]))  # the log ends inside torch.distributed init
    assert "sglang-hang-at-dist-init" in stuck and "sglang-never-ready" not in stuck
    assert "sglang-never-ready" not in ids(scan(HEALTHY))


def test_repeats_are_counted_and_the_first_is_reported() -> None:
    line = (
        "[rank{r}]:[E226 11:16:37.1 ProcessGroupNCCL.cpp:616] [Rank {r}] Watchdog caught collective operation "
        "timeout: WorkNCCL(SeqNum=5653, OpType=ALLREDUCE, NumelIn=1, NumelOut=1"
    )
    scanner = scan("\n".join(line.format(r=r) for r in range(8)))
    (finding,) = scanner.findings
    assert (
        finding.evidence.count == 8
        and finding.evidence.line == 1
        and finding.values == {"seq": "5653", "op": "ALLREDUCE"}
    )


def test_a_specific_signature_supersedes_the_generic_one_on_its_line() -> None:
    found = ids(
        scan("Exception: Capture cuda graph failed: No supported CUDA architectures found for major versions [9, 10].")
    )
    assert found == ["flashinfer-fusion-arch-unsupported"]
    assert ids(scan("Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate 2.00 GiB")) == [
        "cuda-out-of-memory",
        "sglang-capture-cuda-graph-failed",
    ]


def test_causes_come_before_their_consequences() -> None:
    text = (
        "Received sigquit from a child process. It usually means the child failed.\nRuntimeError: CUDA error: no "
        "kernel image is available for execution on the device\n"
    )
    assert ids(scan(text)) == ["cuda-no-kernel-image", "sglang-child-failed"]


def test_feed_reports_a_signature_once_and_finish_once() -> None:
    scanner = Scanner(stage="smoke")
    line = "RuntimeError: CUDA error: no kernel image is available for execution on the device"
    assert [f.id for f in scanner.feed(line)] == ["cuda-no-kernel-image"]
    assert scanner.feed(line) == []
    assert scanner.finish() == [] and scanner.finish() == []
    assert scanner.findings[0].evidence.count == 2


def test_a_stage_selects_its_signatures() -> None:
    text = "Successfully uninstalled torch-2.10.0+cu130"
    assert ids(scan(text, stage="smoke")) == []
    assert ids(scan(text, stage="provision")) == ["torch-replaced"]


def test_an_unterminated_last_line_and_a_huge_line_are_scanned() -> None:
    scanner = Scanner()
    scanner.feed_bytes(b"ok\nModuleNotFoundError: No module named 'sglang'")
    assert scanner.finish()[0].id == "module-not-installed"
    scanner = Scanner()
    scanner.feed_bytes(b"\r" * (2 << 20) + b" undefined symbol: _ZN3c104cuda9SetDeviceEab")
    assert "undefined-symbol" in ids(scanner) or "undefined-symbol" in [f.id for f in scanner.finish()]


# -- context and values -----------------------------------------------------------------------


def test_a_lock_fills_the_context_keys() -> None:
    context = signatures.spec_context(load_spec(LOCK))
    assert context["lock_backend"] == "flashinfer"
    assert context["lock_torch"] == "torch==2.9.1+cu130"
    assert context["torch_cuda"] == "13.0" and context["cuda_home"] == "/usr/local/cuda-13.0"
    assert context["min_driver"] == "580.82.07"
    assert context["lock_pins"] == "torch==2.9.1+cu130 torchaudio==2.9.1+cu130 triton==3.5.1 nvidia-nccl-cu13==2.27.7"
    assert set(context) <= set(CONTEXT_KEYS)


def test_findings_quote_the_lock_or_a_neutral_phrase() -> None:
    line = "[2026-02-03 09:00:18 TP0] Attention backend not specified. Use triton backend by default."
    with_lock = scan(line, context=signatures.spec_context(load_spec(LOCK))).findings[0]
    assert "chose triton by itself; the stack runs flashinfer." in with_lock.cause
    assert with_lock.fix.commands == (f"stackgate verify --check abi.imports --check flashinfer.cubin --lock {LOCK}",)
    without = scan(line).findings[0]
    assert "the stack runs flashinfer in the default profile." in without.cause
    assert "{" not in without.cause + without.fix.text + "".join(without.fix.commands)


def test_cuda_major_findings_quote_the_locked_torch_build() -> None:
    context = signatures.spec_context(load_spec(LOCK))
    match = scan(
        "ImportError: libcudart.so.12: cannot open shared object file: No such file or directory", context=context
    ).findings[0]
    assert match.title == "libcudart.so.12 is missing: a build for CUDA 12, not for the stack's CUDA (13.0)"
    arch = scan(
        "NVIDIA RTX PRO 6000 Blackwell Server Edition with CUDA capability sm_120 is not compatible with the "
        "current PyTorch installation.",
        context=context,
    )
    assert "the stack pins torch==2.9.1+cu130" in arch.findings[0].cause


PIP_BLOCK = next(s for s in ALL if s.id == "pip-resolution-impossible").examples[1]


def test_the_resolver_culprit_is_the_requirement_that_excludes_the_pin() -> None:
    found = extract.torch_requirers(PIP_BLOCK, {"lock_pins": "torch==2.4.0"})
    assert found["package"] == "torch"
    assert found["culprit"] == "no requirer in the report excludes 2.4.0"
    found = extract.torch_requirers(PIP_BLOCK, {"lock_pins": "torch==2.9.1+cu130"})
    assert found["culprit"] == "vllm 0.5.4 (torch==2.4.0)"
    assert "deepspeed 0.12.6 (torch)" in found["requirers"]


def test_uv_reports_are_read_through_their_line_wrapping() -> None:
    report = (
        "  × No solution found when resolving dependencies:\n  ╰─▶ Because flashinfer-python==0.6.4 depends on\n      "
        "torch>=2.10 and you require torch==2.9.1+cu130, we can conclude that your\n      requirements are "
        "unsatisfiable."
    )
    found = scan(report, context={"lock_pins": "torch==2.9.1+cu130"}).findings[0].values
    assert found["package"] == "torch"
    assert found["culprit"] == "flashinfer-python 0.6.4 (torch>=2.10)"


def test_a_uv_report_about_every_version_of_a_requirer_names_it() -> None:
    """uv 0.9 writes "all versions of X depend on" (not "depends on") when no release fits."""
    report = (
        "error: No solution found when resolving dependencies\n"
        "  cause: Because all versions of eager-upgrader depend on torch>=2.10 and you require torch==2.9.1+cu130, "
        "we can conclude that your requirements and all versions of eager-upgrader are incompatible.\n"
        "         And because you require eager-upgrader==1.0, we can conclude that your requirements are "
        "unsatisfiable."
    )
    (finding,) = scan(report, stage="provision", context={"lock_pins": "torch==2.9.1+cu130"}).findings
    assert finding.id == "uv-no-solution" and finding.values["culprit"] == "eager-upgrader (torch>=2.10)"


# -- the other users of the knowledge base -----------------------------------------------------


def test_verify_import_classifier_still_names_undefined_symbols() -> None:
    spec = load_spec(LOCK)
    outcome = ImportOutcome(
        "sgl_kernel",
        False,
        0.4,
        "ImportError: /x/sgl_kernel/common_ops.abi3.so: undefined symbol: _ZN3c104cuda9SetDeviceEab",
        demangled={"_ZN3c104cuda9SetDeviceEab": "c10::cuda::SetDevice(signed char, bool)"},
    )
    text, fix = classify_import(outcome, spec, explain_import(outcome, spec))
    assert text.startswith("undefined symbol c10::cuda::SetDevice(signed char, bool): ABI mismatch with torch")
    flag = f" --lock {spec.path}"
    assert fix.commands == (
        f"stackgate provision --only python{flag}",
        f"stackgate verify --check python.frozen --check abi.imports{flag}",
    )


def test_verify_import_classifier_names_a_cuda_major_mismatch() -> None:
    outcome = ImportOutcome(
        "sgl_kernel",
        False,
        0.4,
        "Traceback (most recent call last):\nImportError: libcudart.so.12: cannot open shared object file: No such "
        "file or directory",
    )
    spec = load_spec(LOCK)
    text, _ = classify_import(outcome, spec, explain_import(outcome, spec))
    assert "built against CUDA 12 (libcudart.so.12)" in text and "the stack's (13.0)" in text


# -- every text reads as English without a lock (stackgate diagnose with no --lock) ----------------

_WORDS = re.compile(r"[\w'.+=/<>-]+")
_ARTICLE_CLASH = re.compile(r"\b(a|an|the)\s+\S+\s+(a|an|the)\b", re.IGNORECASE)


def _texts(finding: Finding) -> dict[str, str]:
    return {
        "title": finding.title,
        "cause": finding.cause,
        "fix": finding.fix.text,
        **{f"commands[{i}]": c for i, c in enumerate(finding.fix.commands)},
    }


def _bigrams(text: str) -> dict[tuple[str, str], int]:
    words = [w.lower().strip(".,;:") for w in _WORDS.findall(text)]
    counts: dict[tuple[str, str], int] = {}
    for pair in zip(words, words[1:], strict=False):
        counts[pair] = counts.get(pair, 0) + 1
    return counts


def _depth(text: str) -> int:
    depth = deepest = 0
    for ch in text:
        depth += (ch == "(") - (ch == ")")
        deepest = max(deepest, depth)
    return deepest


def _holes(without: str, with_lock: str) -> list[str]:
    """What the no-lock wording got wrong that the lock's wording did not: holes, empty
    brackets, a doubled word or phrase, two articles in a row, brackets inside brackets."""
    found = [f"unfilled {name}" for name in re.findall(r"\{(\w+)\}", without) if name in CONTEXT_KEYS]
    if len(re.findall(r"\(\s*\)", without)) > len(re.findall(r"\(\s*\)", with_lock)):
        found.append("empty brackets")
    found += [f"doubled {m[1]!r}" for m in re.finditer(r"\b(\w+)\s+\1\b", without, re.IGNORECASE)]
    lock_pairs = _bigrams(with_lock)
    found += [
        f"repeated {' '.join(pair)!r}" for pair, n in _bigrams(without).items() if n > 1 and n > lock_pairs.get(pair, 0)
    ]
    if len(_ARTICLE_CLASH.findall(without)) > len(_ARTICLE_CLASH.findall(with_lock)):
        found.append(f"two articles: {_ARTICLE_CLASH.search(without)[0]!r}")  # type: ignore[index]
    if _depth(without) > max(1, _depth(with_lock)):
        found.append("brackets inside brackets")
    return found


@pytest.mark.parametrize("signature", ALL, ids=lambda s: s.id)
def test_without_a_lock_every_text_reads_without_holes(signature: signatures.Signature) -> None:
    text = next((t for t in signature.examples if engine.match_all(t, signatures=[signature])), None)
    if text is None:  # an entry read against the lock only (installer versions): nothing without one
        assert signature.extract == "installed_version" and engine.match_all(
            signature.examples[0], signatures=[signature], context=LOCKED
        )
        return
    (without,) = engine.match_all(text, signatures=[signature])
    (with_lock,) = engine.match_all(text, signatures=[signature], context=signatures.spec_context(load_spec(LOCK)))
    locked = _texts(with_lock)
    problems = {name: found for name, value in _texts(without).items() if (found := _holes(value, locked[name]))}
    assert not problems, "\n".join(f"{name}: {found}\n  {_texts(without)[name]}" for name, found in problems.items())
