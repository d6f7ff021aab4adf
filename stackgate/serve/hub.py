"""A Hugging Face Hub id (``--model org/name``) found in the local Hub cache, as SGLang would load it.

SGLang accepts a Hub id wherever it takes a model path: a path that does not exist and has the
form ``org/name`` is downloaded through huggingface_hub, which keeps it in its cache as
``<cache>/models--org--name/snapshots/<commit>/`` with ``refs/main`` naming the commit. The cache
is ``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else ``$XDG_CACHE_HOME/huggingface/hub`` (by default
``~/.cache/huggingface/hub``), read from the server's environment. Smoke launches the snapshot
directory itself, so the server never reaches for the network; an id that is not cached is said
to be so, with whether this host can reach the Hub at all.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from stackgate.edges import httpclient

__all__ = ["HubModel", "cache_dir", "is_hub_id", "offline_reason", "resolve"]

_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")
_TRUE = ("1", "on", "yes", "true")
#: How long smoke tries to reach the Hub before it calls the host offline.
REACH_S = 3.0


def is_hub_id(text: str) -> bool:
    """Whether ``text`` has the form of a Hub model id (and not of a path).

    >>> [is_hub_id(t) for t in ("meta-llama/Llama-3.1-8B", "/models/m", "./m/x", "a/b/c", "m", "org/..", "../m")]
    [True, False, False, False, False, False, False]
    """
    return _HUB_ID.fullmatch(text) is not None


def cache_dir(environ: Mapping[str, str]) -> Path:
    """The Hub cache huggingface_hub would use in this environment.

    >>> str(cache_dir({"HF_HOME": "/data/hf"})), str(cache_dir({"HF_HUB_CACHE": "/c", "HF_HOME": "/h"}))
    ('/data/hf/hub', '/c')
    """
    if environ.get("HF_HUB_CACHE"):
        return Path(environ["HF_HUB_CACHE"]).expanduser()
    if environ.get("HF_HOME"):
        return Path(environ["HF_HOME"]).expanduser() / "hub"
    cache = Path(environ["XDG_CACHE_HOME"]) if environ.get("XDG_CACHE_HOME") else Path.home() / ".cache"
    return cache.expanduser() / "huggingface" / "hub"


@dataclass(frozen=True)
class HubModel:
    """Where a Hub id is in the cache: ``path`` the snapshot directory, or None with ``problem``."""

    hub_id: str
    cache: Path
    path: Path | None
    problem: str = ""


def resolve(hub_id: str, environ: Mapping[str, str]) -> HubModel:
    """The cached snapshot ``refs/main`` names, or why there is none."""
    cache = cache_dir(environ)
    repo = cache / f"models--{hub_id.replace('/', '--')}"
    try:
        commit = (repo / "refs" / "main").read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return HubModel(hub_id, cache, None, f"is not in the Hugging Face cache {cache}")
    except (OSError, UnicodeDecodeError) as exc:
        return HubModel(hub_id, cache, None, f"{repo / 'refs' / 'main'} cannot be read: {exc}")
    if not re.fullmatch(r"[0-9a-f]{40}", commit):
        return HubModel(hub_id, cache, None, f"{repo / 'refs' / 'main'} names no commit ({commit[:60]!r})")
    snapshot = repo / "snapshots" / commit
    if not snapshot.is_dir():
        return HubModel(hub_id, cache, None, f"its cached commit {commit[:12]} has no snapshot in {repo}")
    return HubModel(hub_id, cache, snapshot)


def offline_reason(environ: Mapping[str, str]) -> str | None:
    """Why this host cannot download from the Hub now (None when it can reach it)."""
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        if environ.get(name, "").strip().lower() in _TRUE:
            return f"{name}={environ[name]} is set"
    endpoint = environ.get("HF_ENDPOINT") or "https://huggingface.co"
    problem = httpclient.reachable(endpoint, timeout_s=REACH_S)
    return f"{endpoint} cannot be reached ({problem})" if problem else None
