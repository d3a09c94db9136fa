"""What looks like a secret: environment variable and config key names, and their values.
Without torch, so that the launcher's config loading can use it before any process starts."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

_SECRET_PARTS = {"token", "key", "secret", "password", "passwd", "apikey", "credentials"}
_SECRET_SUBSTRINGS = ("secret", "password", "passwd", "apikey", "api_key", "access_key")


def is_secret_name(name: str) -> bool:
    """Whether a config key or environment variable name looks like it holds a secret.

    Matches a name one of whose `_`/`-`/`.` separated words is TOKEN, KEY, SECRET, PASSWORD
    (any case), or that contains SECRET/PASSWORD/APIKEY anywhere. Words, not substrings, for
    TOKEN and KEY so that ordinary settings such as `max_tokens` or `keep_last` stay.
    """
    lowered = name.lower()
    words = set(re.split(r"[_\-.\s]+", lowered))
    return bool(words & _SECRET_PARTS) or any(s in lowered for s in _SECRET_SUBSTRINGS)


def secret_env_values(environ: Mapping[str, str] | None = None) -> list[str]:
    """Values of environment variables whose names look secret (at least 4 characters)."""
    env = os.environ if environ is None else environ
    return [v for k, v in env.items() if is_secret_name(k) and len(v) >= 4]


def scrub_secrets(config: Any, environ: Mapping[str, str] | None = None) -> Any:
    """A copy of `config` without secret-named keys and without values that contain the value
    of a secret-named environment variable (e.g. one interpolated from `${oc.env:...}`)."""
    secrets = secret_env_values(environ)

    def leaks(value: Any) -> bool:
        return isinstance(value, str) and any(s in value for s in secrets)

    def clean(node: Any) -> Any:
        if isinstance(node, Mapping):
            return {
                k: clean(v) for k, v in node.items() if not is_secret_name(str(k)) and not leaks(v)
            }
        if isinstance(node, (list, tuple)):
            return [clean(v) for v in node if not leaks(v)]
        return node

    return clean(config)
