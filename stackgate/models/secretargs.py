"""Launch options whose value is a secret: SGLang's --api-key and --admin-api-key.

A server started with ``--api-key KEY`` refuses every request but /health and /metrics without
``Authorization: Bearer KEY`` (sglang 0.5.9, srt/utils/auth.py), so smoke's client must send the
key; and the key must never be shown. In a lock the value may be a reference to a variable of the
server's environment (``"--api-key", "${SGLANG_API_KEY}"``), so that the lockfile holds no secret:
smoke puts the variable's value on the command line it launches, and shows the reference. What a
report shows is hidden by :mod:`stackgate.models.redact`, the one mechanism.
"""

from __future__ import annotations

import shlex
from typing import Mapping, Sequence

from stackgate.models.engines import secret_options
from stackgate.models.redact import REDACTED, redact, reference_name

__all__ = ["SECRET_OPTIONS", "SecretArgError", "api_key", "command_line", "resolve", "shown"]

#: Every registered engine's options whose value is a secret (SGLang: --api-key, --admin-api-key; vLLM: --api-key).
SECRET_OPTIONS = secret_options()


class SecretArgError(Exception):
    """A secret option names a variable that the server's environment does not set."""


def _values(words: Sequence[str]) -> list[tuple[int, str, str]]:
    """(index, option, value) of each secret option's value, in both ``--opt V`` and ``--opt=V`` forms."""
    found = []
    for i, word in enumerate(words):
        option, equals, value = word.partition("=")
        if option not in SECRET_OPTIONS:
            continue
        if equals:
            found.append((i, option, value))
        elif i + 1 < len(words):
            found.append((i + 1, option, words[i + 1]))
    return found


def _replace(words: list[str], index: int, value: str) -> None:
    option, equals, _ = words[index].partition("=")
    words[index] = f"{option}={value}" if equals and option in SECRET_OPTIONS else value


def shown(words: Sequence[str]) -> list[str]:
    """The words as a report may show them (:func:`~stackgate.models.redact.redact`): a secret's
    literal value hidden, a reference kept.

    >>> shown(["--port", "1", "--api-key", "sk-1", "--admin-api-key=${ADMIN}"])
    ['--port', '1', '--api-key', '<redacted>', '--admin-api-key=${ADMIN}']
    """
    return redact(list(words))


def command_line(words: Sequence[str]) -> str:
    """The shown words as one shell line: each word quoted, the placeholder left bare so that a
    reader sees ``--api-key <redacted>`` and not a quoted string that looks like the key.

    >>> command_line(["sglang", "--api-key", REDACTED, "--model-path", "/m m"])
    "sglang --api-key <redacted> --model-path '/m m'"
    """
    return " ".join(word if word == REDACTED else shlex.quote(word) for word in words)


def resolve(words: Sequence[str], environ: Mapping[str, str]) -> list[str]:
    """The words to launch: each secret option's ``$NAME`` reference replaced by the variable's value.

    >>> resolve(["--api-key", "$K", "--x", "$K"], {"K": "sk-2"})
    ['--api-key', 'sk-2', '--x', '$K']
    """
    out = list(words)
    for index, option, value in _values(words):
        name = reference_name(value)
        if name is None:
            continue
        if not environ.get(name):
            raise SecretArgError(f"{option} refers to ${name}, which the server's environment does not set")
        _replace(out, index, environ[name])
    return out


def api_key(words: Sequence[str]) -> str | None:
    """The key the client must send: the (resolved) value of --api-key, if the server gets one.

    >>> api_key(["--api-key=sk-3"]), api_key(["--admin-api-key", "a"])
    ('sk-3', None)
    """
    keys = [value for _, option, value in _values(words) if option == "--api-key"]
    return keys[-1] if keys else None
