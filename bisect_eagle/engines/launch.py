"""Launch and flag helpers shared by the engines that start a server per trial (``sglang``,
``vllm``).

Both build a server's argv as :class:`Arg` s (a flag, its values, the setting it came from), turn
``settings.server_args`` entries and ``engine.<kind>.extra_args`` into flags the same way, write
launch_command.txt the same way (a script to paste: shell-quoted, secrets hidden, the inherited
variables that matter listed) and make the per-trial draft copy the same way (symlinks, a new
config.json, renamed into place). What differs (the flags an engine manages, where the draft's ids
go, which inherited variables matter) stays in each engine's ``launch`` module. Shared so the two
engines cannot drift apart in how they quote, hide or copy.
"""

from __future__ import annotations

import json
import shlex
import shutil
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from bisect_eagle.errors import BadInput
from bisect_eagle.tracking.redact import env_in_clear, is_credential_name, redact_argv

if TYPE_CHECKING:
    from bisect_eagle.engines.plan import TrialPlan
    from bisect_eagle.spec.schema import ServerSpec
    from bisect_eagle.spec.settings import LiveSettings

L = TypeVar("L")


@dataclass(frozen=True)
class Arg:
    """One flag of the launch command, its values and the setting it came from."""

    flag: str
    values: tuple[str, ...]
    origin: str


@dataclass(frozen=True)
class HeadFlags:
    """How a server names the flags every trial's server starts with.

    Args:
        engine: the engine's name (the flags' origins).
        model_flag: the server's model flag (``--model-path``, ``--model``).
        tp_flag: its tensor-parallel size flag (``--tp-size``, ``--tensor-parallel-size``).
    """

    engine: str
    model_flag: str
    tp_flag: str

    def args(
        self,
        settings: LiveSettings,
        *,
        server: ServerSpec,
        target: Path,
        draft_dir: Path | str | None,
        port: int,
    ) -> list[Arg]:
        """The flags every trial's server starts with: its model, tensor-parallel size, host and
        port.

        Args:
            settings: the trial's settings.
            server: the spec's ``engine.<engine>``.
            target: the target model directory (unless ``server.model_path``).
            draft_dir: the draft directory the argv names (None for the baseline).
            port: the port the argv names.

        Returns:
            The four flags.

        Raises:
            BadInput: a speculative trial without a draft directory.
        """
        if not settings.is_baseline and draft_dir is None:
            raise BadInput("a speculative trial needs a draft directory")
        engine = self.engine
        return [
            Arg(
                self.model_flag, (str(server.model_path or target),), f"engine.{engine}.model_path"
            ),
            Arg(self.tp_flag, (str(server.tp),), f"engine.{engine}.tp"),
            Arg("--host", (server.host,), f"engine.{engine}.host"),
            Arg("--port", (str(port),), "engine"),
        ]


def flag_name(key: str) -> str:
    """``server_args`` key → flag: ``max_model_len`` → ``--max-model-len`` (a dotted key keeps its
    dots).

    Args:
        key: a ``server_args`` key (leading dashes and spaces ignored).

    Returns:
        The flag.
    """
    return "--" + key.strip().lstrip("-").replace("_", "-")


def value_arg(flag: str, value: Any, origin: str) -> Arg | None:
    """``flag`` with a setting's ``value``: None for false/null (the server's own default), no value
    for true, JSON for a mapping, one value per item of a list of scalars.

    Args:
        flag: the flag.
        value: the setting's value.
        origin: the setting's name, for errors and for the :class:`Arg`.

    Returns:
        The :class:`Arg`, or None when the flag is left out.

    Raises:
        BadInput: an empty list, or a list holding a list or a mapping.
    """
    if value is None or value is False:
        return None
    if value is True:
        return Arg(flag, (), origin)
    if isinstance(value, dict):
        return Arg(flag, (json.dumps(value, sort_keys=True),), origin)
    if isinstance(value, list):
        if not value or any(isinstance(v, (dict, list)) for v in value):
            raise BadInput(
                f"{origin}: expected a scalar or a non-empty list of scalars, found {value!r}"
            )
        return Arg(flag, tuple(str(v) for v in value), origin)
    return Arg(flag, (str(value),), origin)


def grouped_args(
    tokens: Iterable[str],
    *,
    origin: str,
    is_flag: Callable[[str], bool],
    check: Callable[[str], None] = lambda token: None,
) -> list[Arg]:
    """``extra_args`` tokens grouped into flags with their values (``--a=1`` kept as one token).

    Args:
        tokens: the tokens, verbatim.
        origin: the setting they came from (``engine.<kind>.extra_args``).
        is_flag: whether a token starts a flag.
        check: called on each flag token; raises :class:`BadInput` for one the engine sets itself.

    Returns:
        One :class:`Arg` per flag, in order, with the tokens that follow it as values.

    Raises:
        BadInput: a value before the first flag, or what ``check`` raises.
    """
    args: list[Arg] = []
    for token in tokens:
        if is_flag(token):
            check(token)
            args.append(Arg(token, (), origin))
        elif not args:
            raise BadInput(f"{origin}: expected a flag (--name) first, found {token!r}")
        else:
            args[-1] = Arg(args[-1].flag, (*args[-1].values, token), args[-1].origin)
    return args


def argv_tokens(args: Sequence[Arg]) -> list[str]:
    """The launch's arguments as argv tokens: each flag followed by its values.

    Args:
        args: the arguments, in order.

    Returns:
        The tokens.
    """
    return [token for arg in args for token in (arg.flag, *arg.values)]


def inherited_env(environ: dict[str, str], prefixes: tuple[str, ...]) -> dict[str, str]:
    """Inherited variables starting with one of ``prefixes`` (those that change how a server
    runs), credentials left out.

    Args:
        environ: the environment inherited (usually ``os.environ``).
        prefixes: the name prefixes of the variables that matter to the server.

    Returns:
        Those variables, sorted by name.
    """
    return {
        k: v
        for k, v in sorted(environ.items())
        if k.startswith(prefixes) and not is_credential_name(k)
    }


def export_line(name: str, value: str) -> str:
    """``export NAME=VALUE`` with both shell-quoted: pasted into a shell it sets exactly that
    variable, and no value (spaces, ``$(...)``, quotes, newlines) or name is ever run as a
    command."""
    return f"export {shlex.quote(name)}={shlex.quote(value)}"


def launch_text(
    argv: list[str], env: dict[str, str], *, environ: dict[str, str], prefixes: tuple[str, ...]
) -> str:
    """launch_command.txt, a shell script to paste: the trial's variables and the inherited ones
    that matter as shell-quoted ``export`` lines (only those the secret policy writes in clear; the
    others named in a comment), then the command as one shell-quoted line (values of flags not known
    harmless hidden).

    Args:
        argv: the server's command line.
        env: the variables the trial sets.
        environ: the inherited environment.
        prefixes: the inherited variables' prefixes that matter (:func:`inherited_env`).

    Returns:
        The script's text, ending in a newline.
    """
    inherited = {k: v for k, v in inherited_env(environ, prefixes).items() if k not in env}
    lines = ["# environment set for this trial", *_export_lines(env)]
    lines += ["", "# inherited environment that affects the server", *_export_lines(inherited)]
    lines += ["", "# command", shlex.join(redact_argv(argv))]
    return "\n".join(lines) + "\n"


def _export_lines(env: dict[str, str]) -> list[str]:
    """``export`` lines of the variables written in clear, then one comment naming the others
    (values not shown)."""
    lines = [export_line(k, v) for k, v in sorted(env.items()) if env_in_clear(k)]
    hidden = sorted(k for k in env if not env_in_clear(k))
    if hidden:
        lines.append(f"# also set, values not shown: {', '.join(hidden)}")
    return lines


def check_layer_ids(key: str, layer_ids: list[int]) -> None:
    """:class:`BadInput` unless ``layer_ids`` is a non-empty list of distinct integers (``key``
    names them).

    Args:
        key: the setting the ids came from, for the message.
        layer_ids: the ids to check.

    Raises:
        BadInput: an empty list, a non-integer (a bool included) or a repeated id.
    """
    if not layer_ids or not all(isinstance(i, int) and not isinstance(i, bool) for i in layer_ids):
        raise BadInput(f"{key}: expected a non-empty list of integers, found {layer_ids!r}")
    if len(set(layer_ids)) != len(layer_ids):
        raise BadInput(f"{key}: {layer_ids} repeats an id; each layer is captured once")


def write_draft_copy(draft: Path, config: dict, *, out_dir: Path) -> Path:
    """A copy of the (resolved) ``draft`` directory at ``out_dir``: every file symlinked except
    config.json, which is ``config``. Built beside ``out_dir`` and renamed into place, so it is
    never half-written; :class:`BadInput` when ``out_dir`` exists.

    Args:
        draft: the draft directory.
        config: the copy's config.json.
        out_dir: where the copy goes (must not exist; a stale ``.partial`` beside it is removed).

    Returns:
        ``out_dir``.

    Raises:
        BadInput: ``out_dir`` exists.
    """
    out_dir = Path(out_dir)
    if out_dir.exists():
        raise BadInput(f"{out_dir}: already exists; each trial gets a new draft directory")
    tmp = out_dir.with_name(out_dir.name + ".partial")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    for entry in sorted(draft.iterdir()):
        if entry.name != "config.json":
            (tmp / entry.name).symlink_to(entry.resolve())
    (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    tmp.rename(out_dir)
    return out_dir


def negated_keys(server_args: dict[str, Any], desc: Any) -> list[str]:
    """The ``server_args`` keys set to false whose flag is a ``--x/--no-x`` flag that defaults on in
    ``desc`` (the server's parser, :class:`~bisect_eagle.engines.oracle.Description`, or None): a
    plain omission would keep them on.

    Args:
        server_args: the trial's ``server_args``.
        desc: the server's parser, or None (then no key is returned).

    Returns:
        Those keys, in ``server_args`` order.
    """
    out = []
    for key, value in server_args.items():
        opt = desc.by_flag.get(flag_name(key)) if desc is not None else None
        if value is False and opt is not None and opt.boolean_optional and opt.default is True:
            out.append(key)
    return out


def explicit_server_args(
    server_args: dict[str, Any], desc: Any, *, resolved: bool, resolved_dests: Iterable[str]
) -> dict[str, Any]:
    """``server_args`` without the entries that set the parser's default (per ``desc``; None:
    nothing known) and, when ``resolved``, without those whose resolved value is reported for every
    trial alike (``resolved_dests``).

    Args:
        server_args: the trial's ``server_args``.
        desc: the server's parser, or None.
        resolved: whether the server reports resolved values for ``resolved_dests``.
        resolved_dests: the parser dests whose resolved value is reported.

    Returns:
        The remaining entries, in order (None values always dropped).
    """
    dests = set(resolved_dests)
    out = {}
    for key, value in server_args.items():
        opt = desc.by_flag.get(flag_name(key)) if desc is not None else None
        if resolved and opt is not None and opt.dest in dests:
            continue  # its resolved value is in "server", for every trial alike
        default = opt.default if opt is not None else None
        if value is None or value == default or (value is False and not default):
            continue
        out[key] = value
    return out


def bound_launch(plan: TrialPlan, kind: type[L], *, engine: str) -> L:
    """The launch ``engine``'s planner kept in ``plan`` (``plan.private["launch"]``, a ``kind`` with
    the plan's ``fingerprint``): a trial starts this, never a plan made again.

    Args:
        plan: the plan a trial runs.
        kind: the planner's launch class.
        engine: the engine's name, for the message.

    Returns:
        The plan's launch.

    Raises:
        RuntimeError: the plan has no launch, or its launch belongs to another identity (a plan
            changed after planning, or not made by that planner): a bug, never a trial outcome.
    """
    launch = plan.private.get("launch")
    bound = getattr(launch, "fingerprint", None)
    if not isinstance(launch, kind) or bound != plan.fingerprint:
        have = bound if isinstance(launch, kind) else "no launch"
        raise RuntimeError(
            f"the {plan.engine} plan {plan.fingerprint} carries {have}: a launch is made only from "
            f"the {engine} planner's own plan (a bug)"
        )
    return launch
