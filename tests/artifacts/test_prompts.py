"""Prompt loading: plain prompts, the chat template when the tokenizer has one, and errors naming
file:line."""

import json

import pytest
from transformers import AutoTokenizer

from bisect_eagle.artifacts.prompts import check_prompts, load_prompts
from bisect_eagle.errors import BadInput

TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}{% if "
    "add_generation_prompt %}<assistant>{% endif %}"
)


@pytest.fixture(scope="module")
def tokenizer(tiny):
    return AutoTokenizer.from_pretrained(str(tiny.target), local_files_only=True)


@pytest.fixture(scope="module")
def chat_tokenizer(tiny, tmp_path_factory):
    """A saved copy of the tiny tokenizer with a chat template, loaded back from disk."""
    tok = AutoTokenizer.from_pretrained(str(tiny.target), local_files_only=True)
    tok.chat_template = TEMPLATE
    path = tmp_path_factory.mktemp("chat_tok")
    tok.save_pretrained(str(path))
    return AutoTokenizer.from_pretrained(str(path), local_files_only=True)


def _jsonl(path, *objs):
    path.write_text("".join((o if isinstance(o, str) else json.dumps(o)) + "\n" for o in objs))
    return path


def test_shipped_prompts_are_plain_bytes(tiny, tokenizer):
    prompts = load_prompts(tiny.prompts, tokenizer)
    assert tokenizer.chat_template is None and len(prompts) >= 10
    assert len({p.id for p in prompts}) == len(prompts)
    first = json.loads(tiny.prompts.read_text().splitlines()[0])
    assert (prompts[0].id, prompts[0].text) == (first["id"], first["prompt"])
    assert prompts[0].input_ids == list(first["prompt"].encode())  # byte-level tokenizer
    assert [p.id for p in load_prompts(tiny.prompts, tokenizer, n=3)] == [p.id for p in prompts[:3]]


def test_chat_template_applied_to_prompt_and_messages(tmp_path, chat_tokenizer):
    path = _jsonl(
        tmp_path / "p.jsonl",
        {"id": "a", "prompt": "hi"},
        "",
        {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}]},
    )
    a, b = load_prompts(path, chat_tokenizer)
    assert a.text == "<user>hi\n<assistant>"
    assert a.input_ids == list(a.text.encode())
    # id defaults to the line number
    assert (b.id, b.text) == ("3", "<system>s\n<user>q\n<assistant>")


@pytest.mark.parametrize(
    ("line", "words"),
    [
        ("{not json", ["p.jsonl:2", "not valid JSON"]),
        ('{"id": "x", "text": "hi"}', ["p.jsonl:2", "'prompt'", "text"]),
        ('{"id": "x", "prompt": ""}', ["p.jsonl:2", "'prompt'", "non-empty"]),
        ('{"id": "a", "prompt": "again"}', ["p.jsonl:2", "'id'", "unique"]),
        (
            '{"messages": [{"role": "user", "content": "q"}]}',
            ["p.jsonl:2", "'messages'", "chat_template"],
        ),
        ('["hi"]', ["p.jsonl:2", "JSON object"]),
    ],
)
def test_bad_line_names_file_line_and_key(tmp_path, tokenizer, line, words):
    path = _jsonl(tmp_path / "p.jsonl", {"id": "a", "prompt": "ok"}, line)
    with pytest.raises(BadInput) as e:
        load_prompts(path, tokenizer)
    for w in words:
        assert w in str(e.value)


def test_bad_messages_shape_and_too_few_prompts(tmp_path, tokenizer, chat_tokenizer):
    path = _jsonl(tmp_path / "p.jsonl", {"messages": [{"role": "user"}]})
    with pytest.raises(BadInput, match=r"p.jsonl:1: key 'messages' must be"):
        load_prompts(path, chat_tokenizer)
    path = _jsonl(tmp_path / "q.jsonl", {"prompt": "one"})
    with pytest.raises(BadInput, match="1 prompts, but 2 are needed"):
        load_prompts(path, tokenizer, n=2)


def test_check_prompts_counts_without_a_tokenizer_and_names_the_file(tmp_path):
    path = _jsonl(
        tmp_path / "p.jsonl",
        {"id": "a", "prompt": "one"},
        {"messages": [{"role": "user", "content": "2"}]},
    )
    assert check_prompts(path, 2) == 2
    with pytest.raises(
        BadInput, match=r"p.jsonl: 2 prompts, but warmup_prompts \+ num_prompts = 3 are needed"
    ):
        check_prompts(path, 3)
    bad = _jsonl(tmp_path / "q.jsonl", {"id": "a", "prompt": "one"}, {"id": "b", "prompt": ""})
    with pytest.raises(BadInput, match=r"q.jsonl:2: key 'prompt' must be a non-empty string"):
        check_prompts(bad, 1)  # every line is checked, not only the first n
