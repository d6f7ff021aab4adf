"""What really runs: the server's own account of its configuration, and the log's proof.

``/server_info`` (``/get_server_info`` in SGLang releases without it) returns every server argument as
resolved, so a backend that SGLang picked by itself, a TP size or a flag value it changed shows
there. It says what was asked, not what ran: a flag such as --enable-flashinfer-allreduce-fusion
is reported true even where its fused path can never run. So for each flag the lock gives an
evidence pattern, the pattern must appear in the log, or the flag fails. Evidence lines are INFO
messages (FlashInfer's "workspace initialized" is ``logger.info``): at ``--log-level warning`` or
above the server never writes them, so their absence proves nothing and smoke says it cannot tell.
"""

from __future__ import annotations

import json
from typing import Any, Mapping, Sequence

from stackgate.edges import httpclient
from stackgate.facts.serverlog import FlagSighting
from stackgate.models.engines import ENGINES, Engine
from stackgate.models.finding import Fix
from stackgate.models.redact import REDACTED
from stackgate.models.result import Result, failed, passed, skipped, warned
from stackgate.models.secretargs import SECRET_OPTIONS, shown

__all__ = [
    "ENDPOINTS",
    "QUIET_LEVELS",
    "ServerInfoError",
    "check_backend",
    "check_evidence",
    "check_flags",
    "check_identity",
    "check_tp",
    "fetch",
    "log_level",
    "parse_flags",
]

ENDPOINTS = ENGINES["sglang"].info_endpoints
#: Python logging levels above INFO: a server logging at one of them writes no INFO line.
QUIET_LEVELS = ("warning", "error", "critical")


class ServerInfoError(Exception):
    """Neither endpoint gave the server's configuration."""


def fetch(
    base_url: str, timeout_s: float = 30.0, *, api_key: str | None = None, engine: Engine | None = None
) -> tuple[dict[str, Any], str]:
    """The server's configuration and the endpoint that gave it (with the server's --api-key, if any).

    An OpenAI model list (vLLM's /v1/models) gives its first model's fields, the list kept under "data".
    """
    problems = []
    for endpoint in (engine or ENGINES["sglang"]).info_endpoints:
        try:
            info = httpclient.get_json(base_url + endpoint, timeout_s=timeout_s, headers=httpclient.bearer(api_key))
        except httpclient.HttpError as exc:
            problems.append(f"{endpoint}: {exc}")
            continue
        if isinstance(info, dict):
            return _first_model(info), endpoint
        problems.append(f"{endpoint}: not a JSON object")
    raise ServerInfoError("; ".join(problems))


def _first_model(info: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI model list as one configuration: the first model's fields beside the list.

    >>> _first_model({"object": "list", "data": [{"id": "m", "root": "/m"}]})["root"]
    '/m'
    """
    models = info.get("data")
    if info.get("object") != "list" or not isinstance(models, list) or not models or not isinstance(models[0], dict):
        return info
    return {**models[0], **info}


def parse_flags(words: Sequence[str]) -> list[tuple[str, Any]]:
    """Launch words as (option, expected value): a bare option means true, several values a list.

    >>> parse_flags(["--enable-x", "--mem-fraction-static", "0.8", "--cuda-graph-bs", "1", "2", "--n=3"])
    [('--enable-x', True), ('--mem-fraction-static', '0.8'), ('--cuda-graph-bs', ['1', '2']), ('--n', '3')]
    """
    parsed: list[tuple[str, Any]] = []
    for word in words:
        if word.startswith("--"):
            option, _, value = word.partition("=")
            parsed.append((option, value if value else True))
        elif parsed:
            option, have = parsed[-1]
            values = [] if have is True else (have if isinstance(have, list) else [have])
            parsed[-1] = (option, word if have is True else [*values, word])
    return parsed


def _same(expected: Any, actual: Any) -> bool:
    """Whether a value given on the command line is the value the server reports."""
    if isinstance(expected, list):
        return (
            isinstance(actual, list)
            and len(actual) == len(expected)
            and all(_same(e, a) for e, a in zip(expected, actual, strict=True))
        )
    if expected is True or isinstance(actual, bool):
        return actual is True if expected is True else str(expected).lower() == str(actual).lower()
    if isinstance(actual, (int, float)):
        try:
            return float(expected) == float(actual)
        except ValueError:
            return False
    if isinstance(actual, (dict, list)) or (isinstance(actual, str) and actual[:1] in "{["):
        return _json(expected) == _json(actual)
    return str(expected) == str(actual)


def _json(value: Any) -> Any:
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except ValueError:
        return value


def check_identity(
    info: Mapping[str, Any], endpoint: str, port: int, model: str, engine: Engine | None = None
) -> Result:
    """The answering server is ours: same port, same model (the fields the engine reports)."""
    engine = engine or ENGINES["sglang"]
    fields = engine.info_fields
    have_port = info.get(fields["port"]) if "port" in fields else None
    have_model = info.get(fields["model"])
    data = {
        "endpoint": endpoint,
        "version": info.get(fields.get("version", "version")),
        "port": have_port,
        "model_path": have_model,
    }
    if have_port not in (None, port) or have_model not in (None, model):
        return failed(
            f"the server on port {port} reports port {have_port} and model {have_model}: another server answered",
            fix=Fix("Stop the other server and run smoke again.", (f"ss -ltnp 'sport = :{port}'",)),
            data=data,
        )
    version = data["version"] or ("?" if "version" in fields else "")
    return passed(
        f"{' '.join(filter(None, (engine.title, str(version))))} reports its configuration ({endpoint})", data=data
    )


def check_backend(info: Mapping[str, Any], want: str) -> Result:
    have = info.get("attention_backend")
    data = {"want": want, "have": have}
    if have != want:
        return failed(
            f"the server runs the {have} attention backend, the lock asks for {want}",
            fix=Fix(
                f"Find why SGLang did not take --attention-backend {want} (the log above; `import flashinfer` in "
                "the stack).",
                ("stackgate verify --check abi.imports",),
            ),
            data=data,
        )
    return passed(f"attention backend {have}", data=data)


def check_tp(info: Mapping[str, Any], want: int) -> Result:
    have = info.get("tp_size")
    if have != want:
        return failed(f"the server runs TP {have}, smoke asked for TP {want}", data={"want": want, "have": have})
    return passed(f"TP {have}", data={"want": want, "have": have})


def check_flags(info: Mapping[str, Any], words: Sequence[str], endpoint: str = "/server_info") -> Result:
    """Each launch flag's value is the one the server reports (a secret's value compared, never shown)."""
    flags = parse_flags(words)
    if not flags:
        return skipped("no extra flags to compare")
    wrong, unknown, good = [], [], []
    for option, expected in flags:
        field = option[2:].replace("-", "_")
        have = info.get(field)
        if option in SECRET_OPTIONS:
            expected, have = _masked(expected, have)
        if field not in info:
            unknown.append(f"{option}: {endpoint} has no field {field!r}")
        elif not _same(expected, have):
            wrong.append(f"{option}: asked {expected!r}, the server runs {field}={have!r}")
        else:
            good.append(f"{option}: {field}={have!r}")
    data = {"flags": shown(words), "mismatches": wrong, "unverified": unknown}
    if wrong:
        return failed(
            f"{len(wrong)} of {len(flags)} flag(s) do not run as asked: {wrong[0]}", wrong + unknown, data=data
        )
    if unknown:
        return warned(f"{len(unknown)} flag(s) cannot be verified from {endpoint}", unknown + good, data=data)
    return passed(f"{len(flags)} flag(s) run as asked", good, data=data)


def _masked(expected: Any, have: Any) -> tuple[str, Any]:
    """A secret pair as a report may show it: compared by value, shown only as whether it matches.

    >>> _masked("k", "k"), _masked("k", "j"), _masked("k", None)
    (('<redacted>', '<redacted>'), ('<redacted>', 'another value'), ('<redacted>', None))
    """
    return REDACTED, (REDACTED if have == expected else "another value" if have else have)


def check_evidence(item: FlagSighting, info: Mapping[str, Any] | None, words: Sequence[str] = ()) -> Result:
    """A flag with an evidence pattern is proven by the log, or it fails with that explanation;
    at a log level that hides INFO lines, an absent line proves nothing: a warning says so."""
    field = item.flag[2:].replace("-", "_")
    accepted = (
        f"{field}={info.get(field)!r} in /server_info" if info is not None and field in info else "accepted at launch"
    )
    data = {"flag": item.flag, "pattern": item.pattern, "line": item.line}
    if item.declined and not item.seen:
        return failed(
            f"{item.flag} was accepted ({accepted}) but the engine declined the fused path: {item.declined_by}; the "
            f"log says {item.declined!r} and never shows {item.pattern!r}",
            fix=Fix(
                "The fused path does not run on this machine (the engine's size tables cover SM90 and SM100 only, and "
                "it needs TP > 1). Drop the flag, or use a stack where the path runs."
            ),
            data={**data, "declined": item.declined, "declined_by": item.declined_by},
        )
    if item.seen:
        return passed(f"{item.flag}: the log shows {item.pattern!r} (line {item.line})", [f"> {item.text}"], data=data)
    level = log_level(info, words)
    if level in QUIET_LEVELS:
        return warned(
            f"{item.flag} was accepted ({accepted}); whether its path ran cannot be told: the server logs at "
            f"--log-level {level}, "
            f"which hides INFO lines such as {item.pattern!r}",
            fix=Fix(
                "Run smoke with the server at --log-level info (the default) to prove the flag, or accept it unproven."
            ),
            data={**data, "log_level": level},
        )
    return failed(
        f"{item.flag} was accepted ({accepted}) but the log never shows {item.pattern!r}: the path it enables never "
        "initialised",
        fix=Fix(
            "The flag is reported but its code path did not run on this machine (e.g. FlashInfer allreduce fusion "
            "only runs on SM90/SM100 and with TP > 1). Drop the flag, or use a stack where the path runs.",
        ),
        data=data,
    )


def log_level(info: Mapping[str, Any] | None, words: Sequence[str]) -> str:
    """The server's log level: what /server_info reports, else the launch flag, else SGLang's "info".

    >>> log_level(None, ["--log-level", "WARNING"]), log_level({"log_level": "error"}, []), log_level(None, [])
    ('warning', 'error', 'info')
    """
    if info is not None and isinstance(info.get("log_level"), str):
        return info["log_level"].lower()
    asked = dict(parse_flags(words)).get("--log-level")
    return asked.lower() if isinstance(asked, str) else "info"
