"""The scanning engine: finds the knowledge base's failures in text of any size.

The knowledge base is data (:mod:`stackgate.models.knowledge`: the TOML entries and their model);
this package is the code that reads text for it: :mod:`.keys` (each pattern's prefilter literal,
read off the pattern by :mod:`.literals`), :mod:`.scanner` (whole texts and streams, one pass),
:mod:`.extract` (values an event holds beyond a pattern's groups), :mod:`.events` (never silent:
failures no entry explains) and :mod:`.kernel` (the kernel's GPU lines, in every input). It sits
just above models, below every layer that scans: facts (a server's log), checks (an import's
output), stack, serve, runs and commands.
"""

from __future__ import annotations

from stackgate.models.knowledge import rank
from stackgate.scan.keys import load
from stackgate.scan.scanner import Scanner, make_finding, match_all, match_first

__all__ = ["Scanner", "load", "make_finding", "match_all", "match_first", "rank"]
