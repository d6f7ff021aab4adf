#!/bin/bash
# Issue 31's faults injected on a GPU machine, in one command, from the checkout's root:
#     bash benchmarks/h200_faults.sh OUTDIR
# In an empty folder: `stackgate init`, then `stackgate verify` of the checks the faults reach under an
# address-space limit (ulimit -v), an open-files limit (ulimit -n), FLASHINFER_WORKSPACE_BASE naming a file
# (verify --deep, the attention check), and last the stack's own libnccl.so.2 truncated (restored after).
# Each run's output goes to OUTDIR/NAME.log; the exit codes and each run's FAIL/ERROR lines to stdout.
set -u
OUT=${1:?usage: h200_faults.sh OUTDIR}
TREE=$(pwd)
W=$(mktemp -d /tmp/stackgate-faults.XXXX)
export PYTHONPATH=$TREE NO_COLOR=1 PYTHONUNBUFFERED=1
cd "$W" || exit 1
run() {  # run NAME COMMAND...: its output in OUTDIR/NAME.log, its exit code and verdict lines here
    local name=$1
    shift
    "$@" >"$OUT/$name.log" 2>&1
    echo "== $name: exit $?"
    grep -E "^ *(FAIL|ERROR) |cause|limit|evidence|damaged" "$OUT/$name.log" | cut -c1-400 | head -12
}
run init python3 -m stackgate init
CHECKS=(--check torch.build --check torch.arch --check abi.imports --check nccl.version)
run ulimit_v bash -c 'ulimit -v 8000000 && exec python3 -m stackgate verify "$@"' - "${CHECKS[@]}"
run ulimit_n bash -c 'ulimit -n 64 && exec python3 -m stackgate verify "$@"' - "${CHECKS[@]}"
touch "$W/workspace-file"
run workspace_file env FLASHINFER_WORKSPACE_BASE="$W/workspace-file" python3 -m stackgate verify --deep \
    --check deep.flashinfer_attention
nccl=$(python3 -c 'import glob, site; print(next(iter(sorted(glob.glob(site.getsitepackages()[0] + "/nvidia/**/libnccl.so.2", recursive=True))), ""))')
if [ -n "$nccl" ] && cp "$nccl" "$W/libnccl.so.2.bak"; then
    truncate -s 1000000 "$nccl"
    run truncated_nccl python3 -m stackgate verify "${CHECKS[@]}" --check abi.elf
    cp "$W/libnccl.so.2.bak" "$nccl"
else
    echo "== truncated_nccl: no libnccl.so.2 under $(python3 -c 'import site; print(site.getsitepackages()[0])')"
fi
