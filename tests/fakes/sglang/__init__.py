"""A stand-in for the `sglang` package, for stackgate's tests only (tests put tests/fakes on PYTHONPATH).

Only ``python -m sglang.launch_server`` exists: see standin.py.
"""

__version__ = "0.5.9"
