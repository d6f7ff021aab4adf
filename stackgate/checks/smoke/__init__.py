"""Smoke's parts: launch (engine process), ready (readiness and monitoring), logscan (the log),
serverinfo (what really runs), bench (client and statistics), quality, fastmode, procs.

The command that puts them together is :mod:`stackgate.smoke`.
"""
