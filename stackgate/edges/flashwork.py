"""flashinfer's kernels for `stackgate verify --deep`, run by the stack's OWN interpreter (stdlib, torch, flashinfer).

    <target python> flashwork.py gate OUT.jsonl REQUEST-JSON
    <target python> flashwork.py attention OUT.jsonl REQUEST-JSON
    <target python> flashwork.py fusion OUTDIR REQUEST-JSON
    <target python> flashwork.py hold       (then one line on stdin: the other mode's arguments; deepwork.py's)

``gate``: which compute capability majors the INSTALLED flashinfer builds its allreduce-fusion
(TRT-LLM comm) module for, read from its own code with ast (flashinfer is located, never
imported), and the majors sglang's fused path admits, when sglang is installed. ``attention``:
first the modules those kernels load, built side by side (one ninja per module, all at once) into
the JIT cache the engine uses too, skipping those flashinfer-jit-cache ships prebuilt; then on every
GPU, flashinfer's single decode (CUDA cores and tensor cores), causal single prefill and paged batch
decode on fresh random data, each checked against a float32 reference and timed, the GPU's read
bandwidth (a float32 sum over a tensor of several GiB) and the paged decode again at a batch and KV
length where reading the KV cache dominates (the bandwidth-bound decode).
``fusion``: one process per rank, flashinfer's allreduce + residual + RMSNorm fusion (the call
SGLang 0.5.9 makes) checked against NCCL's all-reduce followed by the same sums in float32, and
timed against the unfused path (NCCL all-reduce, then torch's add and RMSNorm), both captured in
CUDA graphs. The kernels compile on first use (flashinfer's JIT) into
$FLASHINFER_WORKSPACE_BASE/.cache/flashinfer; each record says how long the first call took and
how many modules it compiled, so a cold JIT is told from a warm cache.

Every mode writes JSON lines as it goes, so a run killed in a JIT compile still says where it
was. This script only measures; stackgate reads the figures (stackgate/facts/deepruns.py) and judges
them (stackgate/checks/deep/). It is a sibling of deepwork.py and shares its helpers.
"""

import json
import os
import statistics
import sys
import threading
import time
import traceback
from pathlib import Path

# The gate reads two source files and needs no torch: run as `flashwork.py gate`, the import of torch in deepwork
# (seconds with a CUDA build) is refused before it starts, so reading the gate costs an interpreter's start alone.
if __name__ == "__main__" and sys.argv[1:2] == ["gate"]:
    sys.modules["torch"] = None  # type: ignore[assignment]  # `import torch` then raises ImportError

# Imported as stackgate.edges.flashwork (stackgate's doctests), or run as a file, whose folder
# is then sys.path[0].
try:
    from . import deepwork as work
    from .flashgate import flashinfer_gate, sglang_gate
except ImportError:
    # the same module run as a file; mypy checks it through the lines above
    import deepwork as work  # type: ignore[import-not-found,no-redef]
    from flashgate import flashinfer_gate, sglang_gate  # type: ignore[import-not-found,no-redef]

torch = work.torch
KERNELS = ("decode", "decode_tensor_cores", "prefill", "paged_decode", "bandwidth_decode")
TRACE_CHARS = 4000  #: of a traceback kept in a record: enough for the knowledge base's patterns


def error_record(exc):
    return {"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()[-TRACE_CHARS:]}


def gate_main(path, request):
    work.Lines(path)(event="gate", flashinfer=flashinfer_gate(), sglang=sglang_gate())
    return 0


# --- JIT bookkeeping --------------------------------------------------------------------------


def jit_dir():
    """Where flashinfer's JIT keeps compiled modules (flashinfer/jit/env.py's layout)."""
    return Path(os.environ.get("FLASHINFER_WORKSPACE_BASE") or Path.home()) / ".cache" / "flashinfer"


def compiled_modules():
    """How many compiled modules the JIT cache holds: a first call that adds some compiled them."""
    return sum(1 for _ in jit_dir().rglob("*.so")) if jit_dir().is_dir() else 0


def first_call(op):
    """Run ``op()`` once, synchronised: (its result, seconds, modules it compiled)."""
    before, started = compiled_modules(), time.monotonic()
    result = op()
    torch.cuda.synchronize()
    return result, time.monotonic() - started, compiled_modules() - before


def compare(got, want, rtol):
    """The largest absolute error, and the element worst against ``|a - b| <= atol + rtol * |ref|``
    (the one whose error exceeds ``rtol * |ref|`` most) as [its error, |ref|]: stackgate judges
    that element with the tolerance's atol, so the tolerance is decided in one place."""
    diff = (got.float() - want).abs().flatten()
    scale = want.abs().flatten()
    worst = int(torch.argmax(diff - rtol * scale))
    return {"max_abs_err": float(diff.max()), "worst": [float(diff[worst]), float(scale[worst])]}


# --- the modules, built up front, side by side -------------------------------------------------


def cores():
    """The CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def build_plan(modules, cores, max_jobs):
    """What to build before the first kernel runs: ``modules`` is ``[(name, state)]``, the state
    "prebuilt" (flashinfer-jit-cache ships it), "cached" (the JIT cache holds it) or "missing".
    Every missing module is built at once, each by its own ninja; flashinfer passes ``-j`` from
    MAX_JOBS to ninja (unset: ninja's own default), so each gets MAX_JOBS if that is a count,
    else every core.

    >>> build_plan([("a", "missing"), ("b", "prebuilt"), ("c", "cached"), ("d", "missing")], 16, None)
    {'prebuilt': ['b'], 'cached': ['c'], 'build': ['a', 'd'], 'side_by_side': 2, 'jobs': 16, 'jobs_from': 'cores'}
    >>> build_plan([("a", "missing")], 16, "4")["jobs"], build_plan([("a", "missing")], 16, "x")["jobs_from"]
    (4, 'cores')
    """
    jobs_given = max_jobs is not None and max_jobs.isdigit() and int(max_jobs) > 0
    build = [name for name, state in modules if state == "missing"]
    return {
        "prebuilt": [name for name, state in modules if state == "prebuilt"],
        "cached": [name for name, state in modules if state == "cached"],
        "build": build,
        "side_by_side": len(build),
        "jobs": int(max_jobs) if jobs_given else cores,
        "jobs_from": "MAX_JOBS" if jobs_given else "cores",
    }


def build_side_by_side(specs):
    """``spec.build(False)`` for every spec at once, each in a thread of its own (flashinfer's own
    build: its ninja under its file lock; the threads wait on the ninjas, not on Python):
    {name: error} for those that failed; their kernels' first calls try again and say why."""
    errors = {}

    def build(spec):
        try:
            spec.build(False)
        except Exception as exc:  # the kernel's first call reports it, classified
            errors[spec.name] = f"{type(exc).__name__}: {exc}"[-TRACE_CHARS:]

    threads = [threading.Thread(target=build, args=(spec,), name=f"build {spec.name}") for spec in specs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return errors


def prefill_backend(request, auto):
    """The causal prefill's backend: the request's, or for "auto" what flashinfer would pick (``auto()``).

    >>> [prefill_backend({"prefill_backend": name}, lambda: "fa3") for name in ("fa2", "auto")]
    ['fa2', 'fa3']
    """
    chosen = request.get("prefill_backend", "auto")
    return auto() if chosen == "auto" else chosen


def decode_tensor_cores(shapes):
    """Whether the bandwidth-bound decode runs on tensor cores: as SGLang 0.5.9 decides for a bf16 KV cache
    (flashinfer_backend.should_use_tensor_core: 4 or more query heads per KV head).

    >>> decode_tensor_cores({"q_heads": 64, "kv_heads": 8}), decode_tensor_cores({"q_heads": 8, "kv_heads": 8})
    (True, False)
    """
    return shapes["q_heads"] // shapes["kv_heads"] >= 4


def ninja_times(text):
    r"""{output file's name: seconds} from a ``.ninja_log`` (v5: start ms, end ms, mtime, output, hash per line),
    the last build of each output.

    >>> ninja_times("# ninja log v5\n0\t41000\t1\t/c/m/a.cuda.o\t9f\n2\t1500\t1\t/c/m/m.so\tab\n")
    {'a.cuda.o': 41.0, 'm.so': 1.498}
    """
    times = {}
    for line in text.splitlines():
        fields = line.split("\t")
        if line.startswith("#") or len(fields) < 5 or not (fields[0].isdigit() and fields[1].isdigit()):
            continue
        times[Path(fields[3]).name] = (int(fields[1]) - int(fields[0])) / 1e3
    return times


def slowest_files(specs, count=5):
    """The files that took longest to build, across the modules' own ninja logs: [[module, file, seconds]]."""
    found = []
    for spec in specs:
        log = Path(spec.build_dir) / ".ninja_log"
        text = log.read_text(errors="replace") if log.is_file() else ""
        found += [[spec.name, name, seconds] for name, seconds in ninja_times(text).items()]
    return sorted(found, key=lambda item: -item[2])[:count]


def attention_specs(request):
    """{kernel: flashinfer's JitSpec of the module it loads}, made with the arguments flashinfer
    0.6.4's own calls pass (bf16 throughout, no position encoding, no window, no soft cap): the
    tensor-core single decode loads the fa2 single prefill module, the prefill the one its "auto"
    backend picks (fa3 on sm90a), the paged decodes the batch decode module (int32 indices)."""
    from flashinfer import jit
    from flashinfer.utils import determine_attention_backend

    bf16, i32, d = torch.bfloat16, torch.int32, request["head_dim"]
    backend = prefill_backend(
        request, lambda: determine_attention_backend(torch.device("cuda"), 0, False, False, bf16, bf16)
    )
    paged = jit.gen_batch_decode_module(bf16, bf16, bf16, i32, d, d, 0, False, False)
    return {
        "decode": jit.gen_single_decode_module(bf16, bf16, bf16, d, d, 0, False, False),
        "decode_tensor_cores": jit.gen_single_prefill_module("fa2", bf16, bf16, bf16, d, d, 0, False, False, False),
        "prefill": jit.gen_single_prefill_module(backend, bf16, bf16, bf16, d, d, 0, False, False, False),
        "paged_decode": paged,
        # with tensor cores, the paged decode runs flashinfer's batch prefill (fa2) module
        "bandwidth_decode": (
            jit.gen_batch_prefill_module("fa2", bf16, bf16, bf16, i32, d, d, 0, False, False, False)
            if decode_tensor_cores(request)
            else paged
        ),
    }


def state(spec):
    return "prebuilt" if spec.is_aot else "cached" if spec.is_compiled else "missing"


def prebuild(request, out):
    """Build the modules the kernels load before the first of them runs, side by side (a cold JIT
    cache otherwise builds them one after another, each at its kernel's first call)."""
    out(event="prebuild-start")
    try:
        specs = attention_specs(request)
    except Exception as exc:  # another flashinfer's API: the kernels' first calls build what they need
        out(event="prebuild", **error_record(exc))
        return
    unique = {spec.name: spec for spec in specs.values()}
    plan = build_plan([(name, state(spec)) for name, spec in unique.items()], cores(), os.environ.get("MAX_JOBS"))
    os.environ["MAX_JOBS"] = str(plan["jobs"])  # read by flashinfer's run_ninja, for every ninja it starts
    before, started = compiled_modules(), time.monotonic()
    built = [unique[name] for name in plan["build"]]
    errors = build_side_by_side(built)
    out(
        event="prebuild",
        modules={kernel: spec.name for kernel, spec in specs.items()},
        cores=cores(),
        nvcc_threads=os.environ.get("FLASHINFER_NVCC_THREADS", "1"),
        seconds=time.monotonic() - started,
        compiled=compiled_modules() - before,
        errors=errors,
        slowest=slowest_files(built),
        **plan,
    )


# --- attention --------------------------------------------------------------------------------


def reference_attention(q, k, v, causal):
    """Softmax attention in float32, one KV head's query group at a time (a 2048 x 16k prefill
    is 1 GiB of scores per group, not 8). q [Lq, Hq, D], k and v [Lk, Hk, D] -> [Lq, Hq, D]."""
    lq, hq, d = q.shape
    lk, hk = k.shape[0], k.shape[1]
    group = hq // hk
    out = torch.empty(lq, hq, d, dtype=torch.float32, device=q.device)
    mask = torch.ones(lq, lk, dtype=torch.bool, device=q.device).tril(lk - lq) if causal else None
    for h in range(hk):
        qh = q[:, h * group : (h + 1) * group].float()
        scores = torch.einsum("qgd,kd->gqk", qh, k[:, h].float()) / d**0.5
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        out[:, h * group : (h + 1) * group] = torch.einsum("gqk,kd->qgd", scores.softmax(-1), v[:, h].float())
    return out


def decode(fi, shapes, rtol, tensor_cores):
    q = torch.randn(shapes["q_heads"], shapes["head_dim"], dtype=torch.bfloat16, device="cuda")
    k, v = (
        torch.randn(shapes["kv_len"], shapes["kv_heads"], shapes["head_dim"], dtype=torch.bfloat16, device="cuda")
        for _ in range(2)
    )

    def op(i=0):
        return fi.single_decode_with_kv_cache(q, k, v, use_tensor_cores=tensor_cores)

    got, seconds, compiled = first_call(op)
    record = compare(got, reference_attention(q[None], k, v, False)[0], rtol)
    us = work.timed_ms(torch.device("cuda"), op, shapes["warmup"], shapes["iters"]) * 1e3
    kv_bytes = 2 * k.numel() * k.element_size()
    return {
        **record,
        "first_call_s": seconds,
        "compiled": compiled,
        "us": us,
        "gbs": kv_bytes / us / 1e3,
        "kv_bytes": kv_bytes,
    }


def prefill(fi, shapes, rtol):
    lq, lk = shapes["prefill_len"], shapes["kv_len"]
    q = torch.randn(lq, shapes["q_heads"], shapes["head_dim"], dtype=torch.bfloat16, device="cuda")
    k, v = (
        torch.randn(lk, shapes["kv_heads"], shapes["head_dim"], dtype=torch.bfloat16, device="cuda") for _ in range(2)
    )

    backend = shapes.get("prefill_backend", "auto")

    def op(i=0):
        return fi.single_prefill_with_kv_cache(q, k, v, causal=True, backend=backend)

    got, seconds, compiled = first_call(op)
    record = compare(got, reference_attention(q, k, v, True), rtol)
    us = work.timed_ms(torch.device("cuda"), op, shapes["warmup"], shapes["iters"]) * 1e3
    # Query i (of the last lq of lk tokens) attends to lk - lq + i + 1 keys: the causal count.
    pairs = lq * (lk - lq) + lq * (lq + 1) // 2
    flops = 4 * pairs * shapes["q_heads"] * shapes["head_dim"]
    return {
        **record,
        "first_call_s": seconds,
        "compiled": compiled,
        "us": us,
        "tflops": flops / us / 1e6,
        "backend": backend,
    }


def paged_decode(fi, shapes, rtol, tensor_cores=False):
    batch, page, per = shapes["batch"], shapes["page_size"], shapes["kv_len"]
    hq, hk, d = shapes["q_heads"], shapes["kv_heads"], shapes["head_dim"]
    pages = per // page
    kv = torch.randn(batch * pages, 2, page, hk, d, dtype=torch.bfloat16, device="cuda")
    wrapper = fi.BatchDecodeWithPagedKVCacheWrapper(
        torch.empty(128 << 20, dtype=torch.uint8, device="cuda"), "NHD", use_tensor_cores=tensor_cores
    )
    indptr = torch.arange(0, batch + 1, dtype=torch.int32, device="cuda") * pages
    indices = torch.arange(batch * pages, dtype=torch.int32, device="cuda")
    last = torch.full((batch,), page, dtype=torch.int32, device="cuda")
    q = torch.randn(batch, hq, d, dtype=torch.bfloat16, device="cuda")

    def op(i=0):
        return wrapper.run(q, kv)

    def planned():
        wrapper.plan(indptr, indices, last, hq, hk, d, page, q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16)
        return op()

    def attend(b):  # sequence b's query against its own pages, as [kv_len, Hk, D] keys and values
        keys, values = (kv[b * pages : (b + 1) * pages, j].reshape(per, hk, d) for j in (0, 1))
        return reference_attention(q[b][None], keys, values, False)[0]

    got, seconds, compiled = first_call(planned)
    want = torch.stack([attend(b) for b in range(batch)])
    record = compare(got, want, rtol)
    us = work.timed_ms(torch.device("cuda"), op, shapes["warmup"], shapes["iters"]) * 1e3
    kv_bytes = kv.numel() * kv.element_size()
    return {
        **record,
        "first_call_s": seconds,
        "compiled": compiled,
        "us": us,
        "gbs": kv_bytes / us / 1e3,
        "kv_bytes": kv_bytes,
    }


def read_bandwidth(request):
    """The GPU's read bandwidth: a float32 sum over ``read_bytes`` (several GiB, far beyond L2)."""
    x = torch.ones(request["read_bytes"] // 4, dtype=torch.float32, device="cuda")
    us = work.timed_ms(torch.device("cuda"), lambda i=0: x.sum(), request["warmup"], request["iters"]) * 1e3
    nbytes = x.numel() * x.element_size()
    return {"bytes": nbytes, "us": us, "gbs": nbytes / us / 1e3}


def kernel(fi, kind, request):
    shapes, rtol = request, request["rtol"]
    if kind == "prefill":
        return prefill(fi, shapes, rtol)
    if kind == "paged_decode":
        return paged_decode(fi, shapes, rtol)
    if kind == "bandwidth_decode":
        wide = {**shapes, "batch": shapes["bandwidth_batch"], "kv_len": shapes["bandwidth_kv_len"]}
        cores = decode_tensor_cores(shapes)
        got = paged_decode(fi, wide, rtol, tensor_cores=cores)
        return {**got, "batch": wide["batch"], "kv_len": wide["kv_len"], "tensor_cores": cores}
    return decode(fi, shapes, rtol, tensor_cores=kind == "decode_tensor_cores")


def attention_main(path, request):
    out = work.Lines(path)
    try:
        import flashinfer as fi
    except Exception as exc:  # flashinfer raises RuntimeError too (a cubin of another version)
        out(event="begin", torch=torch.__version__, **error_record(exc))
        return 1
    if not torch.cuda.is_available():
        out(
            event="begin",
            torch=torch.__version__,
            flashinfer=fi.__version__,
            error="torch.cuda.is_available() is False: torch sees no usable GPU",
        )
        return 1
    count = torch.cuda.device_count()
    out(
        event="begin",
        torch=torch.__version__,
        flashinfer=fi.__version__,
        devices=count,
        jit_dir=str(jit_dir()),
        compiled_before=compiled_modules(),
        seed=request["seed"],
    )
    torch.manual_seed(request["seed"])
    prebuild(request, out)
    for index in range(count):
        torch.cuda.set_device(index)  # the tensors ("cuda") and the events go to this device
        name = torch.cuda.get_device_name(index)
        try:
            out(event="read", index=index, name=name, **read_bandwidth(request))
        except Exception as exc:
            out(event="read", index=index, name=name, **error_record(exc))
        torch.cuda.empty_cache()
        for kind in KERNELS:
            out(event="start", index=index, kind=kind)
            try:
                record = kernel(fi, kind, request)
            except Exception as exc:  # one kernel failing is a finding about that kernel; go on
                record = error_record(exc)
            out(event="kernel", index=index, name=name, kind=kind, **record)
            torch.cuda.empty_cache()
    return 0


# --- the allreduce fusion ---------------------------------------------------------------------


def fusion_main(outdir, request):
    import torch.multiprocessing as mp

    out = work.Lines(os.path.join(outdir, "fusion.jsonl"))
    gate = flashinfer_gate()
    if "error" in gate:
        out(event="begin", error=f"flashinfer does not import: {gate['error']}")
        return 1
    if torch.cuda.device_count() < request["world"]:
        out(event="begin", error=f"{request['world']} ranks asked for, torch sees {torch.cuda.device_count()} GPU(s)")
        return 1
    out(
        event="begin",
        torch=torch.__version__,
        flashinfer=gate["version"],
        world=request["world"],
        jit_dir=str(jit_dir()),
        compiled_before=compiled_modules(),
    )
    mp.spawn(fusion_rank, args=(outdir, request), nprocs=request["world"], join=True)
    return 0


def fusion_rank(rank, outdir, request):
    """One rank: the IPC workspace (its first creation JIT-compiles the comm module), then each
    token count; the exit skips interpreter teardown, as the exploration that proved this did."""
    import torch.distributed as dist

    out = work.Lines(os.path.join(outdir, f"fusion{rank}.jsonl"))
    torch.cuda.set_device(rank)
    dist.init_process_group(
        "nccl", init_method="file://" + os.path.join(outdir, "store"), rank=rank, world_size=request["world"]
    )
    out(event="init", rank=rank, pid=os.getpid(), name=torch.cuda.get_device_name(rank))
    try:
        from flashinfer import comm

        before, started = compiled_modules(), time.monotonic()
        ipc, workspace = comm.trtllm_create_ipc_workspace_for_all_reduce_fusion(
            rank, request["world"], max(request["tokens"]), request["hidden"], group=dist.group.WORLD
        )
    except Exception as exc:
        out(event="failed", rank=rank, stage="workspace", **error_record(exc))
        raise  # torch.multiprocessing.spawn then ends the other ranks, which would wait on this one
    out(event="workspace", rank=rank, seconds=time.monotonic() - started, compiled=compiled_modules() - before)
    case = FusionCase(comm, dist, rank, request, workspace)
    for tokens in request["tokens"]:
        out(event="tokens", rank=rank, tokens=tokens, **case.run(tokens))
    dist.barrier()
    try:
        comm.trtllm_destroy_ipc_workspace_for_all_reduce_fusion(ipc, group=dist.group.WORLD)
    except Exception as exc:
        out(event="destroy-failed", rank=rank, error=f"{type(exc).__name__}: {exc}")
    torch.cuda.synchronize()
    out(event="done", rank=rank)
    os._exit(0)


class FusionCase:
    """The fused and the unfused path at one token count, on this rank's share of the data."""

    def __init__(self, comm, dist, rank, request, workspace):
        self.comm, self.dist, self.rank, self.request, self.workspace = comm, dist, rank, request, workspace
        self.hidden, self.eps, self.world = request["hidden"], request["eps"], request["world"]
        seeded = torch.Generator(device="cuda").manual_seed(request["seed"])
        self.gamma = torch.randn(
            self.hidden, dtype=torch.bfloat16, device="cuda", generator=seeded
        )  # the same on every rank
        self.align = work.aligner(dist, torch.device("cuda", rank))
        # A copy queued before each timed replay: while the GPU does it, the host queues the rest.
        self.scratch = (
            torch.empty(256 << 20, dtype=torch.uint8, device="cuda"),
            torch.empty(256 << 20, dtype=torch.uint8, device="cuda"),
        )

    def run(self, tokens):
        seed = self.request["seed"] + tokens
        x = torch.randn(
            tokens,
            self.hidden,
            dtype=torch.bfloat16,
            device="cuda",
            generator=torch.Generator(device="cuda").manual_seed(seed + 1000 * (self.rank + 1)),
        )
        residual = torch.randn(
            tokens,
            self.hidden,
            dtype=torch.bfloat16,
            device="cuda",
            generator=torch.Generator(device="cuda").manual_seed(seed),
        )
        residual_out, norm_out, reduced = torch.empty_like(residual), torch.empty_like(x), torch.empty_like(x)

        def fused(i=0):
            self.comm.trtllm_allreduce_fusion(
                allreduce_in=x,
                world_size=self.world,
                world_rank=self.rank,
                token_num=tokens,
                hidden_dim=self.hidden,
                workspace_ptrs=self.workspace,
                launch_with_pdl=True,
                trigger_completion_at_end=False,
                fp32_acc=False,
                pattern_code=self.comm.AllReduceFusionPattern.kARResidualRMSNorm,
                use_oneshot=None,
                allreduce_out=None,
                residual_in=residual,
                residual_out=residual_out,
                norm_out=norm_out,
                quant_out=None,
                scale_out=None,
                rms_gamma=self.gamma,
                rms_eps=self.eps,
                scale_factor=None,
                layout_code=None,
            )

        def unfused(i=0):
            reduced.copy_(x)
            self.dist.all_reduce(reduced)
            summed = reduced + residual
            return (summed.float() * torch.rsqrt(summed.float().pow(2).mean(-1, keepdim=True) + self.eps)).to(
                torch.bfloat16
            ) * self.gamma

        record = self.check(fused, x, residual, residual_out, norm_out, reduced)
        for name, op in (("fused", fused), ("unfused", unfused)):
            record[name] = self.timings(op)
        return record

    def check(self, fused, x, residual, residual_out, norm_out, reduced):
        """The fused outputs against NCCL's all-reduce of the same inputs, followed by the residual
        add and RMSNorm in float32 (one rounding, the fused kernel's, separates them)."""
        fused()
        reduced.copy_(x)
        self.dist.all_reduce(reduced)
        torch.cuda.synchronize()
        summed = reduced.float() + residual.float()
        normed = summed * torch.rsqrt(summed.pow(2).mean(-1, keepdim=True) + self.eps) * self.gamma.float()
        rtol = self.request["rtol"]
        return {"residual": compare(residual_out, summed, rtol), "norm": compare(norm_out, normed, rtol)}

    def timings(self, op):
        """Eager (launched one by one) and CUDA-graph replays, as deepwork's collective times them."""
        eager_us = work.timed_ms(torch.device("cuda"), op, self.request["warmup"], self.request["iters"]) * 1e3
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            op()  # capture wants the op warmed on a side stream first
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        try:
            replays = work.graph_replays_us(
                op,
                self.request["iters"],
                self.request["replays"],
                self.align,
                lambda: self.scratch[1].copy_(self.scratch[0]),
            )
        except RuntimeError as exc:
            return {"eager_us": eager_us, "graph_error": f"{type(exc).__name__}: {exc}"}
        return {"eager_us": eager_us, "us": statistics.median(replays), "us_min": min(replays), "us_replays": replays}


# --- the command line -------------------------------------------------------------------------

MODES = {"gate": gate_main, "attention": attention_main, "fusion": fusion_main}


def main(argv):
    if argv[1:] == ["hold"]:
        return work.held(argv, main)
    if len(argv) != 4 or argv[1] not in MODES:
        sys.stderr.write(__doc__)
        return 2
    try:
        request = json.loads(argv[3])
    except ValueError as exc:
        sys.stderr.write(f"REQUEST-JSON is not JSON: {exc}\n")
        return 2
    if torch is None and argv[1] != "gate":
        work.Lines(argv[2] if argv[1] != "fusion" else os.path.join(argv[2], "fusion.jsonl"))(
            event="begin", error=f"torch does not import: {work.TORCH_ERROR}"
        )
        return 1
    return MODES[argv[1]](argv[2], request)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
