#!/bin/bash
# Issue 36's measurements on a GPU machine, in one command, from the checkout's root:
#     bash benchmarks/h200_deep.sh OUTDIR
# In an empty folder: `stackgate init`, then `stackgate verify --deep` with flashinfer's JIT cache empty (cold: a
# fresh FLASHINFER_WORKSPACE_BASE) and twice warm; deep.flashinfer_attention beside a neighbour that streams
# memory at full speed (a 2 GiB device-to-device copy in a loop), then idle again; then
# the attention check alone, cold, with prefill_backend = "auto"; then benchmarks/decode_bandwidth.py.
# EXPERIMENTS=1 adds a cold build at MAX_JOBS=$ALT_MAX_JOBS (default 2) and the fa3 prefill module built alone.
# Wall times go to OUTDIR/times.txt, the reports and logs into OUTDIR/all.tar.gz, the modules' ninja logs beside.
set -u
OUT=${1:?usage: h200_deep.sh OUTDIR}
TREE=$(pwd)
W=$(mktemp -d /tmp/stackgate-h200.XXXX)
mkdir -p "$W/logs"
export PYTHONPATH=$TREE NO_COLOR=1 PYTHONUNBUFFERED=1
timed() {  # timed NAME COMMAND...: the wall time and exit status of COMMAND, its output in logs/NAME.log
    local name=$1
    shift
    local t0 t1 rc
    t0=$(date +%s.%N)
    "$@" >"$W/logs/$name.log" 2>&1
    rc=$?
    t1=$(date +%s.%N)
    echo "$name: $(python3 -c "print(f'{$t1 - $t0:.1f}')") s, exit $rc: $*" | tee -a "$OUT/times.txt"
}
cd "$W" || exit 1
{ nproc; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.memory --format=csv; python3 -c \
    'import torch, flashinfer; print(torch.__version__, flashinfer.__version__)'; } 2>&1 | tee "$OUT/machine.txt"
timed init python3 -m stackgate init
export FLASHINFER_WORKSPACE_BASE=$W/jit
timed cold python3 -m stackgate verify --deep --json "$W/cold.json"
du -sh "$W/jit" | tee -a "$OUT/times.txt"
timed warm1 python3 -m stackgate verify --deep --json "$W/warm1.json"
timed warm2 python3 -m stackgate verify --deep --json "$W/warm2.json"
python3 -c '
import time, torch
a = torch.empty(2 << 30, dtype=torch.uint8, device="cuda"); b = torch.empty_like(a)
end = time.time() + 150
while time.time() < end:
    for _ in range(50):
        b.copy_(a)
    torch.cuda.synchronize()
' &
NEIGHBOUR=$!
sleep 8
nvidia-smi --query-gpu=utilization.gpu,utilization.memory --format=csv | tee -a "$OUT/times.txt"
timed degraded python3 -m stackgate verify --deep --check deep.flashinfer_attention --json "$W/degraded.json"
kill $NEIGHBOUR
wait $NEIGHBOUR 2>/dev/null
timed idle python3 -m stackgate verify --deep --check deep.flashinfer_attention --json "$W/idle.json"
# The attention check alone, cold, with [deep.attention] prefill_backend = "auto" (fa3 on the H200): the sm90
# single-prefill module the default (fa2) leaves out.
{ cat stackgate.toml; printf '\n[deep.attention]\nprefill_backend = "auto"\n'; } >auto.toml
timed cold-auto env FLASHINFER_WORKSPACE_BASE="$W/jit-auto" python3 -m stackgate verify --lock auto.toml --deep \
    --check deep.flashinfer_attention --json "$W/cold-auto.json"
if [ -n "${EXPERIMENTS:-}" ]; then  # the same cold build with another share of the cores; the fa3 module alone
    timed cold-alt env MAX_JOBS="${ALT_MAX_JOBS:-2}" FLASHINFER_WORKSPACE_BASE="$W/jit-alt" python3 -m stackgate \
        verify --lock auto.toml --deep --check deep.flashinfer_attention --json "$W/cold-alt.json"
    timed prefill-alone env FLASHINFER_WORKSPACE_BASE="$W/jit-alone" python3 -c "
import sys, time
sys.path.insert(0, '$TREE/stackgate/edges')
import flashwork
spec = flashwork.attention_specs({'head_dim': 128, 'q_heads': 64, 'kv_heads': 8, 'prefill_backend': 'auto'})['prefill']
started = time.monotonic(); spec.build(False)
print(spec.name, f'built alone in {time.monotonic() - started:.1f} s', flashwork.slowest_files([spec]))
"
    tail -3 "$W/logs/prefill-alone.log"
fi
timed bandwidth timeout 200 python3 "$TREE/benchmarks/decode_bandwidth.py" --tensor-cores --json "$W/bandwidth.json"
python3 - "$W" <<'PY' | tee "$OUT/summary.txt"
import json, sys
from pathlib import Path
for name in ("cold", "warm1", "warm2", "degraded", "idle", "cold-auto", "cold-alt"):
    path = Path(sys.argv[1]) / f"{name}.json"
    if not path.exists():
        print(name, "no report"); continue
    doc = json.loads(path.read_text())
    print(f"== {name}: phases {doc.get('phases_s')}")
    for r in doc["results"]:
        if r["check"].startswith("deep.") or r["status"] not in ("PASS", "SKIP"):
            print(f"  {r['status']} {r['check']}: {r['summary']}")
            if r["check"] == "deep.flashinfer_attention":
                for line in r.get("details", [])[:16]:
                    print("     ", line)
                pre = r["data"]["jit"].get("prebuild")
                if pre:
                    slowest = [(f, s) for _, f, s in pre.get("slowest") or []]
                    print("      prebuild:", {k: pre.get(k) for k in ("seconds", "jobs", "side_by_side", "errors")}, slowest)
PY
tail -20 "$W/logs/bandwidth.log"
find "$W" -name .ninja_log | tar -czf "$OUT/ninja-logs.tar.gz" -T - 2>/dev/null
tar -czf "$OUT/all.tar.gz" -C "$W" logs stackgate.toml $(cd "$W" && ls ./*.json) 2>/dev/null
