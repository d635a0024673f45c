"""The one secret policy: which names and values are secret, and how they are kept out of every byte written.

By name: a name is secret when one of its words (split on ``_``, ``-`` and ``.``) is, or ends with, TOKEN, KEY,
SECRET, PASSWORD, PASSWD, AUTH, CREDENTIAL(S) or COOKIE(S), or is PAT or SESSION: ``HF_TOKEN``,
``OPENAI_API_KEY``, ``--api-key``, ``NCCL_IB_PKEY``, ``HF_AUTH``, ``GH_PAT``; not ``num_draft_tokens``.

By value, whatever the name: the credentials of a URL of any scheme (``postgresql://u:pw@host/db``: the
password, the rest of the URL stays readable) and tokens shaped like the common providers' (:data:`TOKEN_PATTERNS`:
Hugging Face ``hf_…``, GitHub ``ghp_…``/``github_pat_…``, OpenAI-style ``sk-…``, Slack ``xox?-…``, AWS
``AKIA…``, GitLab ``glpat-…``).

Secret values are never logged or printed: mappings show :data:`REDACTED`, free text (server logs, error
messages, argv, tracebacks) has every known secret value and every value-shaped secret replaced. They still
count for a trial's identity through :func:`digest` (a hash, never the value), so two configs that differ only
in a secret are two trials.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import urlsplit

MARKERS = ("TOKEN", "KEY", "SECRET", "PASSWORD", "PASSWD", "AUTH", "CREDENTIAL", "CREDENTIALS", "COOKIE", "COOKIES")
WORDS = ("PAT", "SESSION")  # secret only as a whole word (COMPAT, SESSIONS_MAX are not)
TOKEN_PATTERNS = (
    r"hf_[A-Za-z0-9]{20,}",
    r"gh[pousr]_[A-Za-z0-9]{20,}",
    r"github_pat_[A-Za-z0-9_]{20,}",
    r"sk-[A-Za-z0-9_-]{20,}",
    r"xox[abposr]-[A-Za-z0-9-]{10,}",
    r"AKIA[0-9A-Z]{16}",
    r"glpat-[A-Za-z0-9_-]{20,}",
)
_TOKEN = re.compile(r"(?<![A-Za-z0-9_-])(?:" + "|".join(TOKEN_PATTERNS) + r")")
_URL_CREDENTIALS = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^\s/:@'\"]*:)(?P<pw>[^\s/@'\"]+)(?P<at>@)")
REDACTED = "<redacted>"
_MIN_SCRUB_LEN = 3  # shorter values (``1``, ``0``) would blank unrelated text; they are still never logged by name


def is_secret_name(name: str) -> bool:
    """Whether a variable, flag or key name marks a secret (see the module docstring)."""
    words = re.split(r"[-_.]+", name.strip("-").upper())
    return any(w in MARKERS or w in WORDS or w.endswith(MARKERS) for w in words if w)


def is_secret_value(value: Any) -> bool:
    """Whether a value is a secret by its shape: a provider token, or a URL holding a password."""
    return isinstance(value, str) and (_TOKEN.search(value) is not None or _URL_CREDENTIALS.search(value) is not None)


def _value_in_clear(value: Any) -> Any:
    """A non-secret-named value as it may be shown: a URL's password and provider tokens masked in text."""
    return mask_patterns(value) if isinstance(value, str) else value


def mask_patterns(text: str) -> str:
    """``text`` with value-shaped secrets masked: URL passwords as ``***``, provider tokens as :data:`REDACTED`."""
    text = _URL_CREDENTIALS.sub(lambda m: m["head"] + "***" + m["at"], text)
    return _TOKEN.sub(REDACTED, text)


def digest(value: Any) -> str:
    """A stand-in for a secret value in a trial's identity: ``sha256:`` and 16 hex digits."""
    return "sha256:" + hashlib.sha256(str(value).encode()).hexdigest()[:16]


def redact_mapping(values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` with the values of secret-named keys replaced by :data:`REDACTED` (nested dicts too)."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        if is_secret_name(str(key)) and value is not None:
            out[key] = REDACTED
        elif isinstance(value, Mapping):
            out[key] = redact_mapping(value)
        elif isinstance(value, list):
            out[key] = [_value_in_clear(v) for v in value]
        else:
            out[key] = _value_in_clear(value)
    return out


def digest_mapping(values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` with the values of secret-named keys replaced by their :func:`digest` (nested dicts too)."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        if (is_secret_name(str(key)) and value is not None) or is_secret_value(value):
            out[key] = digest(value)
        elif isinstance(value, Mapping):
            out[key] = digest_mapping(value)
        else:
            out[key] = value
    return out


def redact_argv(argv: Iterable[str]) -> list[str]:
    """argv with the values of secret-named flags (``--api-key X``, ``--hf-token=X``) replaced."""
    out: list[str] = []
    hide_next = False
    for token in argv:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
        elif token.startswith("--") and is_secret_name(token.partition("=")[0]):
            out.append(token.partition("=")[0] + "=" + REDACTED if "=" in token else token)
            hide_next = "=" not in token
        else:
            out.append(mask_patterns(token))
    return out


def secret_values(*sources: Mapping[str, Any] | Iterable[str] | None) -> set[str]:
    """Every secret value in the given mappings (secret-named keys) and argv lists (secret-named flags)."""
    found: set[str] = set()
    for source in sources:
        if source is None:
            continue
        if isinstance(source, Mapping):
            for key, value in source.items():
                if isinstance(value, Mapping):
                    found |= secret_values(value)
                elif is_secret_name(str(key)) and value not in (None, "", True, False):
                    found.add(str(value))
                elif isinstance(value, str):
                    found |= _shaped(value)
        else:
            tokens = list(source)
            for i, token in enumerate(tokens):
                name, eq, inline = token.partition("=")
                if token.startswith("--") and is_secret_name(name):
                    if eq and inline:
                        found.add(inline)
                    elif i + 1 < len(tokens) and not tokens[i + 1].startswith("--"):
                        found.add(tokens[i + 1])
                else:
                    found |= _shaped(token)
    return {v for v in found if len(v) >= _MIN_SCRUB_LEN}


def _shaped(text: str) -> set[str]:
    """The value-shaped secrets inside ``text``: provider tokens and URL passwords."""
    return {m.group(0) for m in _TOKEN.finditer(text)} | {m["pw"] for m in _URL_CREDENTIALS.finditer(text)}


def environment_secrets(environ: Mapping[str, str] | None = None) -> set[str]:
    """Secret values in this process's environment (or ``environ``): they may reach a child's output."""
    return secret_values(dict(os.environ if environ is None else environ))


def scrub(text: str, values: Iterable[str]) -> str:
    """``text`` with every value in ``values`` replaced by :data:`REDACTED` (longest first)."""
    for value in sorted(set(values), key=len, reverse=True):
        if len(value) >= _MIN_SCRUB_LEN:
            text = text.replace(value, REDACTED)
    return mask_patterns(text)


class Scrubber:
    """Scrubs free text of the controller's secret environment values plus any registered ones."""

    def __init__(self, *sources: Mapping[str, Any] | Iterable[str] | None, environ: Mapping[str, str] | None = None):
        self.values = environment_secrets(environ) | secret_values(*sources)

    def add(self, *sources: Mapping[str, Any] | Iterable[str] | None) -> None:
        """Register the secret values of more mappings or argv lists."""
        self.values |= secret_values(*sources)

    def __call__(self, text: str) -> str:
        return scrub(text, self.values)


def redact_url(url: str) -> str:
    """``url`` with any password replaced by ``***`` (database URLs and ``http://user:pw@host`` alike)."""
    try:
        password = urlsplit(url).password
    except ValueError:  # a malformed URL (``http://[::1``): mask by shape
        return mask_patterns(url)
    if password is None:
        return mask_patterns(url)
    return mask_patterns(url.replace(f":{password}@", ":***@", 1))
