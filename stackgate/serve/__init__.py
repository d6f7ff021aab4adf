"""Driving the serving engine: launch (its process group), procs (its process tree), ready
(readiness and monitoring), bench (the benchmark client and its statistics), quality (greedy
outputs that must agree), fastmode (the fast configuration's flags).

The command that puts them together is :mod:`stackgate.commands.smoke`.
"""
