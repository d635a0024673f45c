"""One local live trial of ``bisect-eagle run``, traced: it follows the path README.md names, in
its order.

The path is parsed from README.md's sentence "One live trial reads as one path: ..." (every
backticked ``*.py`` file in it, in the order written), so the README and the code cannot drift
apart. The command runs in-process (typer's ``CliRunner``, the shipped tiny scenario,
``--max-live-trials 1``) and ``sys.setprofile`` watches the study's first measured live trial: one
call of ``StudyRun.one_trial`` and everything it calls, on its thread.

Definitions the assertions use:

- a *call* is a ``call`` profile event: a Python function's frame starting. A suspended
  generator's frame resuming (a context manager's exit, the next item of a generator) continues
  the call that started it and is not a new call;
- a call's *file* is its function's file under ``bisect_eagle/``, named relative to it
  (``trials/live.py``); calls of other code are not counted;
- its *caller file* is the file of the nearest enclosing frame that is under ``bisect_eagle/``:
  library frames in between (``contextlib``, ``pydantic``, ``torch``'s ``Module.__call__``,
  ``statistics``) are passed through, so a library calling back into bisect_eagle counts as the
  bisect_eagle code that called the library;
- a file is *entered* by a call whose file differs from its caller file;
- the *path files* are the README's files; the trial's first frames (the command down to
  ``StudyRun.one_trial``) are the path's head, read from the call stack when the trial starts;
  every other file the trial enters is *below* the path: the engine's own code (its ``plan`` and
  ``run``), its computation, leaf helpers and values.
"""

from __future__ import annotations

import re
import sys
from collections import Counter
from pathlib import Path
from types import FrameType

import pytest
from typer.testing import CliRunner

import bisect_eagle
from bisect_eagle.cli import app
from bisect_eagle.search.study import loop

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = str(Path(bisect_eagle.__file__).resolve().parent) + "/"
OPENING, CLOSING = "One live trial reads as one path:", "Nothing on the path calls back up."
SENTENCE = re.compile(re.escape(OPENING) + "(.*?)" + re.escape(CLOSING), re.S)
GENERATOR = 0x20 | 0x80 | 0x200  # CO_GENERATOR | CO_COROUTINE | CO_ASYNC_GENERATOR
ENGINE = "engines/local/engine.py"  # the local engine's file: entered for its plan, then its run
PATH_LIMIT = 12
# measured: 22 files below the path (the engine, its computation, SGLang's rules, the run's owner
# id, helpers)
BELOW_LIMIT = 22


def readme_path() -> list[str]:
    """The path files README.md's path sentence names, in its order."""
    found = SENTENCE.search((ROOT / "README.md").read_text())
    assert found, f"README.md has no sentence '{OPENING} ... {CLOSING}'"
    files = re.findall(r"`([\w/]+\.py)`", found.group(1))
    assert len(files) == len(set(files)), f"README's path names a file twice: {files}"
    return files


def _file(frame: FrameType) -> str | None:
    name = frame.f_code.co_filename
    return name[len(PACKAGE) :] if name.startswith(PACKAGE) else None


def _caller_file(frame: FrameType) -> str | None:
    up = frame.f_back
    while up is not None and _file(up) is None:
        up = up.f_back
    return None if up is None else _file(up)


class Trace:
    """The entries (caller file, file, function) of one traced call, and the path's head when it
    started."""

    def __init__(self) -> None:
        self.entries: list[tuple[str | None, str, str]] = []
        self.head: list[str] = []
        self._started: set[int] = set()
        self._frames: list[FrameType] = []  # generator frames kept alive, so their ids stay theirs

    def profile(self, frame: FrameType, event: str, arg: object) -> None:
        if event != "call" or (file := _file(frame)) is None:
            return
        if frame.f_code.co_flags & GENERATOR:
            if id(frame) in self._started:
                return  # a resumption
            self._started.add(id(frame))
            self._frames.append(frame)
        if (caller := _caller_file(frame)) != file:
            self.entries.append((caller, file, frame.f_code.co_name))

    def read_head(self, frame: FrameType | None) -> None:
        files: list[str] = []
        while frame is not None:
            if (file := _file(frame)) is not None and (not files or files[-1] != file):
                files.append(file)
            frame = frame.f_back
        self.head = files[::-1]


@pytest.fixture(scope="module")
def traced(tmp_path_factory) -> Trace:
    """The study's first measured live trial of ``bisect-eagle run --max-live-trials 1``, traced."""
    trace, done = Trace(), {"measured": False}
    one_trial = loop.StudyRun.one_trial

    def watched(self, space):
        if done["measured"]:
            return one_trial(self, space)
        attempt = Trace()
        attempt.read_head(sys._getframe(1))
        sys.setprofile(attempt.profile)
        try:
            kind, record = one_trial(self, space)
        finally:
            sys.setprofile(None)
        if kind == "measured":
            done["measured"] = True
            trace.__dict__.update(attempt.__dict__)
        return kind, record

    mp = pytest.MonkeyPatch()
    mp.setattr(loop.StudyRun, "one_trial", watched)
    mp.chdir(tmp_path_factory.mktemp("trial-path"))
    try:
        result = CliRunner().invoke(app, ["run", "--max-live-trials", "1", "--json"])
    finally:
        mp.undo()
    assert result.exit_code == 0, result.output
    assert done["measured"], "the study measured no live trial"
    return trace


def test_the_trial_follows_the_readme_path_and_nothing_calls_back_up(traced):
    """(a) No call goes from a path file to one earlier on the path, nor from a file below the
    path into a path file; (b) the path's head (the stack when the trial starts) and then the path
    files the trial enters are the README's path files, all of them, in its order."""
    path = readme_path()
    where = {f: i for i, f in enumerate(path)}
    back = [
        (c, f, n)
        for c, f, n in traced.entries
        if f in where and (c not in where or where[c] > where[f])
    ]
    assert not back, f"calls back up the path (caller file, file, function): {back}"
    first = list(dict.fromkeys(f for _, f, _ in traced.entries if f in where))
    assert traced.head + first == path, (
        f"the trial's path ({traced.head} on the stack, then {first}) is not the README's: {path}"
    )


def test_each_path_file_is_entered_once(traced):
    """(c) Each path file below the head is entered exactly once: a resource opened before the
    engine runs and closed after it (the claim, the run) is one block, whose end resumes the call
    that opened it; the head's files are never entered during the trial; the engine's own file is
    entered twice: for its plan (from ``trials/context.py``), then for its run (from
    ``trials/live.py``)."""
    path = readme_path()
    counts = Counter(f for _, f, _ in traced.entries if f in path)
    expected = {f: 1 for f in path if f not in traced.head}
    assert dict(counts) == expected, [(c, f, n) for c, f, n in traced.entries if f in path]
    engine = [(c, n) for c, f, n in traced.entries if f == ENGINE]
    assert engine == [("trials/context.py", "plan"), ("trials/live.py", "run")]


def test_the_trial_enters_at_most_twelve_path_files_and_a_pinned_number_below(traced):
    """(d) The trial's path is at most :data:`PATH_LIMIT` files (the head's included); the files
    below it that it enters (every other bisect_eagle file: the engine, its computation, leaf
    helpers) are at most :data:`BELOW_LIMIT`, the number measured when the path was last
    restructured."""
    path = readme_path()
    entered = {f for _, f, _ in traced.entries}
    below = sorted(entered - set(path))
    assert len(path) <= PATH_LIMIT
    assert len(below) <= BELOW_LIMIT, below
