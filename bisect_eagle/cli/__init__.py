"""The ``bisect-eagle`` command line: each command lives in its own module and registers itself here.

Commands parse, call and print; the logic lives in the library modules. Bad input (:class:`BadInput`)
prints one line naming the file, the key and what was expected, and exits with code 2.
"""

from __future__ import annotations

import importlib
import sys

import typer

from bisect_eagle.errors import BadInput

app = typer.Typer(
    add_completion=False,
    no_args_is_help=False,
    help="Search and bisect EAGLE-3 speculative-decoding deployments; every trial is logged to MLflow.",
    pretty_exceptions_enable=False,
)



@app.callback()
def root(
    version: bool = typer.Option(False, "--version", help="Print the version and exit.", is_eager=True),
) -> None:
    """Search and bisect EAGLE-3 speculative-decoding deployments; every trial is logged to MLflow."""
    if version:
        from bisect_eagle import __version__

        typer.echo(__version__)
        raise typer.Exit()


COMMAND_MODULES = [
    "run", "worker", "report", "reproduce", "export", "ui", "standalone", "live", "serve", "bisect", "fingerprint",
    "doctor",
]

for _name in COMMAND_MODULES:
    importlib.import_module(f"bisect_eagle.cli.{_name}").register(app)


def main() -> None:
    """Console-script entry point."""
    try:
        app()
    except BadInput as e:
        typer.echo(f"error: {e}", err=True)
        sys.exit(2)
