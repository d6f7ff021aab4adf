"""Secrets out of everything stackgate writes or shows: by name, by shape and by value.

- **By name**: a mapping key that names a secret (``api_key``, ``HF_TOKEN``, ``*_SECRET*``,
  ``password``, ``Authorization`` ...) has its text value hidden, at any depth.
- **By shape**, in any text: the password of a URL's userinfo (``https://user:pw@host``, also a
  bare ``user:pw@host`` in a path) or a userinfo that is a token alone (``https://TOKEN@host``);
  the value after a secret flag in a command line (``--api-key X``, ``--api-key=X``) or in an
  argv list (``["--api-key", "X"]``); ``Authorization: Bearer X``; an assignment to a secret
  name in any notation (``api_key='X'`` inside a ``ServerArgs(...)`` line, ``"api_key": "X"``,
  ``HF_TOKEN=X``); and token formats (``hf_...``, ``sk-...``, ``ghp_...``, ``github_pat_...``, ``AKIA...``,
  ``xoxb-...``, ``sk_live_...``, ``glpat-...``, a JWT ``eyJ...``.``...``.``...``).
- **By value**: every secret found by name or shape anywhere in the document, and the values of
  the secret-named variables of this process's environment, are hidden wherever else they
  appear, in any string at any depth (a key a server echoes in a log line, a password repeated
  in another field).
- **Not a secret**: a value that only names a variable (``--api-key ${SERVE_AUTH}``,
  ``HF_TOKEN=$HF_TOKEN``) says where the secret is, not what it is: it is shown as written.

:func:`redact` returns a redacted copy of a document (dicts, lists, strings, any depth);
:func:`redact_text` one string. Where they are applied: every JSON document and JUnit file
(:mod:`stackgate.edges.files`, so also the kept runs), the gate's document before anything
renders it (console, Markdown, Prometheus), the runs ``stackgate report`` reads back, the results
a console shows, the fingerprint's components, a smoke session's environment, command line and
server info, and a server process's command line. This is the one mechanism: every placeholder
is :data:`REDACTED`.
"""

from __future__ import annotations

import collections.abc
import functools
import os
import re
from typing import Any, Callable, Iterable, Mapping, TypeVar

__all__ = [
    "MIN_SECRET",
    "REDACTED",
    "is_secret_flag",
    "is_secret_name",
    "redact",
    "redact_text",
    "reference_name",
    "secrets_in",
]

#: What stands where a secret was, in every output.
REDACTED = "<redacted>"
#: Shorter values are hidden where found by name or shape, but not hunted for elsewhere: "1" or
#: "none" would blank out half a report.
MIN_SECRET = 6

#: A name with one of these words names a secret wherever the word stands.
_SECRET_WORDS = frozenset(
    {
        "secret",
        "secrets",
        "password",
        "passwd",
        "passphrase",
        "credential",
        "credentials",
        "authorization",
        "cookie",
        "apikey",
    }
)
#: Words that name a secret inside a longer word too (PGPASSWORD, mysqlpasswd).
_SECRET_STEMS = ("password", "passwd", "passphrase")
#: Words that name a secret as the last word of a longer name (api_key, HF_TOKEN, access_token,
#: MYSQL_PWD, DB_PASS, GITHUB_PAT) but not alone: a config field called ``key`` (fast mode's
#: layer-count key) is no secret, nor is ``PWD`` (the working directory).
_QUALIFIED = frozenset({"token", "key", "pwd", "pass", "pat"})
#: Names whose last words name a secret's identifier that is itself kept private (AWS_ACCESS_KEY_ID).
_QUALIFIED_TAILS = (("access", "key", "id"),)
#: Values that say "not set" (or name an auth scheme) rather than hold a secret.
_UNSET = frozenset({"", "none", "null", "true", "false", "bearer", "basic", REDACTED})

T = TypeVar("T")
_REFERENCE = re.compile(r"\$(?:\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)\}|(?P<bare>[A-Za-z_][A-Za-z0-9_]*))")


def reference_name(value: str) -> str | None:
    """The variable a whole value names (``$NAME`` or ``${NAME}``): a reference, not a secret.

    >>> reference_name("${SERVE_AUTH}"), reference_name("$K"), reference_name("sk-$K")
    ('SERVE_AUTH', 'K', None)
    """
    found = _REFERENCE.fullmatch(value)
    return (found["braced"] or found["bare"]) if found else None


def _not_secret(value: str) -> bool:
    """A value that says "not set" (or names an auth scheme) or names a variable: shown as written."""
    return value.lower() in _UNSET or reference_name(value) is not None


def _words(name: str) -> list[str]:
    spaced = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name)
    return [w for w in re.split(r"[^a-z0-9]+", spaced.lower()) if w]


@functools.lru_cache(maxsize=4096)  # the same few hundred keys, in every document
def is_secret_name(name: str) -> bool:
    """Whether a key or variable name names a secret.

    >>> names = ("api_key", "HF_TOKEN", "AWS_SECRET_ACCESS_KEY", "apiKey", "db_password", "Authorization")
    >>> [n for n in names if is_secret_name(n)]
    ['api_key', 'HF_TOKEN', 'AWS_SECRET_ACCESS_KEY', 'apiKey', 'db_password', 'Authorization']
    >>> [n for n in ("PGPASSWORD", "MYSQL_PWD", "DB_PASS", "AWS_ACCESS_KEY_ID", "GITHUB_PAT") if is_secret_name(n)]
    ['PGPASSWORD', 'MYSQL_PWD', 'DB_PASS', 'AWS_ACCESS_KEY_ID', 'GITHUB_PAT']
    >>> plain = ("key", "max_total_num_tokens", "tokenizer_path", "speculative_token_map", "eos_token_id", "PWD")
    >>> [n for n in plain if is_secret_name(n)]
    []
    """
    words = _words(name)
    if _SECRET_WORDS.intersection(words) or any(stem in word for word in words for stem in _SECRET_STEMS):
        return True
    qualified = len(words) > 1 and words[-1] in _QUALIFIED
    return qualified or any(tuple(words[-len(tail) :]) == tail for tail in _QUALIFIED_TAILS)


def is_secret_flag(word: str) -> bool:
    """Whether a command-line option takes a secret (``--api-key``, ``--hf-token``, ``--token``).

    >>> words = ("--api-key", "--token", "--admin-api-key", "--tokenizer-path", "--port", "api-key")
    >>> [w for w in words if is_secret_flag(w)]
    ['--api-key', '--token', '--admin-api-key']
    """
    name = word[2:].partition("=")[0]
    return word.startswith("--") and (is_secret_name(name) or name.lower() in ("token", "key"))


# --- shapes -----------------------------------------------------------------------------------

#: A password may hold a raw ``@`` (clients split the authority at its last one): it runs to the
#: last ``@`` before the host.
_SCHEME_USERINFO = re.compile(
    r"(?P<head>\b[A-Za-z][A-Za-z0-9+.-]*://)(?P<user>[^\s/@'\"<>:]*)(?::(?P<secret>[^\s/'\"<>]*))?@"
)
_BARE_USERINFO = re.compile(
    r"(?P<head>(?:^|(?<=[\s/'\"=(,\[])))(?P<user>[^\s/:@'\"<>]+):(?P<secret>[^\s/'\"<>]+)@(?=[\w\[])"
)
_FLAG = re.compile(
    r"(?P<head>(?P<name>--[A-Za-z][\w-]*)(?:=|[ \t]+))(?!--)(?P<secret>'[^'\n]*'|\"[^\"\n]*\"|[^\s'\"]+)"
)
#: A secret flag and its value as two quoted words of a list (a spec's ``flags = ["--api-key", "X"]``,
#: a JSON argv printed in a log).
_LISTED_FLAG = re.compile(
    r"""(?P<head>(?P<q>["'])(?P<name>--[A-Za-z][\w-]*)(?P=q)[ \t]*,[ \t]*)(?!["']--)(?P<secret>"[^"\n]*"|'[^'\n]*')"""
)
_BEARER = re.compile(r"(?P<head>\b(?:[Bb]earer|BEARER)[ \t]+)(?P<secret>[A-Za-z0-9._~+/=-]+)")
_ASSIGN = re.compile(
    r"(?P<head>(?P<name>(?<![-\w])[A-Za-z_][\w-]*)['\"]?[ \t]*[:=][ \t]*)"
    r"(?P<secret>'[^'\n\"]*'|\"[^\"\n\\]*\"|[^\s'\",;)}\]]+)"
)
_NEXT_NAME = re.compile(r"[A-Za-z_][\w-]*[=:]")
#: Token formats: Hugging Face, OpenAI-style, GitHub (classic and fine-grained), AWS access key
#: ids (long-term AKIA, temporary ASIA), Slack (xoxb-, xoxp-, ...), Stripe secret and restricted
#: keys (sk_live_, rk_test_ ...), GitLab personal access tokens (glpat-), and JSON Web Tokens (three
#: base64url parts, the first a JSON header: ``eyJ``).
_TOKENS = re.compile(
    r"(?P<head>)(?P<secret>\bhf_[A-Za-z0-9]{30,}|\bsk-[A-Za-z0-9_-]{20,}"
    r"|\bgh[pousr]_[A-Za-z0-9]{20,}|\bgithub_pat_[A-Za-z0-9_]{20,}"
    r"|\b(?:AKIA|ASIA)[0-9A-Z]{16}\b|\bxox[abposre]-[A-Za-z0-9-]{10,}"
    r"|\b[rs]k_(?:live|test)_[A-Za-z0-9]{10,}|\bglpat-[A-Za-z0-9_-]{20,}"
    r"|\beyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]{5,})"
)

#: What a text holds when it may hold a token (``gh`` covers ``ghp_`` and ``github_pat_``).
_TOKEN_TELLTALES = ("hf_", "sk-", "gh", "AKIA", "ASIA", "xox", "k_live_", "k_test_", "glpat-", "eyJ")


def _hide(match: re.Match[str], found: set[str], *, numbers: bool = False) -> str:
    """The match with its secret hidden (quotes kept), the secret remembered; a number only with
    ``numbers`` (the value of a secret flag is a secret whatever its shape)."""
    secret = match["secret"]
    quote = secret[:1] if secret[:1] in "'\"" and secret[-1:] == secret[:1] and len(secret) > 1 else ""
    bare = secret[1:-1] if quote else secret
    if _not_secret(bare) or (not numbers and bare.replace(".", "").isdigit()):  # elsewhere a number is a port, a size
        return match[0]
    found.add(bare)
    return f"{match['head']}{quote}{REDACTED}{quote}"


def _userinfo(match: re.Match[str], found: set[str]) -> str:
    """``user:<redacted>@``; a userinfo with no password is a token alone (pip reads it so): hidden."""
    if match["secret"] is None:
        if not match["user"]:
            return match[0]
        found.add(match["user"])
        return f"{match['head']}{REDACTED}@"
    if not match["secret"]:
        return match[0]
    found.add(match["secret"])
    return f"{match['head']}{match['user']}:{REDACTED}@"


def _named(
    pattern: re.Pattern[str], text: str, secret: Callable[[str], bool], found: set[str], *, numbers: bool = False
) -> str:
    """Hide the value of each match whose name is a secret's. A match whose name is not (or whose
    "value" is the next name, as in check_flags' ``--api-key: api_key='X'``) is left, and the
    search goes on right after that name, so that it cannot swallow a secret one
    (``--enable-x --api-key X``)."""
    out, pos = [], 0
    while (match := pattern.search(text, pos)) is not None:
        if secret(match["name"]) and not _NEXT_NAME.match(match["secret"]):
            out += [text[pos : match.start()], _hide(match, found, numbers=numbers)]
            pos = match.end()
        else:
            out.append(text[pos : match.end("name")])
            pos = match.end("name")
    out.append(text[pos:])
    return "".join(out)


def _shapes(text: str, found: set[str]) -> str:
    # Each shape runs only where its telltale characters are: most strings have none of them.
    if "@" in text:
        text = _SCHEME_USERINFO.sub(lambda m: _userinfo(m, found), text)
        text = _BARE_USERINFO.sub(lambda m: _userinfo(m, found), text)
    if "--" in text:
        text = _named(_FLAG, text, is_secret_flag, found, numbers=True)
        text = _named(_LISTED_FLAG, text, is_secret_flag, found, numbers=True)
    if "earer" in text or "EARER" in text:
        text = _BEARER.sub(lambda m: _hide(m, found), text)
    if "=" in text or ":" in text:
        text = _named(_ASSIGN, text, is_secret_name, found)
    if any(telltale in text for telltale in _TOKEN_TELLTALES):
        text = _TOKENS.sub(lambda m: _hide(m, found), text)
    return text


# --- collecting and hiding --------------------------------------------------------------------


def secrets_in(value: Any, environ: Mapping[str, str] | None = None) -> set[str]:
    """Every secret value in a document (by name and shape, at any depth) and in the
    environment (``os.environ`` unless given): what :func:`redact` hides wherever it appears.

    >>> doc = {"cmd": ["sglang", "--api-key", "sk-abc123"], "env": {"HF_TOKEN": "hf_x"}, "url": "https://u:pw0rd!@h"}
    >>> sorted(secrets_in(doc, environ={}))
    ['pw0rd!', 'sk-abc123']
    """
    found: set[str] = set()
    _collect(value, found)
    env = os.environ if environ is None else environ
    found.update(v for k, v in env.items() if is_secret_name(k))
    return {s for s in found if len(s) >= MIN_SECRET and not _not_secret(s) and s not in REDACTED}


def _collect(value: Any, found: set[str]) -> None:
    if isinstance(value, str):
        _shapes(value, found)
    elif isinstance(value, collections.abc.Mapping):
        for key, item in value.items():
            if isinstance(key, str) and is_secret_name(key) and isinstance(item, str):
                found.add(item)
            _collect(key, found)
            _collect(item, found)
    elif isinstance(value, (list, tuple)):
        _collect_argv(value, found)
        for item in value:
            _collect(item, found)


def _collect_argv(words: Iterable[Any], found: set[str]) -> None:
    """``[..., "--api-key", "X", ...]``: the word after a secret flag is a secret."""
    previous: Any = None
    for word in words:
        if _takes_secret(previous, word):
            found.add(word)
        previous = word


def redact(value: T, *, known: Iterable[str] = (), environ: Mapping[str, str] | None = None) -> T:
    """A copy of ``value`` with every secret hidden (see the module's docstring): what it finds in
    itself, what the environment holds, and ``known``.

    >>> doc = {"command": ["sglang", "--api-key", "sk-abc123"], "log": "bad key sk-abc123", "api_key": "sk-abc123"}
    >>> redact({**doc, "n": 3}, environ={})
    {'command': ['sglang', '--api-key', '<redacted>'], 'log': 'bad key <redacted>', 'api_key': '<redacted>', 'n': 3}
    """
    secrets = secrets_in(value, environ) | {s for s in known if len(s) >= MIN_SECRET}
    # Longest first: a secret that contains another is hidden whole.
    return _scrub(value, sorted(secrets, key=len, reverse=True))


def redact_text(text: str, *, known: Iterable[str] = (), environ: Mapping[str, str] | None = None) -> str:
    """One string with its secrets hidden (by shape, by the environment's values and ``known``).

    >>> redact_text("model_path='https://bot:s3cret!@hub/m', api_key='sk-1'", environ={})
    "model_path='https://bot:<redacted>@hub/m', api_key='<redacted>'"
    """
    return redact(text, known=known, environ=environ)


def _scrub(value: Any, secrets: list[str]) -> Any:
    if isinstance(value, str):
        text = _shapes(value, set())
        for secret in secrets:
            if secret in text:
                text = text.replace(secret, REDACTED)
        return text
    if isinstance(value, collections.abc.Mapping):
        return {
            _scrub(k, secrets): (REDACTED if _hidden_by_name(k, v) else _scrub(v, secrets)) for k, v in value.items()
        }
    if isinstance(value, (list, tuple)):
        words = [_scrub(item, secrets) for item in value]
        for i in range(1, len(words)):
            if _takes_secret(words[i - 1], words[i]):
                words[i] = REDACTED
        return type(value)(words) if isinstance(value, tuple) else words
    return value


def _takes_secret(flag: Any, word: Any) -> bool:
    """Whether ``word`` is the value of the secret flag ``flag`` before it in an argv list."""
    return (
        isinstance(flag, str)
        and isinstance(word, str)
        and is_secret_flag(flag)
        and "=" not in flag
        and not word.startswith("--")
        and reference_name(word) is None
    )


def _hidden_by_name(key: Any, value: Any) -> bool:
    return isinstance(key, str) and isinstance(value, str) and is_secret_name(key) and not _not_secret(value)
