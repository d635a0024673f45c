"""Run in SGLang's interpreter: what every model class of ``sglang.srt.models`` that implements
EAGLE-3 capture makes of a grid of id lists, by SGLang's own ``set_eagle3_layers_to_capture``, at
each target depth asked.

The classes are discovered by importing every module of the package and taking each ``EntryClass``
(the classes SGLang serves) that has the hook, inherited or its own. Each is probed exactly as the
sglang oracle probes a target (``bisect_eagle/engines/sglang/oracle_script.py`` :func:`capture`: a
weightless stand-in, the decoder model's forward read for final-state capture). The arguments are
target depths N; SGLang's models are imported once for all of them (the import is most of the time).
Prints one JSON object, one entry per depth::

    {"N": {"classes": {architecture: probe answer}, "import_errors": {module: error},
           "hook_modules": [module, ...]}, ...}

``hook_modules`` are the modules whose source defines the hook (a textual scan), so a test can tell
a class that was never probed from one that does not exist.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import pkgutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bisect_eagle" / "engines" / "sglang"))
import oracle_script  # noqa: E402  (SGLang's interpreter has no bisect_eagle: import the script by path)


def grid(n: int) -> list:
    return [
        None,
        [1, n // 2 - 1, n - 4],
        [2, n // 2, n - 3],
        [3, n // 2 + 1, n - 2],
        [-1, 2, n // 2],
        [0, 5, 9],
        [2, n // 2, n - 2],
        [2, n // 2, n - 1],
        [2, n // 2, n],
        [1, n // 2, n - 1],
        [5, 1, 9],
    ]


def main() -> None:
    depths = [int(a) for a in sys.argv[1:]]
    import sglang.srt.models as models

    root = Path(models.__path__[0])
    hook_modules = sorted(
        p.stem for p in root.glob("*.py") if "def set_eagle3_layers_to_capture" in p.read_text()
    )
    hooked: list = []
    errors: dict = {}
    for info in pkgutil.iter_modules(models.__path__):
        name = f"sglang.srt.models.{info.name}"
        try:
            with (
                contextlib.redirect_stdout(io.StringIO()),
                contextlib.redirect_stderr(io.StringIO()),
            ):
                module = importlib.import_module(name)
        except BaseException as e:  # noqa: BLE001  (a module that cannot import on a CPU is reported, not fatal)
            errors[info.name] = f"{type(e).__name__}: {e}"
            continue
        entry = getattr(module, "EntryClass", [])
        for cls in entry if isinstance(entry, (list, tuple)) else [entry]:
            if isinstance(cls, type) and hasattr(cls, "set_eagle3_layers_to_capture"):
                hooked.append((info.name, cls))
    out: dict = {}
    for n in depths:
        classes: dict = {}
        config = {"num_hidden_layers": n, "text_config": {"num_hidden_layers": n}}
        for module_name, cls in hooked:
            try:
                with (
                    contextlib.redirect_stdout(io.StringIO()),
                    contextlib.redirect_stderr(io.StringIO()),
                ):
                    classes[cls.__name__] = oracle_script.capture(cls.__name__, config, grid(n))
            except Exception as e:
                classes[cls.__name__] = {
                    "probe_error": f"{type(e).__name__}: {e}",
                    "module": module_name,
                }
        out[str(n)] = {"classes": classes, "import_errors": errors, "hook_modules": hook_modules}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
