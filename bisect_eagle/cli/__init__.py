"""The ``bisect-eagle`` command line: each command lives in its own module and registers itself
here.

Commands parse, call and print; the logic lives in the library modules. Bad input
(:class:`BadInput`) prints one line naming the file, the key and what was expected, and exits with
code 2.
"""

from __future__ import annotations

import importlib
import inspect
import sys
import textwrap

import typer
from typer._click import Context

# typer vendors click: its parent of every command-line fault
from typer._click.exceptions import UsageError
from typer._click.formatting import HelpFormatter, measure_table
from typer.core import TyperCommand, TyperGroup

from bisect_eagle.errors import BadInput


def _whole_words(text: str, width: int) -> str:
    """``text``'s paragraphs wrapped at ``width`` between words only (``--study-name`` stays one
    word), each marked for click's wrapper to keep as it is (a ``\\b`` line before it)."""
    paragraphs = [" ".join(p.split()) for p in text.split("\n\n") if p.strip()]
    return "\n\n".join(
        "\b\n" + textwrap.fill(p, max(width, 10), break_on_hyphens=False, break_long_words=False)
        for p in paragraphs
    )


class _Formatter(HelpFormatter):
    """``--help`` wrapped between words: a flag named in a help text is never split at a hyphen."""

    def write_text(self, text: str) -> None:
        """Write a help text wrapped between words to the formatter's current width.

        Args:
            text: the help text (paragraphs split by blank lines).
        """
        super().write_text(_whole_words(text, self.width - self.current_indent))

    def write_dl(self, rows, col_max: int = 30, col_spacing: int = 2) -> None:
        rows = list(rows)
        first = min(measure_table(rows)[0], col_max) + col_spacing if rows else 0
        width = max(self.width - first - 2 - self.current_indent, 10)
        super().write_dl(
            [(term, _whole_words(help, width) if help else help) for term, help in rows],
            col_max,
            col_spacing,
        )


class _Context(Context):
    formatter_class = _Formatter


class _Command(TyperCommand):
    context_class = _Context


class _Group(TyperGroup):
    context_class = _Context


app = typer.Typer(
    cls=_Group,
    add_completion=False,
    no_args_is_help=False,
    help="Search and bisect EAGLE-3 speculative-decoding deployments; every trial is logged to "
    "MLflow.",
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain help: no "<bool>" placeholders, nothing cut at 80 columns
)


def _print_version(value: bool) -> None:
    """``--version``: print it and exit 0 before the command is looked for (parsed eagerly)."""
    if value:
        from bisect_eagle import __version__

        typer.echo(f"bisect-eagle {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    version: bool = typer.Option(
        False,
        "--version",
        help="Print the version and exit.",
        is_eager=True,
        callback=_print_version,
    ),
) -> None:
    """Search and bisect EAGLE-3 speculative-decoding deployments; every trial is logged to
    MLflow."""


COMMAND_MODULES = [
    "run",
    "worker",
    "report",
    "reproduce",
    "export",
    "ui",
    "standalone",
    "live",
    "serve",
    "bisect",
    "fingerprint",
    "doctor",
]

for _name in COMMAND_MODULES:
    importlib.import_module(f"bisect_eagle.cli.{_name}").register(app)
# the commands list shows each command's summary whole, wrapped at words
for _info in app.registered_commands:
    if not isinstance(_info.cls, type) or _info.cls is TyperCommand:
        _info.cls = _Command
    if _info.short_help is None and _info.callback is not None:
        _info.short_help = " ".join((inspect.getdoc(_info.callback) or "").split("\n\n")[0].split())


def _usage_line(e: UsageError) -> str:
    """A command-line error as one line: the message (it names the flag) and where to read the
    usage."""
    path = e.ctx.command_path if e.ctx is not None else "bisect-eagle"
    message = " ".join(e.format_message().split())
    return f"error: {message} (see `{path} --help`)"


def main() -> None:
    """Console-script entry point: exit 2 with one ``error:`` line on any bad input (flags, files,
    values), a full disk or a read-only store; 1 with one line on any other store failure.

    Every line printed on the way out passes the secret policy
    (:class:`~bisect_eagle.tracking.redact.Scrubber`: the environment's secret values and
    value-shaped secrets), an unexpected error's traceback included. Log records are one line each
    (:class:`~bisect_eagle.cli.logs.OneLineLog`); those about a store's failure are said only when
    the command does not end on that failure.
    """
    from bisect_eagle.cli.logs import end_logging, store_failure, store_failure_line
    from bisect_eagle.tracking.redact import Scrubber

    def end(line: str | None, code: object, *, held: bool = True) -> None:
        kept = end_logging()  # the held lines: said unless the line itself says the store's failure
        for text in [*(kept if held else []), *([line] if line else [])]:
            typer.echo(Scrubber()(text), err=True)
        sys.exit(code)

    try:
        code = app(standalone_mode=False)
    except SystemExit as e:  # SIGTERM (sigterm_as_exit) or a command's own exit
        end(None, e.code)
    except UsageError as e:
        end(_usage_line(e), 2)
    except typer.Abort:
        end("Aborted!", 1)
    except BadInput as e:
        end(f"error: {' '.join(str(e).split())}", 2)
    except Exception as e:
        # a full disk, a read-only store, a store that went away: one line
        if store_failure(e) is not None:
            end(*store_failure_line(e), held=False)
        import traceback  # a bug: its traceback is for the report, never with a secret in it

        end(traceback.format_exc().rstrip(), 1)
    end(None, code if isinstance(code, int) else 0)
