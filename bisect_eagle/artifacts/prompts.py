"""Benchmark prompts from a JSONL file, rendered with the target's chat template when it has one.

One JSON object per line: ``{"id": "q1", "prompt": "text"}`` or ``{"id": "q1", "messages": [{"role":
"user", "content": "text"}, ...]}``; ``id`` is optional (default: the line number); blank lines are
skipped. A plain ``prompt`` becomes a one-message user chat when the tokenizer has a chat template.
``messages`` need a chat template: without one there is no right way to join them, so the line is
refused.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from bisect_eagle.errors import BadInput


@dataclass(frozen=True)
class Prompt:
    """A prompt as the engines send it: ``text`` is the rendered string, ``input_ids`` its
    tokens."""

    id: str
    text: str
    input_ids: list[int]


def _messages(obj: dict, where: str) -> list[dict]:
    msgs = obj["messages"]
    ok = (
        isinstance(msgs, list)
        and msgs
        and all(
            isinstance(m, dict)
            and isinstance(m.get("role"), str)
            and isinstance(m.get("content"), str)
            for m in msgs
        )
    )
    if not ok:
        raise BadInput(
            f"{where}: key 'messages' must be a non-empty list of {{'role': str, 'content': str}} "
            f"objects (found {msgs!r:.80})"
        )
    return msgs


def _shape(obj: dict, where: str) -> list[dict] | str:
    """The line's ``messages`` (checked) or its ``prompt`` text: what a prompt line must hold."""
    if "messages" in obj:
        return _messages(obj, where)
    if "prompt" in obj:
        text = obj["prompt"]
        if not isinstance(text, str) or not text:
            raise BadInput(f"{where}: key 'prompt' must be a non-empty string (found {text!r:.80})")
        return text
    raise BadInput(f"{where}: key 'prompt' (or 'messages') is missing (found keys {sorted(obj)})")


def _render(obj: dict, tokenizer, has_template: bool, where: str) -> str:
    """The text to tokenize for one JSONL object."""
    shape = _shape(obj, where)
    if isinstance(shape, list):
        if not has_template:
            raise BadInput(
                f"{where}: key 'messages' needs a tokenizer with a chat_template; this one has "
                "none (use 'prompt' with plain text)"
            )
        msgs = shape
    elif not has_template:
        return shape
    else:
        msgs = [{"role": "user", "content": shape}]
    return tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)


def _prompt_id(obj: dict, lineno: int, where: str) -> str:
    value = obj.get("id", str(lineno))
    if not isinstance(value, (str, int)) or isinstance(value, bool):
        raise BadInput(f"{where}: key 'id' must be a string or an integer (found {value!r:.80})")
    return str(value)


def _records(path: Path) -> Iterator[tuple[str, dict, str]]:
    """(``file:line``, JSON object, prompt id) of each non-blank line, ids unique; errors name
    file:line and key."""
    if not path.is_file():
        raise BadInput(f"{path}: prompts file not found")
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise BadInput(
            f"{path}: prompts file not readable as UTF-8 text ({type(e).__name__})"
        ) from None
    seen: set[str] = set()
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise BadInput(f"{where}: not valid JSON ({e.msg})") from None
        if not isinstance(obj, dict):
            raise BadInput(f"{where}: expected a JSON object with key 'prompt' or 'messages'")
        pid = _prompt_id(obj, lineno, where)
        if pid in seen:
            raise BadInput(f"{where}: key 'id' repeats {pid!r}; prompt ids must be unique")
        seen.add(pid)
        yield where, obj, pid


def _too_few(path: Path, found: int, n: int, what: str | None) -> BadInput:
    need = f"{what} = {n}" if what else str(n)
    return BadInput(f"{path}: {found} prompts, but {need} are needed")


def check_prompts(path: Path, n: int, *, what: str = "warmup_prompts + num_prompts") -> int:
    """Check a prompts file without a tokenizer (lines, keys, ids) and that it holds ``n`` prompts;
    their count.

    Every line is checked, as :func:`load_prompts` would, except what needs the target's tokenizer
    (the chat template, the token count).

    Args:
        path: the JSONL prompts file (one object a line with ``prompt`` or ``messages``, optional
            ``id``).
        n: the prompts needed.
        what: where ``n`` comes from, for the error.

    Returns:
        The number of prompts in the file (all of them, at least ``n``).

    Raises:
        BadInput: a missing or unreadable file, a bad line (naming ``file:line`` and the key), a
            repeated id, or fewer than ``n`` prompts.
    """
    path = Path(path)
    count = 0
    for where, obj, _ in _records(path):
        _shape(obj, where)
        count += 1
    if count < n:
        raise _too_few(path, count, n, what)
    return count


def load_prompts(path: Path, tokenizer, *, n: int | None = None) -> list[Prompt]:
    """The first ``n`` prompts of a JSONL file (all when ``n`` is None), tokenized; errors name
    file:line and key.

    Args:
        path: the JSONL prompts file.
        tokenizer: the target's Hugging Face tokenizer; its chat template, when it has one, renders
            each prompt (special tokens then come from the template).
        n: how many prompts to read; lines after the ``n``-th are never read. None: all.

    Returns:
        The prompts in file order, each with its id (the line number when none is given), rendered
        text and token ids.

    Raises:
        BadInput: a missing or unreadable file, a bad line, a prompt that tokenizes to nothing, or
            fewer than ``n`` prompts.
    """
    path = Path(path)
    has_template = bool(getattr(tokenizer, "chat_template", None))
    prompts: list[Prompt] = []
    records = _records(path)
    while n is None or len(prompts) < n:  # lines after the n-th are never read
        where, obj, pid = next(records, (None, None, None))
        if where is None:
            break
        text = _render(obj, tokenizer, has_template, where)
        # a rendered chat template already holds its special tokens
        ids = list(tokenizer(text, add_special_tokens=not has_template).input_ids)
        if not ids:
            raise BadInput(f"{where}: the prompt tokenizes to no tokens")
        prompts.append(Prompt(pid, text, ids))
    if n is not None and len(prompts) < n:
        raise _too_few(path, len(prompts), n, None)
    return prompts
