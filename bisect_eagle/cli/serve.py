"""``bisect-eagle serve``: a local SGLang stand-in; its flags are SGLang's and parsed by the server
module itself.

All arguments, ``--help`` included, go to :func:`bisect_eagle.engines.serve.main`, so ``bisect-eagle
serve --help`` prints the same flag list the sglang engine's probe reads from ``python -m
sglang.launch_server --help``.
"""

from __future__ import annotations

import typer

PASS_THROUGH = {"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []}


def serve(ctx: typer.Context) -> None:
    """Serve a target (+ EAGLE-3 draft) over SGLang's HTTP API on 127.0.0.1; flags: bisect-eagle
    serve --help."""
    from bisect_eagle.engines.serve import main

    raise typer.Exit(main(list(ctx.args)))


def register(app: typer.Typer) -> None:
    """Add the ``serve`` command (its arguments passed through, its own ``--help``).

    Args:
        app: the ``bisect-eagle`` application.
    """
    app.command("serve", context_settings=PASS_THROUGH, add_help_option=False)(serve)
