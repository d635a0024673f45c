"""Generate the shipped tiny scenario: a byte-level Llama target, its hidden-state dump, an EAGLE-3
draft.

Seeded and deterministic (fixed step counts, not wall-clock budgets). On 2 CPU cores it takes about
11 minutes: ~7 for the target (600 steps of 16 × 128 tokens), ~1 for the dumps, ~3 for the draft.

    python scripts/make_tiny_scenario.py                 # rewrite
    bisect_eagle/artifacts/scenarios/tiny/ python scripts/make_tiny_scenario.py dump --out D
    --layers 3,7,11 --format specforge --samples 8
                                                         # another dump of the shipped target

What it writes (``bisect_eagle/artifacts/scenarios/tiny/``):

* ``target/``: a 12-layer, 192-wide Llama (transformers) trained on ``pydoc_data.topics`` (text that
  ships with Python), weights in bf16, and a byte-level tokenizer (token id = byte, 256 = end of
  text);
* ``dump/``: the held-out part of the hidden-state dump, speculators legacy format (bf16), captured
  at SGLang ids 1, 5, 9 (hidden_states 2, 6, 10) plus the final pre-norm state -- the training part
  is made in memory from the same capture code and not shipped;
* ``draft/``: an EAGLE-3 draft in SpecForge/SGLang layout (``eagle_config`` ids [1, 5, 9]) trained
  on ``cat(hidden_states[:-1])`` with training-time test over 3 steps;
* ``prompts.jsonl``: held-out prompts; ``scenario.json``: the true wiring and the draft's accuracy
  on the held-out dump as measured by the training loop.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import torch
import typer

from bisect_eagle.artifacts import layers
from bisect_eagle.artifacts.draft import DraftConfig, Eagle3Draft, init_weights, save_draft
from bisect_eagle.artifacts.dumps import FORMATS, write_sample
from bisect_eagle.artifacts.target import TargetHead, capture_hidden, load_target
from bisect_eagle.trials.accuracy import Counts

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bisect_eagle" / "scenarios" / "tiny"
SEED = 1234
N_LAYERS = 12
AUX_IDS = [1, 5, 9]  # SGLang / SpecForge convention
SEQ = 96
TTT_STEPS = 3
EOS = 256

app = typer.Typer(add_completion=False)


def corpus() -> tuple[list[bytes], list[bytes]]:
    """pydoc topics split into training and held-out documents (every 8th topic held out)."""
    from pydoc_data.topics import topics

    docs = [topics[k].encode("utf-8") for k in sorted(topics)]
    held = [d for i, d in enumerate(docs) if i % 8 == 3]
    train = [d for i, d in enumerate(docs) if i % 8 != 3]
    return train, held


def stream(docs: list[bytes]) -> torch.Tensor:
    ids: list[int] = []
    for d in docs:
        ids.extend(d)
        ids.append(EOS)
    return torch.tensor(ids, dtype=torch.long)


def windows(data: torch.Tensor, count: int, length: int, rng: random.Random) -> torch.Tensor:
    starts = [rng.randrange(0, data.shape[0] - length) for _ in range(count)]
    return torch.stack([data[s : s + length] for s in starts])


def write_tokenizer(path: Path) -> None:
    """A byte-level tokenizer whose ids equal byte values; 256 is <|endoftext|>."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    vocab = {ch: b for b, ch in bytes_to_unicode().items()}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")
    fast.add_special_tokens({"eos_token": "<|endoftext|>"})
    fast.save_pretrained(str(path))


def train_target(train: torch.Tensor, out: Path, steps: int) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(SEED)
    cfg = LlamaConfig(
        vocab_size=257,
        hidden_size=192,
        intermediate_size=512,
        num_hidden_layers=N_LAYERS,
        num_attention_heads=6,
        num_key_value_heads=6,
        max_position_embeddings=512,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        eos_token_id=EOS,
        bos_token_id=None,
        pad_token_id=None,
    )
    model = LlamaForCausalLM(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01, betas=(0.9, 0.95))
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=3e-3, total_steps=steps, pct_start=0.05)
    rng = random.Random(SEED)
    t0 = time.time()
    for step in range(steps):
        x = windows(train, 16, 129, rng)
        logits = model(input_ids=x[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1)
        )
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        if step % 50 == 0 or step == steps - 1:
            print(
                f"target step {step:4d} loss {loss.item():.3f} ({time.time() - t0:.0f}s)",
                flush=True,
            )
    model.to(torch.bfloat16).save_pretrained(str(out))
    write_tokenizer(out)


@torch.inference_mode()
def capture(model, seqs: torch.Tensor, indices: list[int]) -> list[torch.Tensor]:
    """States at ``indices`` for each window [n, S], rounded to bf16 as a dump stores them: [n, S,
    H] each."""
    outs: list[list[torch.Tensor]] = [[] for _ in indices]
    with capture_hidden(model, indices) as got:
        for chunk in seqs.split(64):
            model(input_ids=chunk)
            for j, i in enumerate(indices):
                outs[j].append(got[i].to(torch.bfloat16).float())
    return [torch.cat(o) for o in outs]


def write_dump(
    out: Path, seqs: torch.Tensor, states: list[torch.Tensor], head: TargetHead, fmt: str
) -> None:
    """Write windows as a dump; ``states`` ends with the final pre-norm state."""
    for i in range(seqs.shape[0]):
        final = states[-1][i]
        if fmt == "specforge":
            final = head.norm(final)
        write_sample(
            out,
            i,
            fmt=fmt,
            input_ids=seqs[i],
            loss_mask=torch.ones(seqs.shape[1], dtype=torch.long),
            aux=[s[i] for s in states[:-1]],
            final=final,
        )


def draft_vocab(
    train_ids: torch.Tensor, size: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(sorted target ids of the draft vocab, d2t, t2d) from token frequency."""
    freq = torch.bincount(train_ids.reshape(-1), minlength=257)
    ids = freq.topk(size).indices.sort().values
    d2t = ids - torch.arange(size)
    t2d = torch.zeros(257, dtype=torch.bool)
    t2d[ids] = True
    return ids, d2t, t2d


def rows(seqs: torch.Tensor, states: list[torch.Tensor], head: TargetHead, vocab_ids: torch.Tensor):
    """aux [n, S-1, 3H], tokens [n, S-1+TTT-1], draft-vocab labels and full-vocab labels, like
    standalone."""
    aux = torch.cat(states[:-1], -1)[:, :-1]
    logits = head.norm(states[-1]) @ head.lm_head.T
    pad = torch.zeros(seqs.shape[0], TTT_STEPS - 1, dtype=torch.long)
    tokens = torch.cat([seqs[:, 1:], pad], 1)
    full = torch.cat([logits.argmax(-1)[:, 1:], pad], 1)
    in_draft = torch.cat([logits[..., vocab_ids].argmax(-1)[:, 1:], pad], 1)
    return aux, tokens, in_draft, full


def train_draft(
    target_dir: Path, train_seqs, train_states, held_seqs, held_states, steps: int
) -> tuple:
    head = TargetHead.load(target_dir)
    vocab_ids, d2t, t2d = draft_vocab(train_seqs, 96)
    torch.manual_seed(SEED + 1)
    c = DraftConfig(
        hidden_size=192,
        intermediate_size=512,
        num_attention_heads=4,
        num_key_value_heads=4,
        head_dim=48,
        vocab_size=257,
        draft_vocab_size=96,
        target_hidden_size=192,
        num_aux=3,
    )
    model = Eagle3Draft(c)
    init_weights(model, seed=SEED + 2)
    with torch.no_grad():
        model.embed_tokens.weight.copy_(head.embed)
        model.d2t.copy_(d2t)
        model.t2d.copy_(t2d)
    aux, tokens, labels, _ = rows(train_seqs, train_states, head, vocab_ids)
    t = aux.shape[1] - (TTT_STEPS - 1)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=2e-3, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=2e-3, total_steps=steps, pct_start=0.05)
    g = torch.Generator().manual_seed(SEED + 3)
    t0 = time.time()
    for step in range(steps):
        idx = torch.randint(0, aux.shape[0], (32,), generator=g)
        outs = model.ttt_forward(aux[idx, :t], tokens[idx, : t + TTT_STEPS - 1], steps=TTT_STEPS)
        loss = sum(
            0.8**k
            * torch.nn.functional.cross_entropy(
                model.logits(h).reshape(-1, c.draft_vocab_size), labels[idx, k : k + t].reshape(-1)
            )
            for k, h in enumerate(outs)
        )
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        if step % 200 == 0 or step == steps - 1:
            print(
                f"draft step {step:4d} loss {loss.item():.3f} ({time.time() - t0:.0f}s)", flush=True
            )
    model.eval()
    return model, validation_accuracy(model, held_seqs, held_states, head, vocab_ids)


@torch.inference_mode()
def validation_accuracy(model, seqs, states, head, vocab_ids) -> dict:
    """The training loop's held-out accuracy at step 0 (the number a training log would show)."""
    aux, tokens, in_draft, full = rows(seqs, states, head, vocab_ids)
    h = model.ttt_forward(aux, tokens, steps=1)[0]
    pred = model.logits(h).argmax(-1)
    c = Counts(
        tokens=pred.numel(),
        draft_hits=int((pred == in_draft[:, : pred.shape[1]]).sum()),
        full_hits=int((model.to_target_ids(pred) == full[:, : pred.shape[1]]).sum()),
    )
    return {
        "draft_vocab": round(c.rate(c.draft_hits), 4),
        "full_vocab": round(c.rate(c.full_hits), 4),
    }


def write_prompts(path: Path, held: list[bytes], count: int, rng: random.Random) -> None:
    lines = []
    for doc in held:
        text = doc.decode("utf-8", "ignore")
        for para in text.split("\n\n"):
            para = " ".join(para.split())
            if len(para) >= 80 and para.isascii():
                lines.append(para[:64])
    rng.shuffle(lines)
    with path.open("w") as f:
        for i, p in enumerate(lines[:count]):
            f.write(json.dumps({"id": f"held-{i}", "prompt": p}) + "\n")


@app.command()
def scenario(
    target_steps: int = 600,
    draft_steps: int = 1500,
    train_windows: int = 1500,
    held_windows: int = 64,
    out: Path = OUT,
) -> None:
    """Rebuild the whole tiny scenario."""
    torch.set_num_threads(2)
    started = time.time()
    train_docs, held_docs = corpus()
    train, held = stream(train_docs), stream(held_docs)
    out.mkdir(parents=True, exist_ok=True)
    train_target(train, out / "target", target_steps)
    model, _ = load_target(out / "target")  # the shipped bf16 weights, computed in fp32
    head = TargetHead.load(out / "target")
    rng = random.Random(SEED + 4)
    indices = [*layers.ids_to_canonical(AUX_IDS, "sglang", num_layers=N_LAYERS), N_LAYERS]
    train_seqs, held_seqs = (
        windows(train, train_windows, SEQ, rng),
        windows(held, held_windows, SEQ, rng),
    )
    train_states, held_states = (
        capture(model, train_seqs, indices),
        capture(model, held_seqs, indices),
    )
    for old in (out / "dump").glob("data_*.pt"):
        old.unlink()
    write_dump(out / "dump", held_seqs, held_states, head, "speculators-legacy")
    draft, acc = train_draft(
        out / "target", train_seqs, train_states, held_seqs, held_states, draft_steps
    )
    save_draft(draft, out / "draft", layout="specforge", layer_ids=AUX_IDS)
    write_prompts(out / "prompts.jsonl", held_docs, 24, rng)
    meta = {
        "name": "tiny",
        "target_layers": N_LAYERS,
        "aux_layer_ids": {"sglang": AUX_IDS, "hidden_states": indices[:-1]},
        "true_rule": "[:-1]",
        "dump_format": "speculators-legacy",
        "dump_states": [layers.describe(i, N_LAYERS) for i in indices],
        "training_accuracy": acc,
        "training_accuracy_note": "step-0 accuracy on the held-out dump, measured by the training "
        "loop",
        "generator": {
            "seed": SEED,
            "target_steps": target_steps,
            "draft_steps": draft_steps,
            "train_windows": train_windows,
            "held_windows": held_windows,
            "seq": SEQ,
            "ttt_steps": TTT_STEPS,
            "seconds": round(time.time() - started),
        },
    }
    (out / "scenario.json").write_text(json.dumps(meta, indent=2) + "\n")
    print(json.dumps(meta, indent=2))


@app.command()
def dump(
    out: Path,
    layer_ids: str = typer.Option("3,7,11", "--layers", help="SGLang-convention ids"),
    fmt: str = typer.Option("specforge", "--format", help=f"one of {FORMATS}"),
    samples: int = 8,
    seed: int = SEED + 5,
    target: Path = OUT / "target",
) -> None:
    """Write another dump of the held-out text from a target, at other layers and/or in another
    format."""
    torch.set_num_threads(2)
    model, _ = load_target(target)
    n = len(model.model.layers)
    indices = [
        *layers.ids_to_canonical([int(x) for x in layer_ids.split(",")], "sglang", num_layers=n),
        n,
    ]
    seqs = windows(stream(corpus()[1]), samples, SEQ, random.Random(seed))
    write_dump(out, seqs, capture(model, seqs, indices), TargetHead.load(target), fmt)
    print(f"wrote {samples} samples ({fmt}) at hidden_states {indices[:-1]} + final to {out}")


if __name__ == "__main__":
    app()
