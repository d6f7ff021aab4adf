"""A stand-in for the `vllm` package, for stackgate's tests only (tests put tests/fakes on PYTHONPATH).

Only ``python -m vllm.entrypoints.cli.main serve MODEL ...`` exists: see standin.py.
"""

__version__ = "0.33.0"
