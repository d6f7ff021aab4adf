"""Real work for `stackgate verify --deep`, run by the stack's OWN interpreter (stdlib + torch only).

    <target python> deepwork.py gpu OUT.jsonl REQUEST-JSON
    <target python> deepwork.py allreduce OUTDIR REQUEST-JSON
    <target python> deepwork.py hold        (then one line on stdin: the other mode's arguments, a JSON list)

``gpu``: on every GPU in turn, a bf16 and an fp32 matrix product on fresh random data (a sampled
block checked against a float64 product on the CPU) and a device-to-device copy, each timed with
CUDA events after warm-up. ``allreduce``: one process per rank (torch.multiprocessing), an
in-place all-reduce over a sweep of sizes, timed and checked the way nccl-tests' all_reduce_perf
does. Both write JSON lines as they go, so a run killed for a hang still says how far it got.
``hold``: started ahead of its run, so that the interpreter's start and torch's import (seconds
with a CUDA build) overlap the work before it; it touches no GPU until its stdin names the mode to
run, which then runs as if named on the command line. This script only measures; stackgate reads
the figures (stackgate/facts/deepruns.py) and judges them (stackgate/checks/deep/).

REQUEST-JSON names the device ("cuda", or "cpu" for the tests), the sizes and the counts.
Its "faults" (tests only: stackgate passes the deep.* points of $STACKGATE_FAULT, see
stackgate/edges/faults.py; this script reads no environment of its own) plant faults:
"matmul:<device index>" negates that device's product, "wrong:<rank>" adds 1 to one element of
that rank's contribution, "hang:<rank>" makes that rank sleep before its first all-reduce.
"""

import json
import os
import statistics
import sys
import time

try:
    import torch
except ImportError as exc:  # stackgate's own interpreter imports this file only to collect doctests
    torch, TORCH_ERROR = None, exc


def planted(request, kind, index):
    """Whether the request plants a fault of this kind at this device or rank (tests only)."""
    return f"{kind}:{index}" in request.get("faults", ())


class Lines:
    """A JSON-lines file written one flushed line at a time."""

    def __init__(self, path):
        self.file = open(path, "a", buffering=1)  # open for the life of the process: one line per event

    def __call__(self, **record):
        self.file.write(json.dumps(record) + "\n")


def timed_ms(device, op, warmup, iters):
    """Mean milliseconds per call of ``op(i)`` over ``iters`` calls, after ``warmup`` untimed ones.

    On a GPU, two CUDA events on the stream bracket the whole loop: they time the GPU's work
    (Python's launch overhead overlaps it) and need one synchronisation, not one per call. The
    CPU (tests only) uses the wall clock.
    """
    for i in range(warmup):
        op(i)
    if device.type != "cuda":
        started = time.perf_counter()
        for i in range(iters):
            op(i)
        return (time.perf_counter() - started) * 1e3 / iters
    torch.cuda.synchronize(device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for i in range(iters):
        op(i)
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / iters


# --- per-GPU work -----------------------------------------------------------------------------


def gpu_main(path, request):
    out = Lines(path)
    torch.manual_seed(request["seed"])
    # fp32 must mean IEEE fp32: a TF32 product is ~1e-3 off and fails the fp32 tolerance.
    torch.set_float32_matmul_precision("highest")
    if request["device"] == "cuda" and not torch.cuda.is_available():
        out(
            event="begin", torch=torch.__version__, error="torch.cuda.is_available() is False: torch sees no usable GPU"
        )
        return 1
    count = torch.cuda.device_count() if request["device"] == "cuda" else 1
    out(event="begin", torch=torch.__version__, devices=count, seed=request["seed"])
    for index in range(count):
        device = torch.device("cuda", index) if request["device"] == "cuda" else torch.device("cpu")
        out(event="start", index=index)
        started = time.monotonic()
        try:
            record = one_device(device, index, request)
        except Exception as exc:  # one GPU failing is a finding about that GPU; go on to the next
            record = {"index": index, "error": f"{type(exc).__name__}: {exc}"}
        out(event="done", seconds=time.monotonic() - started, **record)
    return 0


def one_device(device, index, request):
    record = {"index": index, "name": "cpu"}
    if device.type == "cuda":
        torch.cuda.set_device(device)  # the events record on this device's current stream
        record["name"] = torch.cuda.get_device_name(device)
    record["bfloat16"] = matmul(device, index, torch.bfloat16, request["bf16_n"], request)
    record["float32"] = matmul(device, index, torch.float32, request["fp32_n"], request)
    record["copy"] = copy(device, request["copy_bytes"], request)
    return record


def matmul(device, index, dtype, n, request):
    """Time ``a @ b`` (n x n) and compare a sampled block of it with float64 on the CPU.

    The reference multiplies the SAME rounded inputs in float64, so the error measured is the
    GPU's (accumulation and output rounding), not the inputs' rounding. Sampling ``sample`` rows
    and columns keeps the CPU part at sample^2 * n multiply-adds, milliseconds even for n = 8192.
    """
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    c = torch.empty(n, n, device=device, dtype=dtype)
    ms = timed_ms(device, lambda i: torch.matmul(a, b, out=c), request["warmup"], request["iters"])
    if planted(request, "matmul", index):
        c.neg_()
    k = min(n, request["sample"])
    rows, cols = torch.randperm(n)[:k].to(device), torch.randperm(n)[:k].to(device)
    got = c[rows][:, cols].double().cpu()
    want = a[rows].double().cpu() @ b[:, cols].double().cpu()
    # The max-norm relative error: one badly wrong element in the block is enough to show.
    error = ((got - want).abs().max() / want.abs().max()).item()
    return {"n": n, "ms": ms, "tflops": 2 * n**3 / (ms * 1e-3) / 1e12, "rel_err": error, "sample": k}


def copy(device, nbytes, request):
    """Time a device-to-device copy of ``nbytes`` random bytes and check it arrived intact.

    GB/s counts bytes read plus bytes written (2 x nbytes a copy), as STREAM's copy does and as
    the 4.3 TB/s H200 reference was measured; 1 GB = 1e9 bytes.
    """
    src = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    ms = timed_ms(device, lambda i: dst.copy_(src), request["warmup"], request["iters"])
    return {"bytes": nbytes, "ms": ms, "gbs": 2 * nbytes / (ms * 1e-3) / 1e9, "equal": bool(torch.equal(dst, src))}


# --- the all-reduce sweep ---------------------------------------------------------------------


def allreduce_main(outdir, request):
    import torch.multiprocessing as mp

    if request["world"] == 1:  # one rank needs no second interpreter (a start and a torch import: seconds)
        rank_main(0, outdir, request)
        return 0
    # One process per rank, as torchrun would start them, without its agent or a TCP port:
    # the ranks meet through a file store in OUTDIR.
    mp.spawn(rank_main, args=(outdir, request), nprocs=request["world"], join=True)
    return 0


def rank_main(rank, outdir, request):
    import torch.distributed as dist

    out = Lines(os.path.join(outdir, f"rank{rank}.jsonl"))
    device = torch.device("cuda", rank) if request["device"] == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    store = "file://" + os.path.join(outdir, "store")
    dist.init_process_group(request["backend"], init_method=store, rank=rank, world_size=request["world"])
    nccl = list(torch.cuda.nccl.version()) if request["backend"] == "nccl" else None
    out(event="init", rank=rank, pid=os.getpid(), device=str(device), nccl=nccl, torch=torch.__version__)
    if planted(request, "hang", rank):
        time.sleep(3600)
    sweep(dist, rank, device, request, out)
    dist.destroy_process_group()


def sweep(dist, rank, device, request, out):
    """nccl-tests' all_reduce_perf loop, in place (torch's all_reduce has no out-of-place form).

    As nccl-tests does: ``warmup`` ops at the largest size, then at the smallest; per size
    ``iters`` timed ops, each on the next slice of one largest-size buffer; then a check on fresh
    data. The buffer is reset to this rank's data once per size and before the eager pass, as
    nccl-tests initialises its buffers once per size, not between timed iterations: summing in
    place multiplies a slice's values by the world size each time it is reduced, so at the
    largest sizes (where every op reuses the one slice) they may grow to infinity over the
    replays: harmless to the timing (GPUs add infinities at full speed), and exactness is judged
    by ``check`` on fresh data. A reset of the whole buffer between the
    timed replays cost ~3 us per 1 MiB all-reduce on 2x H200 (16.5 -> 19.5 us: it leaves the L2
    cache full of the copy's lines), which nccl-tests does not pay. On GPUs the ``iters`` ops
    are captured in a CUDA graph and replayed ``replays`` times (see graph_replays_us); the eager
    figure (ops launched one by one from Python) is taken after, so it cannot disturb the graph's.
    """
    sizes, warmup, iters = request["sizes"], request["warmup"], request["iters"]
    largest = sizes[-1] // 4
    data = contribution(rank, largest, request["seed"], device)
    buffer = data.clone()

    def op(count, i):
        start = (i % (largest // count)) * count
        dist.all_reduce(buffer[start : start + count])

    for size in (sizes[-1], sizes[0]):
        for i in range(warmup):
            op(size // 4, i)
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # "warm" must mean the warm-up finished, not was queued
    out(event="warm")
    align = (
        graph_timing(lambda: aligner(dist, device), out)
        if device.type == "cuda" and request.get("graphs", True)
        else None
    )
    graphs = align is not None
    for size in sizes:
        count = size // 4
        buffer.copy_(data)
        replays = (
            graph_timing(
                lambda count=count: graph_replays_us(lambda i: op(count, i), iters, request["replays"], align), out
            )
            if graphs
            else None
        )
        graphs = graphs and replays is not None
        buffer.copy_(data)
        eager_us = timed_ms(device, lambda i, count=count: op(count, i), 1, iters) * 1e3
        figures = (
            {"us": statistics.median(replays), "us_min": min(replays), "us_replays": replays}
            if replays
            else {"us": eager_us}
        )
        timing = "cuda-graph" if replays else "eager"
        out(
            event="size",
            bytes=size,
            eager_us=eager_us,
            timing=timing,
            wrong=check(dist, rank, count, request, device),
            **figures,
        )


def aligner(dist, device):
    """A captured one-element all-reduce, replayed right before a start event: it returns on every
    rank at about the same time, so no rank's timed window includes waiting for a late peer.

    Its first run is eager, so that NCCL's communicator exists before the capture.
    """
    one = torch.zeros(1, device=device)
    dist.all_reduce(one)
    torch.cuda.synchronize(device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        dist.all_reduce(one)

    def align():
        graph.replay()
        return one  # the graph writes into this tensor: it must live as long as the graph, never freed for reuse

    return align


def graph_timing(capture, out):
    """``capture()`` (a graph's setup or timing), or None (after saying why) when this torch/NCCL
    cannot capture what it captures."""
    try:
        return capture()
    except RuntimeError as exc:
        out(event="graph-timing-unavailable", error=f"{type(exc).__name__}: {exc}")
        return None


def graph_replays_us(op, iters, replays, align, before=None):
    """Microseconds per op of ``iters`` calls ``op(i)`` captured in one CUDA graph, for each of
    ``replays`` timed replays (their median is the figure, as nccl-tests' is a mean of many).

    Eager timing of a small op measures the host: torch's per-call overhead (tens of
    microseconds) exceeds the GPU's work, so the GPU idles between ops. nccl-tests launches from
    C and does not see that; SGLang's decode steps run captured in CUDA graphs and do not see it
    either. A replayed graph launches all ``iters`` ops at once, so the events time the GPUs.

    Before each timed replay ``before()`` (GPU work, if given: a scratch copy that the fused and
    unfused paths both pay) and ``align()`` are queued, with no wait on the host: while the GPU does them
    the host queues the start event and the graph, so the timed window holds no launch gap and no
    wait for a peer rank that started late. (What the timed window must not hold, measured on 2x H200 at
    1 MiB: a reset of the whole buffer queued before each replay, 19.5 us per all-reduce against 16.5 us
    without it.)
    """
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(iters):
            op(i)
    if before is not None:
        before()
    graph.replay()  # the first replay uploads the graph: not timed
    times = []
    for _ in range(replays):
        if before is not None:
            before()
        align()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / iters)
    return times


def check(dist, rank, count, request, device):
    """nccl-tests' #wrong: elements of one all-reduce of fresh data that differ from the exact sum."""
    data = contribution(rank, count, request["seed"] + 1, device)
    if planted(request, "wrong", rank):
        data[count // 2] += 1
    dist.all_reduce(data)
    expected = sum(contribution(r, count, request["seed"] + 1, device) for r in range(request["world"]))
    return int((data != expected).sum().item())


def contribution(rank, count, seed, device):
    """This rank's data: pseudo-random integers in [-8, 8] from (seed, rank, element index).

    Integer arithmetic gives the same values on any device, so each rank can compute every
    other rank's contribution; sums of small integers are exact in float32 in any order, so the
    expected sum is exact, as nccl-tests makes its own data. seed < 2^24 and count <= 2^28 keep
    the product below 2^63.
    """
    h = (torch.arange(count, dtype=torch.int64, device=device) + seed) * 2654435761 + rank * 40503
    h = h ^ (h >> 15)
    return (h % 17 - 8).to(torch.float32)


def held(argv, run):
    """``hold``: wait for the rest of the command line on stdin (a JSON list), then ``run`` it;
    nothing asked (stdin closed) is nothing to do."""
    line = sys.stdin.readline()
    if not line.strip():
        return 0
    try:
        rest = json.loads(line)
    except ValueError as exc:
        sys.stderr.write(f"hold: the arguments are not JSON: {exc}\n")
        return 2
    if not isinstance(rest, list) or not all(isinstance(a, str) for a in rest):
        sys.stderr.write("hold: the arguments are not a JSON list of strings\n")
        return 2
    return run([argv[0], *rest])


def main(argv):
    if argv[1:] == ["hold"]:
        return held(argv, main)
    if len(argv) != 4 or argv[1] not in ("gpu", "allreduce"):
        sys.stderr.write(__doc__)
        return 2
    if torch is None:
        sys.stderr.write(f"torch does not import: {TORCH_ERROR}\n")
        return 1
    request = json.loads(argv[3])
    return (gpu_main if argv[1] == "gpu" else allreduce_main)(argv[2], request)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
