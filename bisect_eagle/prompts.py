"""Benchmark prompts from a JSONL file, rendered with the target's chat template when it has one.

One JSON object per line: ``{"id": "q1", "prompt": "text"}`` or ``{"id": "q1", "messages": [{"role":
"user", "content": "text"}, ...]}``; ``id`` is optional (default: the line number); blank lines are skipped.
A plain ``prompt`` becomes a one-message user chat when the tokenizer has a chat template. ``messages``
need a chat template: without one there is no right way to join them, so the line is refused.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from bisect_eagle.errors import BadInput


@dataclass(frozen=True)
class Prompt:
    """A prompt as the engines send it: ``text`` is the rendered string, ``input_ids`` its tokens."""

    id: str
    text: str
    input_ids: list[int]


def _messages(obj: dict, where: str) -> list[dict]:
    msgs = obj["messages"]
    ok = isinstance(msgs, list) and msgs and all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in msgs
    )
    if not ok:
        raise BadInput(f"{where}: key 'messages' must be a non-empty list of {{'role': str, 'content': str}} "
                       f"objects (found {msgs!r:.80})")
    return msgs


def _render(obj: dict, tokenizer, has_template: bool, where: str) -> str:
    """The text to tokenize for one JSONL object."""
    if "messages" in obj:
        msgs = _messages(obj, where)
        if not has_template:
            raise BadInput(f"{where}: key 'messages' needs a tokenizer with a chat_template; this one has none "
                           "(use 'prompt' with plain text)")
    elif "prompt" in obj:
        text = obj["prompt"]
        if not isinstance(text, str) or not text:
            raise BadInput(f"{where}: key 'prompt' must be a non-empty string (found {text!r:.80})")
        if not has_template:
            return text
        msgs = [{"role": "user", "content": text}]
    else:
        raise BadInput(f"{where}: key 'prompt' (or 'messages') is missing (found keys {sorted(obj)})")
    return tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)


def _prompt_id(obj: dict, lineno: int, where: str) -> str:
    value = obj.get("id", str(lineno))
    if not isinstance(value, (str, int)) or isinstance(value, bool):
        raise BadInput(f"{where}: key 'id' must be a string or an integer (found {value!r:.80})")
    return str(value)


def load_prompts(path: Path, tokenizer, n: int | None = None) -> list[Prompt]:
    """The first ``n`` prompts of a JSONL file (all when ``n`` is None), tokenized; errors name file:line and key."""
    path = Path(path)
    if not path.is_file():
        raise BadInput(f"{path}: prompts file not found")
    has_template = bool(getattr(tokenizer, "chat_template", None))
    prompts: list[Prompt] = []
    seen: set[str] = set()
    for lineno, line in enumerate(path.read_text().splitlines(), start=1):
        if n is not None and len(prompts) == n:
            break
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
        text = _render(obj, tokenizer, has_template, where)
        # a rendered chat template already holds its special tokens
        ids = list(tokenizer(text, add_special_tokens=not has_template).input_ids)
        if not ids:
            raise BadInput(f"{where}: the prompt tokenizes to no tokens")
        prompts.append(Prompt(pid, text, ids))
    if n is not None and len(prompts) < n:
        raise BadInput(f"{path}: {len(prompts)} prompts, but {n} are needed")
    return prompts
