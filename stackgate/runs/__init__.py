"""Run history: the kept runs (history), the stack's fingerprint, and what changed between runs
(rundiff)."""
