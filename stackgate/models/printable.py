"""Untrusted text made safe to show: the one sanitiser for every console path.

A server's log line, a node's reason or hostname, a run document copied in from elsewhere, a
diagnosed log: any of them may carry what a terminal acts on instead of showing it, an escape
sequence (``ESC ] 0 ;`` sets the window title, ``ESC [ 2 J`` clears the screen, ``ESC ] 8 ;``
makes a hyperlink), a carriage return that overwrites the line before it, a backspace. Every C0
control (U+0000-U+001F), DEL (U+007F) and every C1 control (U+0080-U+009F, where ``CSI`` is
U+009B) is shown as ``?``; a line break and a tab stay where the caller allows them (``keep``).
The console (:mod:`stackgate.render.ui`) passes every line through it, and documents that carry a
node's text (the fleet's report) are made printable whole.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

__all__ = ["CONTROLS", "printable"]

#: What a terminal acts on: C0 controls, DEL, C1 controls.
CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f]")


def printable(value: Any, *, keep: str = "") -> Any:
    r"""``value`` (a string, or a document of them at any depth: keys too) with every control
    character but those in ``keep`` shown as ``?``; anything else as it is.

    >>> printable({"reason": "ok\x1b[2Jgone", "n": [1, "a\rb\x9b31m"]})
    {'reason': 'ok?[2Jgone', 'n': [1, 'a?b?31m']}
    >>> printable("two\nlines\tand\x07", keep="\n\t")
    'two\nlines\tand?'
    """
    if isinstance(value, str):
        if not CONTROLS.search(value):
            return value
        return CONTROLS.sub(lambda m: m[0] if m[0] in keep else "?", value)
    if isinstance(value, Mapping):
        return {printable(k, keep=keep): printable(v, keep=keep) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(printable(v, keep=keep) for v in value)
    return value
