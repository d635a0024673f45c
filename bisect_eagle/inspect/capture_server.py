"""A capture-only server for ``bisect-eagle fingerprint``: what the target really captures, asked
the way SGLang allows.

SGLang 0.5.23 returns aux hidden states only from a server started with
``--enable-return-aux-hidden-states``: ``--speculative-algorithm EAGLE3`` then only names the
capture convention, no draft may be served, and the ids come from
``--return-aux-hidden-state-layer-ids`` (≥ 0; SGLang's default layers when absent)
(``docs/sglang-facts.md#returning-aux-hidden-states``). A speculative server cannot return its
captures, so :func:`capture_server` starts a separate one from the spec's sglang engine settings
(launch command, its interpreter, TP size, device/dtype when set), checked by SGLang's own parser
first, in its own supervised process group, and always stops it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from bisect_eagle.engines import engine_class
from bisect_eagle.engines.procs import server as procs
from bisect_eagle.engines.sglang import SglangEngine
from bisect_eagle.engines.sglang.client import SglangClient
from bisect_eagle.engines.sglang.launch import Arg, argv_tokens
from bisect_eagle.engines.sglang.planner import Planner
from bisect_eagle.errors import BadInput
from bisect_eagle.spec.schema import Spec


def capture_args(spec: Spec, *, ids: list[int] | None, port: int) -> list[Arg]:
    """The capture-only server's flags (before adaptation to the installed server)."""
    server = spec.engine.sglang
    if ids is not None and any(i < 0 for i in ids):
        raise BadInput(
            f"--capture-ids {ids}: SGLang's --return-aux-hidden-state-layer-ids must be >= 0 (no "
            "-1)"
        )
    target = server.model_path or str(spec.target)
    args = [
        Arg("--model-path", (target,), "engine.sglang.model_path"),
        Arg("--tp-size", (str(server.tp),), "engine.sglang.tp"),
        Arg("--host", (server.host,), "engine.sglang.host"),
        Arg("--port", (str(port),), "engine"),
        Arg("--speculative-algorithm", ("EAGLE3",), "capture convention"),
        Arg("--enable-return-aux-hidden-states", (), "capture-only server"),
    ]
    if ids is not None:
        args.append(
            Arg("--return-aux-hidden-state-layer-ids", tuple(str(i) for i in ids), "--capture-ids")
        )
    fixed = spec.fixed_settings()
    for key in ("device", "dtype"):
        if key in fixed.model_fields_set:
            args.append(Arg(f"--{key}", (str(getattr(fixed, key)),), f"engine.settings.{key}"))
    return args


@contextmanager
def capture_server(spec: Spec, *, ids: list[int] | None, log_dir: Path) -> Iterator[str]:
    """Start the capture-only server of an sglang ``spec``, yield its URL, stop it (and its group)
    on exit.

    Args:
        spec: an sglang spec (its ``engine.sglang`` server settings, target, draft, and the fixed
            ``device`` and ``dtype`` when set).
        ids: the layer ids to capture (``--return-aux-hidden-state-layer-ids``, SGLang's
            convention); None: the server's default.
        log_dir: where the server's log is written (created when absent).

    Returns:
        A context manager yielding ``http://host:port`` once the server is ready.

    Raises:
        BadInput: a spec whose engine is not sglang or that names no model, flags SGLang refuses,
            or a server that does not become ready.
    """
    if engine_class(spec.engine.kind) is not SglangEngine:
        raise BadInput(
            f"{spec.source}: key 'engine.kind' is {spec.engine.kind!r}; a capture server needs "
            "sglang"
        )
    server = spec.engine.sglang
    if spec.target is None and server.model_path is None:
        raise BadInput(f"{spec.source}: key 'target' is missing (or set engine.sglang.model_path)")
    planner = Planner(server, Path(server.model_path or spec.target), Path(spec.draft or "."))
    try:
        port = procs.free_port(server.host)
        from bisect_eagle.engines.sglang import flags as flagmod

        args, _ = flagmod.adapt_args(
            capture_args(spec, ids=ids, port=port),
            planner.flags(),
            shown_command=flagmod.shown(server.launch_command),
        )
        oracle = planner.oracle()
        verdict = (
            oracle.judge(argv_tokens(args), resolve=False)
            if oracle is not None and oracle.available
            else None
        )
        if verdict is not None and not verdict.ok:
            raise BadInput(f"SGLang refuses the capture-only server: {verdict.error}")
        log_dir.mkdir(parents=True, exist_ok=True)
        proc = procs.start_server(
            [*planner.command, *argv_tokens(args)],
            dict(os.environ),
            log_path=log_dir / "capture-server.log",
        )
        try:
            client = SglangClient(f"http://{server.host}:{port}", server.request_timeout_s)
            state = client.wait_ready(proc.exited, timeout_s=server.ready_timeout_s)
            client.close()
            if state != "ready":
                raise BadInput(
                    f"the capture-only server did not start ({state}); its log: "
                    f"{procs.log_tail(proc.log_path).splitlines()[-1:] or ['(empty)']}"
                )
            yield f"http://{server.host}:{port}"
        finally:
            procs.stop_server(proc, grace_s=server.stop_grace_s)
    finally:
        planner.close()
