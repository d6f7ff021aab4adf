"""flashinfer's paged decode against the GPU's read bandwidth, over batch and KV length (needs a GPU).

    <stack python> benchmarks/decode_bandwidth.py [--tensor-cores] [--json PATH]

Runs in the stack's own interpreter (torch, flashinfer), as stackgate/edges/flashwork.py does, with its
helpers: the read bandwidth (a float32 sum over 4 GiB) and a device-to-device copy, then the paged decode
(64 query heads, 8 KV heads of 128, bf16, pages of 16) at batch 8-128 and KV 8k-32k, each as KV GB/s and as
a fraction of the read bandwidth, to choose the bandwidth-bound shape of deep.flashinfer_attention.
"""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "stackgate" / "edges"))

import flashwork  # noqa: E402  (the script deep.flashinfer_attention runs; it imports torch)

torch = flashwork.torch
SHAPES = [(8, 16384), (64, 8192), (64, 16384), (64, 32768), (128, 16384)]


def copied_ms(nbytes: int) -> float:
    a = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    return flashwork.work.timed_ms(torch.device("cuda"), lambda i=0: b.copy_(a), 3, 20)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tensor-cores", action="store_true", help="also the tensor-core paged decode")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args()
    import flashinfer as fi

    request = {"q_heads": 64, "kv_heads": 8, "head_dim": 128, "page_size": 16, "warmup": 3, "iters": 20}
    read = flashwork.read_bandwidth({**request, "read_bytes": 4 << 30})
    copy_ms = copied_ms(2 << 30)
    out = {"gpu": torch.cuda.get_device_name(0), "read": read, "copy_gbs": 2 * (2 << 30) / copy_ms / 1e6, "decode": []}
    print(f"{out['gpu']}: read {read['gbs']:.0f} GB/s, copy (read + write) {out['copy_gbs']:.0f} GB/s", flush=True)
    for batch, kv_len in SHAPES:
        shapes = {**request, "batch": batch, "kv_len": kv_len}
        got = flashwork.paged_decode(fi, shapes, 2.0**-7)
        row = {"batch": batch, "kv_len": kv_len, "tensor_cores": False, **got, "fraction": got["gbs"] / read["gbs"]}
        out["decode"].append(row)
        print(
            f"paged decode {batch:4} x {kv_len:6}: {got['us']:8.1f} us {got['gbs']:7.0f} GB/s = "
            f"{row['fraction']:.3f} of read; max abs error {got['max_abs_err']:.2g}; first call "
            f"{got['first_call_s']:.1f} s",
            flush=True,
        )
        torch.cuda.empty_cache()
    if args.tensor_cores:
        for batch, kv_len in SHAPES:
            got = flashwork.paged_decode(fi, {**request, "batch": batch, "kv_len": kv_len}, 2.0**-7, tensor_cores=True)
            row = {"batch": batch, "kv_len": kv_len, "tensor_cores": True, **got, "fraction": got["gbs"] / read["gbs"]}
            out["decode"].append(row)
            print(
                f"paged decode, tensor cores {batch:4} x {kv_len:6}: {got['us']:8.1f} us {got['gbs']:7.0f} GB/s = "
                f"{row['fraction']:.3f} of read; max abs error {got['max_abs_err']:.2g}",
                flush=True,
            )
            torch.cuda.empty_cache()
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
