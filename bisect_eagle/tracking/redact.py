"""The one secret policy: which values may be written in clear, and how the others are kept out of
every byte written or printed.

By name, an allowlist: the value of a variable or flag is written in clear only when its name is
known harmless (:mod:`bisect_eagle.tracking.allowlist`: NCCL's documented variables, SGLang's and
vLLM's own variables, the engines' flags) and says nothing of a credential
(:func:`is_credential_name`: ``--api-key``, ``VLLM_API_KEY``). Every other value is hidden as
:func:`hidden` (``<redacted sha256:…>``), a hash that keeps two configs differing only in it apart;
a stored identity (a study's spec) takes :func:`digest`. In settings, ``env.*`` are variables and
``server_args.*`` flags; the settings' own fields are in clear; a list of strings is an argv.

By value, whatever the name: every text written (settings in clear, descriptions, names, paths,
URLs, logs) has the credentials of a URL masked (``https://u:***@host``, ``https://***@host`` for a
token alone) and tokens shaped like the common providers' (:data:`TOKEN_PATTERNS`) replaced by
:data:`REDACTED`, glued ones (``x-hf_…``, ``key_sk-…``) included. A child's free text (server logs,
errors) is also scrubbed of the values hidden by name (:class:`Scrubber`), and of the controller's
own secrets (:func:`environment_secrets`).
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any
from urllib.parse import urlsplit

from bisect_eagle.tracking.allowlist import harmless_env, harmless_flags

MARKERS = (
    "TOKEN",
    "KEY",
    "SECRET",
    "PASSWORD",
    "PASSWD",
    "PASSPHRASE",
    "AUTH",
    "CREDENTIAL",
    "CREDENTIALS",
    "CREDS",
    "COOKIE",
    "COOKIES",
    "BEARER",
)
WORDS = ("PAT", "SESSION")  # a credential only as a whole word (COMPAT, SESSIONS_MAX are not)
TOKEN_PATTERNS = (
    r"hf_[A-Za-z0-9]{20,}",
    r"gh[pousr]_[A-Za-z0-9]{20,}",
    r"github_pat_[A-Za-z0-9_]{20,}",
    r"sk-[A-Za-z0-9_-]{20,}",
    r"xox[abposr]-[A-Za-z0-9-]{10,}",
    r"(?:AKIA|ASIA)[0-9A-Z]{16}",
    r"glpat-[A-Za-z0-9_-]{20,}",
    r"AIza[0-9A-Za-z_-]{35}",
    r"eyJ[A-Za-z0-9_-]{10,}\.eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]+",  # a JSON web token
)
_TOKEN = re.compile(
    r"(?<![A-Za-z0-9])(?:" + "|".join(TOKEN_PATTERNS) + r")"
)  # `_` or `-` before: still a token
_BEARER = re.compile(r"(?i)(?P<head>\bbearer\s+)(?P<pw>[A-Za-z0-9._~+/=-]{8,})")
_URL_USERINFO = re.compile(
    r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://)(?P<user>[^\s/:@'\"]*)(?::(?P<pw>[^\s/@'\"]*))?(?P<at>@)"
)
PREFIXES = (
    "NCCL_",
    "SGLANG_",
    "SGL_",
    "VLLM_",
    "CUDA_",
    "TORCH_",
    "HF_",
)  # what a server reads from its env
REDACTED = "<redacted>"
_MIN_SCRUB_LEN = (
    3  # shorter values (``1``, ``0``) would blank unrelated text; they are still hashed by name
)


def is_credential_name(name: str) -> bool:
    """Whether a name says it holds a credential: a word (split on ``_``, ``-``, ``.``) is, or ends
    with, one of :data:`MARKERS`, or is one of :data:`WORDS` (``HF_TOKEN``, ``--api-key``,
    ``NCCL_IB_PKEY``, ``GH_PAT``).

    Args:
        name: a variable, flag or key name.

    Returns:
        True for a credential's name; such a value is never in clear, even under a known name.
    """
    words = re.split(r"[-_.]+", name.strip("-").upper())
    return any(w in MARKERS or w in WORDS or w.endswith(MARKERS) for w in words if w)


def env_in_clear(name: str) -> bool:
    """Whether the value of variable ``name`` may be written in clear (see the module docstring).

    Args:
        name: the variable's name.

    Returns:
        True for a known harmless variable.
    """
    return name in harmless_env() and not is_credential_name(name)


def flag_in_clear(name: str) -> bool:
    """Whether the value of a flag may be written in clear; ``name`` as a flag (``--max-model-len``)
    or a ``server_args`` key (``max_model_len``).

    Args:
        name: the flag or key.

    Returns:
        True for a known harmless flag.
    """
    flag = "--" + name.strip().lstrip("-").replace("_", "-")
    return flag in harmless_flags() and not is_credential_name(flag)


def digest(value: Any) -> str:
    """A hidden value in an identity: ``sha256:`` and 16 hex digits of its text.

    Args:
        value: the value.

    Returns:
        The digest.
    """
    return "sha256:" + hashlib.sha256(str(value).encode()).hexdigest()[:16]


def hidden(value: Any) -> str:
    """A hidden value as it is written: ``<redacted sha256:…>`` (:func:`digest`).

    Args:
        value: the value.

    Returns:
        The labelled hash.
    """
    return f"<redacted {digest(value)}>"


def is_hidden(value: Any) -> bool:
    """Whether ``value`` is a value this policy hid (:func:`hidden` or :data:`REDACTED`).

    Args:
        value: a value as written.

    Returns:
        True when it stands for a hidden value.
    """
    return isinstance(value, str) and value.startswith(REDACTED[:-1])


def mask_text(text: str) -> str:
    """``text`` with value-shaped secrets masked: URL credentials as ``***``, provider and bearer
    tokens as :data:`REDACTED`.

    Args:
        text: any text.

    Returns:
        The masked text.
    """

    def userinfo(m: re.Match) -> str:
        if m["pw"] is not None:
            return f"{m['head']}{m['user']}:***@"
        return f"{m['head']}***@" if m["user"] else m.group(0)

    text = _URL_USERINFO.sub(userinfo, text)
    text = _BEARER.sub(lambda m: m["head"] + REDACTED, text)
    return _TOKEN.sub(REDACTED, text)


def _shaped(text: str) -> set[str]:
    """The value-shaped secrets inside ``text``: provider and bearer tokens, URL passwords, lone
    tokens."""
    found = {m.group(0) for m in _TOKEN.finditer(text)} | {m["pw"] for m in _BEARER.finditer(text)}
    for m in _URL_USERINFO.finditer(text):
        found.add(m["pw"] if m["pw"] is not None else m["user"])
    return {v for v in found if v}


def is_secret_value(value: Any) -> bool:
    """Whether a value holds a secret by its shape (a provider token, URL credentials).

    Args:
        value: any value.

    Returns:
        True when :func:`mask_text` would change it.
    """
    return isinstance(value, str) and mask_text(value) != value


def _in_clear(value: Any) -> Any:
    """A value written in clear: its texts masked by shape, nested values too."""
    if isinstance(value, str):
        return mask_text(value)
    if isinstance(value, Mapping):
        return {k: _in_clear(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_in_clear(v) for v in value]
    return value


def _named(name: str, value: Any, *, flag: bool, hide: Callable[[Any], str]) -> Any:
    """The value of variable or flag ``name``: in clear when harmless (or None, or a boolean),
    else hidden."""
    harmless = flag_in_clear(name) if flag else env_in_clear(name)
    return _in_clear(value) if harmless or value is None or isinstance(value, bool) else hide(value)


def _settings(values: Mapping[str, Any], hide: Callable[[Any], str]) -> dict[str, Any]:
    """``values`` as settings (module docstring), hidden values as ``hide`` writes them."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        head, dot, name = str(key).partition(".")
        if head in ("env", "server_args") and not dot and isinstance(value, Mapping):
            out[key] = {
                n: _named(str(n), v, flag=head == "server_args", hide=hide)
                for n, v in value.items()
            }
        elif head in ("env", "server_args") and dot:
            out[key] = _named(name, value, flag=head == "server_args", hide=hide)
        elif isinstance(value, Mapping):
            out[key] = _settings(value, hide)
        elif isinstance(value, (list, tuple)) and value and all(isinstance(v, str) for v in value):
            out[key] = _argv(value, hide)
        else:
            out[key] = _in_clear(value)
    return out


def redact_mapping(values: Mapping[str, Any]) -> dict[str, Any]:
    """Settings as they are written: every value not known harmless replaced by :func:`hidden`.

    Args:
        values: settings (nested ``env``/``server_args`` or dotted ``env.X``/``server_args.X``
            keys).

    Returns:
        The settings safe to write.
    """
    return _settings(values, hidden)


def digest_mapping(values: Mapping[str, Any]) -> dict[str, Any]:
    """Settings as an identity takes them: as :func:`redact_mapping`, hidden values as
    :func:`digest`.

    Args:
        values: settings, as :func:`redact_mapping` takes them.

    Returns:
        The settings, distinct for distinct values, with nothing secret in clear.
    """
    return _settings(values, digest)


def redact_env(env: Mapping[str, Any]) -> dict[str, Any]:
    """Variables as they are written: each value in clear only under a harmless name, else
    :func:`hidden`.

    Args:
        env: variable name -> value.

    Returns:
        The variables safe to write.
    """
    return {k: _named(str(k), v, flag=False, hide=hidden) for k, v in env.items()}


def _argv(argv: Iterable[str], hide: Callable[[Any], str]) -> list[str]:
    """argv with the value of every flag not known harmless hidden; other tokens masked by shape."""
    out: list[str] = []
    hide_next = False
    for token in argv:
        name, eq, inline = token.partition("=")
        if hide_next and not token.startswith("--"):
            out.append(hide(token))
        elif token.startswith("--") and eq and not flag_in_clear(name):
            out.append(f"{name}={hide(inline)}")
        else:
            out.append(mask_text(token))
        hide_next = token.startswith("--") and not eq and not flag_in_clear(token)
    return out


def redact_argv(argv: Iterable[str]) -> list[str]:
    """argv as it is written: the value of a flag not known harmless (``--api-key X``, ``--x=Y``)
    hidden.

    Args:
        argv: the command's tokens.

    Returns:
        The tokens safe to write.
    """
    return _argv(argv, hidden)


def secret_values(*settings: Mapping[str, Any] | None, argv: Iterable[str] = ()) -> set[str]:
    """Every value the policy hides in ``settings`` and ``argv``, and every value-shaped secret in
    them.

    Args:
        settings: settings, as :func:`redact_mapping` takes them.
        argv: a command's tokens.

    Returns:
        The values (at least 3 characters) to scrub from free text.
    """
    found: set[str] = set()

    def keep(value: Any) -> str:
        found.update(str(v) for v in (value if isinstance(value, list) else [value]))
        return ""

    for values in settings:
        if values is not None:
            _settings(values, keep)
            found |= _shaped_inside(values)
    tokens = list(argv)
    _argv(tokens, keep)
    found |= _shaped_inside(tokens)
    return {v for v in found if len(v) >= _MIN_SCRUB_LEN}


def _shaped_inside(raw: Any) -> set[str]:
    """The value-shaped secrets of every text inside ``raw`` (a text, mapping or list)."""
    if isinstance(raw, str):
        return _shaped(raw)
    items = (
        raw.values() if isinstance(raw, Mapping) else raw if isinstance(raw, (list, tuple)) else ()
    )
    return {v for item in items for v in _shaped_inside(item)}


def environment_secrets(environ: Mapping[str, str] | None = None) -> set[str]:
    """The secrets of this process's environment (or ``environ``), which may reach a child's output:
    values of credential names, of variables a server reads (:data:`PREFIXES`) that are not known
    harmless, value-shaped ones.

    Args:
        environ: the environment (default ``os.environ``).

    Returns:
        The values (at least 3 characters) to scrub from free text.
    """
    found: set[str] = set()
    for name, value in (os.environ if environ is None else environ).items():
        if is_credential_name(name) or (name.startswith(PREFIXES) and not env_in_clear(name)):
            found.add(value)
        found |= _shaped(value)
    return {v for v in found if len(v) >= _MIN_SCRUB_LEN}


def scrub(text: str, values: Iterable[str]) -> str:
    """``text`` with every value in ``values`` replaced by :data:`REDACTED` (longest first), then
    masked by shape.

    Args:
        text: free text.
        values: the secret values.

    Returns:
        The scrubbed text.
    """
    for value in sorted(set(values), key=len, reverse=True):
        if len(value) >= _MIN_SCRUB_LEN:
            text = text.replace(value, REDACTED)
    return mask_text(text)


class Scrubber:
    """Scrubs free text of the controller's environment secrets and of the values hidden in given
    settings."""

    def __init__(
        self,
        *settings: Mapping[str, Any] | None,
        argv: Iterable[str] = (),
        environ: Mapping[str, str] | None = None,
    ):
        self.values = environment_secrets(environ) | secret_values(*settings, argv=argv)

    def add(self, *settings: Mapping[str, Any] | None, argv: Iterable[str] = ()) -> None:
        """Register the hidden values of more settings or an argv.

        Args:
            settings: settings, as :func:`secret_values` takes them (None: nothing).
            argv: a command's tokens.
        """
        self.values |= secret_values(*settings, argv=argv)

    def __call__(self, text: str) -> str:
        return scrub(text, self.values)


def redact_url(url: str) -> str:
    """``url`` with any password replaced by ``***`` (database URLs and ``http://user:pw@host``
    alike).

    Args:
        url: a URL.

    Returns:
        The URL safe to print.
    """
    try:
        password = urlsplit(url).password
    except ValueError:  # a malformed URL (``http://[::1``): mask by shape
        return mask_text(url)
    if password is None:
        return mask_text(url)
    return mask_text(url.replace(f":{password}@", ":***@", 1))
