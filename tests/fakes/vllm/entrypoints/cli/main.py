"""`vllm serve MODEL ...` (the `vllm` console script's entry point): the stand-in server (see standin.py)."""

import sys

from ...standin import main

if __name__ == "__main__":
    main(sys.argv[1:])
