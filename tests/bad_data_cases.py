"""The bad-data corpus: each case copies part of the shipped tiny scenario into a temporary
directory, breaks one thing, and says which file and which key or tensor the one-line error must
name.

A case is ``(id, build)``; ``build(tmp)`` returns :class:`Bad`: the ``bisect-eagle standalone``
arguments that replace the scenario's input, the culprit (a path or a flag) and the key or tensor
(None for file-level faults).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from bisect_eagle.artifacts import scenarios

TINY = scenarios.get("tiny")
NO_CUDA_DEVICE = "cuda:999" if torch.cuda.is_available() else "cuda:0"


@dataclass
class Bad:
    args: list[str]
    culprit: Path | str
    key: str | None


# -- builders
# ----------------------------------------------------------------------------------------------


def dump_copy(tmp: Path, n: int = 3) -> Path:
    out = tmp / "dump"
    out.mkdir()
    for i in range(n):
        shutil.copy(TINY.dump / f"data_{i}.pt", out / f"data_{i}.pt")
    return out


def edit_sample(path: Path, fn: Callable[[dict], object]) -> Path:
    obj = torch.load(path, weights_only=True)
    fn(obj)
    torch.save(obj, path)
    return path


def bad_sample(tmp: Path, fn: Callable[[dict], object], key: str | None, index: int = 0) -> Bad:
    dump = dump_copy(tmp)
    return Bad(["--dump", str(dump)], edit_sample(dump / f"data_{index}.pt", fn), key)


def specforge_sample(tmp: Path, fn: Callable[[dict], object], key: str) -> Bad:
    """A one-sample SpecForge dump made from the tiny legacy sample 0, then ``fn`` applied."""
    obj = torch.load(TINY.dump / "data_0.pt", weights_only=True)
    hs = obj["hidden_states"]
    out = {
        "input_ids": obj["input_ids"][None],
        "loss_mask": obj["loss_mask"][None],
        "aux_hidden_state": torch.cat(hs[:-1], -1)[None],
        "hidden_state": hs[-1][None],
    }
    fn(out)
    path = tmp / "dump" / "rows_0-2000" / "data_0.ckpt"
    path.parent.mkdir(parents=True)
    torch.save(out, path)
    return Bad(["--dump", str(tmp / "dump")], path, key)


def draft_copy(tmp: Path) -> Path:
    out = tmp / "draft"
    shutil.copytree(TINY.draft, out)
    return out


def bad_draft_config(tmp: Path, fn: Callable[[dict], object], key: str | None) -> Bad:
    draft = draft_copy(tmp)
    path = draft / "config.json"
    cfg = json.loads(path.read_text())
    fn(cfg)
    path.write_text(json.dumps(cfg))
    return Bad(["--draft", str(draft)], path, key)


def bad_draft_tensors(
    tmp: Path, fn: Callable[[dict], object], key: str | None, culprit_dir: bool = False
) -> Bad:
    draft = draft_copy(tmp)
    path = draft / "model.safetensors"
    state = load_file(str(path))
    fn(state)
    save_file(state, str(path))
    return Bad(["--draft", str(draft)], draft if culprit_dir else path, key)


def target_copy(tmp: Path) -> Path:
    """The tiny target with every file symlinked except config.json (edit a file: unlink it
    first)."""
    out = tmp / "target"
    out.mkdir()
    for f in TINY.target.iterdir():
        if f.name == "config.json":
            shutil.copy(f, out / f.name)
        else:
            (out / f.name).symlink_to(f)
    return out


def bad_target_config(tmp: Path, fn: Callable[[dict], object], key: str) -> Bad:
    target = target_copy(tmp)
    path = target / "config.json"
    cfg = json.loads(path.read_text())
    fn(cfg)
    path.write_text(json.dumps(cfg))
    return Bad(["--target", str(target)], path, key)


def bad_target_tensors(
    tmp: Path, fn: Callable[[dict], object], key: str, culprit_dir: bool = False
) -> Bad:
    target = target_copy(tmp)
    path = target / "model.safetensors"
    state = load_file(str(path))
    path.unlink()
    fn(state)
    save_file(state, str(path))
    return Bad(["--target", str(target)], target if culprit_dir else path, key)


def _set(d: dict, key: str, value: object) -> None:
    d[key] = value


def _nan(t: torch.Tensor, value: float = float("nan")) -> torch.Tensor:
    t = t.clone()
    t.view(-1)[7] = value
    return t


def _all_nan(tmp: Path) -> Bad:
    dump = dump_copy(tmp)
    for f in sorted(dump.iterdir()):
        edit_sample(f, _hs(lambda h: [torch.full_like(x, float("nan")) for x in h]))
    return Bad(["--dump", str(dump)], dump / "data_0.pt", "hidden_states[0]")


def _truncated(tmp: Path) -> Bad:
    dump = dump_copy(tmp)
    bad = dump / "data_1.pt"
    bad.write_bytes(bad.read_bytes()[:1000])
    return Bad(["--dump", str(dump)], bad, None)


def _not_a_dict(tmp: Path) -> Bad:
    dump = tmp / "dump"
    dump.mkdir()
    torch.save([torch.zeros(3)], dump / "data_0.pt")
    return Bad(["--dump", str(dump)], dump / "data_0.pt", None)


def _empty_dump(tmp: Path) -> Bad:
    (tmp / "dump").mkdir()
    return Bad(["--dump", str(tmp / "dump")], tmp / "dump", None)


def _wide_dump(tmp: Path) -> Bad:
    dump = dump_copy(tmp)
    for f in sorted(dump.iterdir()):
        edit_sample(f, lambda o: _set(o, "hidden_states", [h[:, :100] for h in o["hidden_states"]]))
    return Bad(["--dump", str(dump)], dump / "data_0.pt", "hidden_states[0]")


def _masked_out(tmp: Path) -> Bad:
    dump = dump_copy(tmp)
    for f in sorted(dump.iterdir()):
        edit_sample(f, lambda o: _set(o, "loss_mask", torch.zeros_like(o["loss_mask"])))
    return Bad(["--dump", str(dump)], dump, "loss_mask")


def _pickle_only_draft(tmp: Path) -> Bad:
    draft = draft_copy(tmp)
    (draft / "model.safetensors").rename(draft / "pytorch_model.bin")
    return Bad(["--draft", str(draft)], draft, None)


def _damaged_draft_header(tmp: Path) -> Bad:
    draft = draft_copy(tmp)
    (draft / "model.safetensors").write_bytes(b"\xff" * 64)
    return Bad(["--draft", str(draft)], draft / "model.safetensors", None)


def _draft_not_json(tmp: Path) -> Bad:
    draft = draft_copy(tmp)
    (draft / "config.json").write_text("{hidden_size: 192")
    return Bad(["--draft", str(draft)], draft / "config.json", None)


def _draft_no_config(tmp: Path) -> Bad:
    draft = draft_copy(tmp)
    (draft / "config.json").unlink()
    return Bad(["--draft", str(draft)], draft / "config.json", None)


def _pickle_only_target(tmp: Path) -> Bad:
    target = target_copy(tmp)
    (target / "model.safetensors").unlink()
    torch.save({"model.embed_tokens.weight": torch.zeros(2, 2)}, target / "pytorch_model.bin")
    return Bad(["--target", str(target)], target / "pytorch_model.bin", None)


def _missing_shard(tmp: Path) -> Bad:
    target = target_copy(tmp)
    (target / "model.safetensors").unlink()
    index = target / "model.safetensors.index.json"
    index.write_text(
        json.dumps(
            {"weight_map": {"model.embed_tokens.weight": "model-00001-of-00002.safetensors"}}
        )
    )
    return Bad(["--target", str(target)], index, "weight_map")


def _target_config_list(tmp: Path) -> Bad:
    target = target_copy(tmp)
    (target / "config.json").write_text("[1, 2]")
    return Bad(["--target", str(target)], target / "config.json", None)


def _drop(key: str) -> Callable[[dict], object]:
    return lambda d: d.pop(key)


def _eagle(key: str, value: object) -> Callable[[dict], object]:
    return lambda cfg: cfg["eagle_config"].__setitem__(key, value)


def _no_head_dim(heads: int) -> Callable[[dict], object]:
    def edit(cfg: dict) -> None:
        cfg.pop("head_dim")
        cfg["num_attention_heads"] = heads

    return edit


def _kv(cfg: dict) -> None:
    cfg["num_key_value_heads"] = 3


def _hs(fn: Callable[[list], object]) -> Callable[[dict], object]:
    def edit(o: dict) -> None:
        o["hidden_states"] = fn(o["hidden_states"])

    return edit


def _replace(lst: list, i: int, value: object) -> list:
    return [value if j == i else v for j, v in enumerate(lst)]


QP, LM, FC = "midlayer.self_attn.q_proj.weight", "lm_head.weight", "fc.weight"

CASES: list[tuple[str, Callable[[Path], Bad]]] = [
    # dumps: types, keys and shapes
    (
        "dump-hidden-states-list-of-ints",
        lambda t: bad_sample(t, lambda o: _set(o, "hidden_states", [1, 2, 3]), "hidden_states"),
    ),
    ("dump-int-input-ids", lambda t: bad_sample(t, lambda o: _set(o, "input_ids", 7), "input_ids")),
    (
        "dump-1d-hidden-states",
        lambda t: bad_sample(t, _hs(lambda h: _replace(h, 0, h[0][:, 0])), "hidden_states[0]"),
    ),
    (
        "dump-token-outside-vocab",
        lambda t: bad_sample(t, lambda o: o["input_ids"].__setitem__(5, 300), "input_ids"),
    ),
    (
        "dump-negative-token",
        lambda t: bad_sample(t, lambda o: o["input_ids"].__setitem__(3, -4), "input_ids", 1),
    ),
    (
        "dump-int-hidden-states",
        lambda t: bad_sample(t, _hs(lambda h: _replace(h, 1, h[1].long())), "hidden_states[1]"),
    ),
    (
        "dump-float-input-ids",
        lambda t: bad_sample(
            t, lambda o: _set(o, "input_ids", o["input_ids"].float()), "input_ids"
        ),
    ),
    ("dump-missing-input-ids", lambda t: bad_sample(t, _drop("input_ids"), "input_ids")),
    ("dump-missing-loss-mask", lambda t: bad_sample(t, _drop("loss_mask"), "loss_mask")),
    (
        "dump-missing-hidden-states",
        lambda t: bad_sample(t, _drop("hidden_states"), "hidden_states"),
    ),
    (
        "dump-hidden-states-one-tensor",
        lambda t: bad_sample(t, _hs(lambda h: h[0]), "hidden_states"),
    ),
    (
        "dump-hidden-states-one-state",
        lambda t: bad_sample(t, _hs(lambda h: h[:1]), "hidden_states"),
    ),
    (
        "dump-2d-input-ids",
        lambda t: bad_sample(
            t, lambda o: _set(o, "input_ids", o["input_ids"].view(2, -1)), "input_ids"
        ),
    ),
    (
        "dump-one-token",
        lambda t: bad_sample(
            t,
            lambda o: o.update(
                input_ids=o["input_ids"][:1],
                loss_mask=o["loss_mask"][:1],
                hidden_states=[h[:1] for h in o["hidden_states"]],
            ),
            "input_ids",
        ),
    ),
    (
        "dump-loss-mask-length",
        lambda t: bad_sample(t, lambda o: _set(o, "loss_mask", o["loss_mask"][:-2]), "loss_mask"),
    ),
    (
        "dump-loss-mask-values",
        lambda t: bad_sample(t, lambda o: _set(o, "loss_mask", o["loss_mask"] * 3), "loss_mask"),
    ),
    (
        "dump-state-rows",
        lambda t: bad_sample(t, _hs(lambda h: _replace(h, 1, h[1][:-1])), "hidden_states[1]"),
    ),
    (
        "dump-state-widths-differ",
        lambda t: bad_sample(t, _hs(lambda h: _replace(h, 2, h[2][:, :100])), "hidden_states[2]"),
    ),
    (
        "dump-later-sample-fewer-states",
        lambda t: bad_sample(t, _hs(lambda h: h[1:]), "hidden_states", 2),
    ),
    # dumps: NaN / inf
    (
        "dump-nan-aux",
        lambda t: bad_sample(t, _hs(lambda h: _replace(h, 2, _nan(h[2]))), "hidden_states[2]"),
    ),
    (
        "dump-inf-final",
        lambda t: bad_sample(
            t, _hs(lambda h: _replace(h, 3, _nan(h[3], float("inf")))), "hidden_states[3]"
        ),
    ),
    (
        "dump-nan-later-sample",
        lambda t: bad_sample(t, _hs(lambda h: _replace(h, 0, _nan(h[0]))), "hidden_states[0]", 2),
    ),
    ("dump-all-nan", _all_nan),
    # dumps: files and directories
    ("dump-truncated-file", _truncated),
    ("dump-not-a-dict", _not_a_dict),
    ("dump-empty-directory", _empty_dump),
    ("dump-missing-directory", lambda t: Bad(["--dump", str(t / "nope")], t / "nope", None)),
    ("dump-width-not-target", _wide_dump),
    ("dump-everything-masked", _masked_out),
    (
        "specforge-aux-width",
        lambda t: specforge_sample(
            t,
            lambda o: _set(o, "aux_hidden_state", o["aux_hidden_state"][..., :-5]),
            "aux_hidden_state",
        ),
    ),
    (
        "specforge-nan-aux",
        lambda t: specforge_sample(
            t,
            lambda o: _set(o, "aux_hidden_state", _nan(o["aux_hidden_state"])),
            "aux_hidden_state",
        ),
    ),
    (
        "specforge-missing-final",
        lambda t: specforge_sample(t, _drop("hidden_state"), "hidden_state"),
    ),
    # drafts: config.json
    (
        "draft-hidden-size-big",
        lambda t: bad_draft_config(t, lambda c: _set(c, "hidden_size", "big"), "hidden_size"),
    ),
    (
        "draft-heads-do-not-divide",
        lambda t: bad_draft_config(t, _no_head_dim(5), "num_attention_heads"),
    ),
    ("draft-kv-heads", lambda t: bad_draft_config(t, _kv, "num_key_value_heads")),
    (
        "draft-ids-as-string",
        lambda t: bad_draft_config(
            t,
            _eagle("eagle_aux_hidden_state_layer_ids", "1,5,9"),
            "eagle_config.eagle_aux_hidden_state_layer_ids",
        ),
    ),
    (
        "draft-ids-missing",
        lambda t: bad_draft_config(
            t, lambda c: c.pop("eagle_config"), "eagle_config.eagle_aux_hidden_state_layer_ids"
        ),
    ),
    (
        "draft-ids-empty",
        lambda t: bad_draft_config(
            t,
            _eagle("eagle_aux_hidden_state_layer_ids", []),
            "eagle_config.eagle_aux_hidden_state_layer_ids",
        ),
    ),
    (
        "draft-eagle-config-not-object",
        lambda t: bad_draft_config(t, lambda c: _set(c, "eagle_config", [1, 5, 9]), "eagle_config"),
    ),
    (
        "draft-eps-string",
        lambda t: bad_draft_config(t, lambda c: _set(c, "rms_norm_eps", "small"), "rms_norm_eps"),
    ),
    (
        "draft-vocab-negative",
        lambda t: bad_draft_config(t, lambda c: _set(c, "vocab_size", -257), "vocab_size"),
    ),
    (
        "draft-unknown-architecture",
        lambda t: bad_draft_config(
            t, lambda c: _set(c, "architectures", ["Llama"]), "architectures"
        ),
    ),
    (
        "draft-fc-norm-variant",
        lambda t: bad_draft_config(t, lambda c: _set(c, "fc_norm", True), "fc_norm"),
    ),
    ("draft-config-not-json", _draft_not_json),
    ("draft-config-missing", _draft_no_config),
    (
        "draft-config-vs-mlp",
        lambda t: bad_draft_config(t, lambda c: _set(c, "intermediate_size", 256), None),
    ),
    (
        "draft-target-hidden-size",
        lambda t: bad_draft_config(t, lambda c: _set(c, "target_hidden_size", 100), None),
    ),
    # drafts: tensors
    (
        "draft-lm-head-shape",
        lambda t: bad_draft_tensors(t, lambda s: _set(s, LM, torch.zeros(90, 192)), LM),
    ),
    (
        "draft-q-proj-shape",
        lambda t: bad_draft_tensors(t, lambda s: _set(s, QP, torch.zeros(100, 384)), QP),
    ),
    (
        "draft-fc-width",
        lambda t: bad_draft_tensors(t, lambda s: _set(s, FC, s[FC][:, :384].contiguous()), FC),
    ),
    (
        "draft-missing-norm",
        lambda t: bad_draft_tensors(t, _drop("norm.weight"), "norm.weight", culprit_dir=True),
    ),
    ("draft-missing-d2t", lambda t: bad_draft_tensors(t, _drop("d2t"), "d2t", culprit_dir=True)),
    ("draft-missing-fc", lambda t: bad_draft_tensors(t, _drop(FC), FC, culprit_dir=True)),
    (
        "draft-float-d2t",
        lambda t: bad_draft_tensors(t, lambda s: _set(s, "d2t", s["d2t"].float()), "d2t"),
    ),
    (
        "draft-d2t-outside-vocab",
        lambda t: bad_draft_tensors(t, lambda s: s["d2t"].__setitem__(95, 1000), "d2t"),
    ),
    ("draft-nan-weight", lambda t: bad_draft_tensors(t, lambda s: _set(s, FC, _nan(s[FC])), FC)),
    (
        "draft-unexpected-tensor",
        lambda t: bad_draft_tensors(
            t,
            lambda s: _set(s, "midlayer.extra.weight", torch.zeros(2)),
            "midlayer.extra.weight",
            culprit_dir=True,
        ),
    ),
    ("draft-pickle-only", _pickle_only_draft),
    ("draft-damaged-header", _damaged_draft_header),
    # targets
    ("target-pickle-only", _pickle_only_target),
    (
        "target-missing-num-layers",
        lambda t: bad_target_config(t, _drop("num_hidden_layers"), "num_hidden_layers"),
    ),
    (
        "target-hidden-size-big",
        lambda t: bad_target_config(t, lambda c: _set(c, "hidden_size", "big"), "hidden_size"),
    ),
    (
        "target-vocab-vs-embedding",
        lambda t: bad_target_config(
            t, lambda c: _set(c, "vocab_size", 300), "model.embed_tokens.weight"
        ),
    ),
    ("target-config-not-object", _target_config_list),
    (
        "target-missing-lm-head",
        lambda t: bad_target_tensors(
            t, _drop("lm_head.weight"), "lm_head.weight", culprit_dir=True
        ),
    ),
    (
        "target-nan-lm-head",
        lambda t: bad_target_tensors(
            t, lambda s: _set(s, "lm_head.weight", _nan(s["lm_head.weight"])), "lm_head.weight"
        ),
    ),
    ("target-missing-shard", _missing_shard),
    (
        "target-missing-directory",
        lambda t: Bad(["--target", str(t / "nope")], t / "nope" / "config.json", None),
    ),
    # devices and flags
    ("device-banana", lambda t: Bad(["--device", "banana"], "--device", "banana")),
    (
        "device-cuda-unavailable",
        lambda t: Bad(["--device", NO_CUDA_DEVICE], "--device", NO_CUDA_DEVICE),
    ),
    ("device-meta", lambda t: Bad(["--device", "meta"], "--device", "meta")),
    ("flag-steps-zero", lambda t: Bad(["--steps", "0"], "--steps", None)),
    ("flag-samples-negative", lambda t: Bad(["--samples", "-1"], "--samples", None)),
]
