"""The tree is the architecture: every import (function-level ones included) goes down a layer,
never up or sideways, and no command imports another.

Layers, bottom to top (a package may import its own modules and any lower layer):

0. ``errors``, ``poll``, ``stats``, ``keys``: the base;
1. ``artifacts`` (what a deployment is made of), ``perf`` (the throughput model), ``tracking``
   (MLflow, stores, redaction);
2. ``spec``: what the user asked for;
3. ``engines``: plans and how they run;
4. ``trials`` (one trial and its record), ``doctor``, ``inspect``: features over one plan;
5. ``report``: reading a study's runs;
6. ``search``, ``bisect``: many trials;
7. ``cli``: thin commands over the rest.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from bisect_eagle.keys import IDS_KEY
from bisect_eagle.spec.schema import PATH_KEYS

PACKAGE = Path(__file__).resolve().parents[1] / "bisect_eagle"
LAYERS = [
    {"errors", "poll", "stats", "keys"},
    {"artifacts", "perf", "tracking"},
    {"spec"},
    {"engines"},
    {"trials", "doctor", "inspect"},
    {"report"},
    {"search", "bisect"},
    {"cli"},
]
RANK = {name: i for i, names in enumerate(LAYERS) for name in names}
CLI_SHARED = {"__init__", "__main__", "common", "logs", "study"}


def _modules() -> list[tuple[str, Path]]:
    return [
        (".".join(p.relative_to(PACKAGE.parent).with_suffix("").parts), p)
        for p in sorted(PACKAGE.rglob("*.py"))
    ]


def _imports(path: Path, module: str) -> list[tuple[int, str]]:
    """Every ``bisect_eagle`` module ``path`` imports, with the line: top-level and function-level
    alike."""
    out = []
    package = module.rsplit(".", 1)[0] if path.name != "__init__.py" else module
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.startswith("bisect_eagle")]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            if base == "bisect_eagle":
                out += [(node.lineno, f"bisect_eagle.{a.name}") for a in node.names]
            elif base.startswith("bisect_eagle."):
                out.append((node.lineno, base))
    return out


def _top(module: str) -> str:
    return module.split(".")[1]


def test_every_top_level_module_has_a_layer():
    tops = {_top(m) for m, _ in _modules() if m != "bisect_eagle.__init__"}
    assert tops <= set(RANK), f"put these in a layer of {__name__}: {sorted(tops - set(RANK))}"


def test_imports_go_only_down_the_layers():
    bad = []
    for module, path in _modules():
        if module == "bisect_eagle.__init__":
            continue
        me = _top(module)
        for line, target in _imports(path, module):
            if target in ("bisect_eagle", "bisect_eagle.__version__"):  # the package's own metadata
                continue
            other = _top(target)
            if other == me:
                continue
            if other not in RANK:
                bad.append(f"{path.relative_to(PACKAGE.parent)}:{line}: {target} is in no layer")
            elif RANK[other] >= RANK[me]:
                how = "sideways" if RANK[other] == RANK[me] else "up"
                bad.append(
                    f"{path.relative_to(PACKAGE.parent)}:{line}: imports {target} ({how}: {me} -> "
                    f"{other})"
                )
    assert not bad, "\n".join(bad)


def _module_graph() -> dict[str, set[str]]:
    """Module -> the ``bisect_eagle`` modules it imports (function-level and ``TYPE_CHECKING`` ones
    included): a ``from package import name`` counts as importing the submodule ``name`` when there
    is one, else the package."""
    modules = dict(_modules())
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        package = module.rsplit(".", 1)[0]
        edges = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names if a.name.startswith("bisect_eagle")]
                edges |= {n if n in modules else f"{n}.__init__" for n in names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
                if not base.startswith("bisect_eagle"):
                    continue
                for a in node.names:
                    sub = f"{base}.{a.name}"
                    edges.add(
                        sub if sub in modules else base if base in modules else f"{base}.__init__"
                    )
        graph[module] = {e for e in edges if e in modules and e != module}
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                component = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.append(w)
                    if w == v:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return out


def test_no_import_circle_between_modules():
    """Within a package too, no module imports (even lazily, even for types) one that imports it
    back."""
    circles = _circles(_module_graph())
    assert not circles, "\n".join(" <-> ".join(c) for c in circles)


def test_the_circle_finder_finds_a_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _circles(graph) == [["a", "b", "c"]]
    assert _circles({"a": {"b"}, "b": set()}) == []


def test_no_command_imports_another():
    bad = []
    for module, path in _modules():
        parts = module.split(".")
        if parts[1] != "cli":
            continue
        for line, target in _imports(path, module):
            t = target.split(".")
            if (
                len(t) > 2
                and t[1] == "cli"
                and t[2] not in CLI_SHARED
                and t[2] != parts[-1]
                and parts[-1] not in ("__init__", "__main__")
            ):
                bad.append(
                    f"{path.relative_to(PACKAGE.parent)}:{line}: imports the command {target}"
                )
    assert not bad, "\n".join(bad)


def test_the_delta_debugging_core_loads_no_third_party_package():
    code = (
        "import sys, bisect_eagle.bisect.ddmin; print(sorted({m.split('.')[0] for m in "
        "sys.modules} - set(sys.stdlib_module_names)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    loaded = {m.strip(" '") for m in out.stdout.strip()[1:-1].split(",") if m.strip()}
    loaded = {
        m for m in loaded if m != "bisect_eagle" and not m.startswith("_") and m != "__main__"
    }
    assert not loaded, loaded


ENGINE_KINDS = {"local", "sglang", "vllm"}
# the schema defines the kinds and says what each means
KINDS_HOME = {"bisect_eagle/spec/schema.py"}


def test_no_module_outside_the_engines_compares_an_engine_kind():
    """Engine knowledge lives in ``engines/`` (and the schema's properties of a kind): elsewhere
    nothing branches on ``kind == "sglang"``, on an engine's name, or on the name of the loader
    that reads a draft's ids (its :class:`~bisect_eagle.artifacts.layers.IdReader` says what it
    does)."""
    bad = []
    for _module, path in _modules():
        rel = str(path.relative_to(PACKAGE.parent))
        if rel.startswith("bisect_eagle/engines/") or rel in KINDS_HOME:
            continue
        text = path.read_text()
        for node in ast.walk(ast.parse(text)):
            if not isinstance(node, ast.Compare):
                continue
            sides = [node.left, *node.comparators]
            kinds = [s for s in sides if isinstance(s, ast.Constant) and s.value in ENGINE_KINDS]
            others = [ast.get_source_segment(text, s) or "" for s in sides if s not in kinds]
            if kinds and any("kind" in o or "engine" in o or "reader" in o for o in others):
                bad.append(f"{rel}:{node.lineno}: {ast.get_source_segment(text, node)}")
    assert not bad, "\n".join(bad)


IDS_KEY_HOME = "bisect_eagle/keys.py"
# run by another interpreter, where bisect_eagle cannot be imported: they spell the key themselves
STANDALONE_SCRIPTS = {
    "bisect_eagle/engines/vllm/oracle_script.py",  # inside vLLM's own environment
}
PATH_KEYS_HOME = "bisect_eagle/spec/schema.py"


def _strings(tree: ast.AST) -> list[ast.Constant]:
    """Every string constant of ``tree`` (f-strings' text included), docstrings left out."""
    docs = set()
    for node in ast.walk(tree):
        scopes = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
        if isinstance(node, scopes) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docs.add(id(first.value))
    return [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs
    ]


def _rel(path: Path) -> str:
    return str(path.relative_to(PACKAGE.parent))


def test_the_ids_key_is_spelt_in_one_module():
    """``IDS_KEY`` is written once, in :data:`IDS_KEY_HOME`; every key, message and pattern imports
    it."""
    bad, homes = [], []
    for _module, path in _modules():
        rel = _rel(path)
        for node in _strings(ast.parse(path.read_text())):
            if IDS_KEY in node.value:
                (homes if rel == IDS_KEY_HOME else [] if rel in STANDALONE_SCRIPTS else bad).append(
                    f"{rel}:{node.lineno}"
                )
    assert not bad, "import IDS_KEY from bisect_eagle.keys here:\n" + "\n".join(bad)
    assert len(homes) == 1, homes


def test_the_deployment_path_keys_are_listed_in_one_module():
    """A tuple, list or set naming three or more of ``PATH_KEYS`` is a second copy of it: only its
    home has one."""
    found = []
    for _module, path in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
                names = {e.value for e in node.elts if isinstance(e, ast.Constant)}
                if len(names & set(PATH_KEYS)) >= 3:
                    found.append(f"{_rel(path)}:{node.lineno}")
    assert len(found) == 1 and found[0].startswith(f"{PATH_KEYS_HOME}:"), found
