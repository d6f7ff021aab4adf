"""Judgement over a running serving engine: serverinfo (what really runs, against the lock's
flags and the log's evidence) and logscan (one result per known failure in the log).

Driving the engine is :mod:`stackgate.serve`; the command that puts both together is
:mod:`stackgate.commands.smoke`.
"""
