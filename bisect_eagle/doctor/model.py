"""Doctor checks of the draft, the dump, the algorithm and the vocabulary
(``docs/sglang-facts.md``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from bisect_eagle.artifacts.draft import DraftConfigFile, read_draft_config, read_headers
from bisect_eagle.artifacts.dumps import DumpReader
from bisect_eagle.artifacts.layers import IdReader, fc_width_refusal
from bisect_eagle.artifacts.wiring import check_width, parse_rule
from bisect_eagle.engines import engine_class
from bisect_eagle.engines.sglang.rules import apply_speculative_rules
from bisect_eagle.errors import BadInput


@dataclass
class DraftInfo:
    """What a draft directory declares: its config.json (the one draft-config reader) and tensor
    shapes."""

    file: DraftConfigFile
    # canonical (``midlayer.*``) tensor name -> shape, from the headers
    shapes: dict[str, list[int]]

    @property
    def path(self) -> Path:
        return self.file.path.parent

    @property
    def config(self) -> dict:
        return self.file.raw

    @property
    def layout(self) -> str:
        return self.file.layout

    @property
    def nested_ids(self) -> list[int] | None:
        return self.file.nested_ids

    @property
    def top_ids(self) -> list[int] | None:
        return self.file.top_level_ids

    @property
    def is_eagle3(self) -> bool:
        return self.file.is_eagle3

    def declared(self, reader: IdReader) -> tuple[list[int] | None, str]:
        """The ids ``reader``'s loader takes from the draft, and their convention.

        Args:
            reader: the engine's loader (:attr:`bisect_eagle.engines.EngineKind.id_reader`).

        Returns:
            (the ids, None when the draft declares none where it reads; ``sglang`` or ``vllm``).
        """
        return self.file.declared_ids(reader)


def read_draft(path: Path) -> DraftInfo:
    """A draft's config and tensor shapes (headers only).

    Args:
        path: the draft directory.

    Returns:
        The draft's typed config and canonical tensor name → shape.

    Raises:
        BadInput: a missing or bad config.json, or no readable safetensors headers
            (``DraftLoadError``).
    """
    return DraftInfo(
        read_draft_config(path), {n: list(h.shape) for n, h in read_headers(Path(path)).items()}
    )


class ModelChecks:
    """Mixed into :class:`~bisect_eagle.doctor.core.Doctor` (uses its spec, draft, target facts and
    ``add``)."""

    def check_fc_width(self, ids: list[int], where: str) -> bool:
        """fc input width vs len(ids) × target hidden size; True when it fits."""
        fc = self.draft.shapes.get("fc.weight")
        if fc is None:
            self.add(
                "fc-width",
                "error",
                where=str(self.draft.path),
                message="the draft has no fc.weight",
                fix="point draft at an EAGLE-3 checkpoint (fc.weight: k·H -> H)",
            )
            return False
        draft_h = self.draft.config.get("target_hidden_size")
        if draft_h is not None and int(draft_h) != self.hidden:
            self.add(
                "fc-width",
                "error",
                where=f"{self.draft.path / 'config.json'}: target_hidden_size",
                message=f"the draft was built for a target hidden size of {draft_h}; this target's "
                f"is {self.hidden}",
                fix="use the draft trained for this target",
            )
            return False
        width, rest = divmod(fc[1], self.hidden)
        said_by = f"fc.weight: {fc[1]} inputs = {width} × target hidden size {self.hidden}"
        refusal = (
            f"fc takes {fc[1]} inputs, not a multiple of the target hidden size {self.hidden}"
            if rest
            else fc_width_refusal(ids, width=width, where=str(self.draft.path), said_by=said_by)
        )
        if refusal is not None:
            self.add(
                "fc-width",
                "error",
                where=where,
                message=refusal,
                fix=f"give exactly {width} layer ids (the draft's fc was trained on that many)",
            )
            return False
        return True

    def check_dump(self) -> None:
        """The dump's state count and width against dump_layer_ids and the target."""
        reader = DumpReader(self.dump)
        sample = next(iter(reader.head(1)), None)
        if sample is None:
            raise BadInput(f"{self.dump}: no readable samples")
        width = sample.states[0].shape[-1]
        if width != self.hidden:
            self.add(
                "dump-width",
                "error",
                where=f"{self.src}: dump",
                message=f"the dump's states are {width} wide, the target's hidden size is "
                f"{self.hidden}",
                fix="use the dump made from this target",
            )
        fc = self.draft.shapes.get("fc.weight")
        aux = len(sample.states) - 1
        if fc is not None and width == self.hidden and fc[1] != aux * width:
            self.add(
                "dump-wiring",
                "error",
                where=f"{self.src}: dump",
                message=f"the dump holds {aux} aux states (+ the final state) but the draft's fc "
                f"takes {fc[1] // width} × {width}: the draft was not trained on this dump",
                fix="point dump at the draft's training dump",
            )
        ids = self.spec.dump_layer_ids
        if ids is not None and len(ids) + 1 != len(sample.states):
            self.add(
                "dump-layers",
                "error",
                where=f"{self.src}: dump_layer_ids",
                message=f"dump_layer_ids names {len(ids)} aux layers (+ the final state = "
                f"{len(ids) + 1}), but {sample.source} holds {len(sample.states)} states",
                fix="run `bisect-eagle fingerprint` on the dump and copy its recommended ids",
            )
        for i, w in enumerate(self.spec.standalone.wirings):
            if w.rule is None:
                continue
            try:
                check_width(
                    parse_rule(w.rule), len(sample.states), hidden=width, fc_in=fc[1] if fc else 0
                )
            except BadInput as e:
                self.add(
                    "fc-width",
                    "error",
                    where=f"{self.src}: standalone.wirings[{i}]",
                    message=str(e),
                    fix=f"give a rule that selects {(fc[1] if fc else 0) // max(width, 1)} states",
                )

    # -- speculative settings
    # ---------------------------------------------------------------------------

    def check_algorithm(self) -> None:
        algo = self.settings.speculative_algorithm
        where = f"{self.src}: engine.settings.speculative_algorithm"
        archs = self.draft.config.get("architectures")
        if algo == "EAGLE" and self.draft.is_eagle3:
            self.add(
                "eagle-vs-eagle3",
                "error",
                where=where,
                message=f"speculative_algorithm EAGLE with an EAGLE-3 draft ({archs}): SGLang "
                "accepts it, feeds the draft 1×H, skips fc, and accept length is exactly 1.0",
                fix="set speculative_algorithm: EAGLE3",
            )
        elif algo == "EAGLE3" and not self.draft.is_eagle3:
            self.add(
                "eagle-vs-eagle3",
                "error",
                where=where,
                message="speculative_algorithm EAGLE3 with a draft whose architectures are "
                f"{archs} (not EAGLE-3)",
                fix="use an EAGLE-3 draft (e.g. LlamaForCausalLMEagle3) or speculative_algorithm "
                "EAGLE",
            )
        space = self.spec.space.get("speculative_algorithm")
        if space and "EAGLE" in (space.choices or []) and self.draft.is_eagle3:
            self.add(
                "eagle-vs-eagle3",
                "warning",
                where=f"{self.src}: space.speculative_algorithm",
                message="the search may try EAGLE with an EAGLE-3 draft (accept length 1.0, a "
                "wasted trial)",
                fix="drop EAGLE from the choices",
            )

    def check_draft_tokens(self) -> None:
        """A requested ``num_draft_tokens`` that SGLang's speculative rules override (``topk ==
        1``)."""
        s = self.settings
        if s.is_baseline or s.num_draft_tokens is None:
            return
        try:
            forced = apply_speculative_rules(s)[0].num_draft_tokens
        except BadInput:
            return  # refused settings: the plan check reports them
        if forced == s.num_draft_tokens:
            return
        self.add(
            "ndt-override",
            "warning",
            where=f"{self.src}: engine.settings.num_draft_tokens",
            message=f"topk 1 forces num_draft_tokens = num_steps + 1 = {forced}; the requested "
            f"{s.num_draft_tokens} is overridden with only a warning in the server log",
            fix=f"set num_draft_tokens: {forced}, or raise num_steps to {s.num_draft_tokens - 1}, "
            "or use topk > 1",
        )

    def check_vocab(self) -> None:
        cfg = self.draft.config
        body = cfg.get("transformer_layer_config") if self.draft.layout == "speculators" else cfg
        vocab = (body or {}).get("vocab_size")
        target_vocab = self.target_cfg.get("vocab_size")
        where = str(self.draft.path / "config.json")
        if vocab is not None and target_vocab is not None and int(vocab) != int(target_vocab):
            self.add(
                "vocab-size",
                "error",
                where=f"{where}: vocab_size",
                message=f"the draft's vocab_size {vocab} != the target's {target_vocab}",
                fix="use the draft trained for this target's tokenizer",
            )
        draft_vocab = cfg.get("draft_vocab_size")
        if draft_vocab is None or vocab is None or int(draft_vocab) == int(vocab):
            return
        d2t = self.draft.shapes.get("d2t")
        if d2t is None:
            self.add(
                "vocab-map",
                "error",
                where=str(self.draft.path),
                message=f"draft_vocab_size {draft_vocab} != vocab_size {vocab} but the weights "
                "have no d2t map: draft token i would be read as target token i",
                fix="export d2t (and t2d) with the draft (SpecForge: vocab_mapping.pt)",
            )
        elif d2t != [int(draft_vocab)]:
            self.add(
                "vocab-map",
                "error",
                where=str(self.draft.path),
                message=f"d2t has shape {d2t}, expected [{draft_vocab}] (draft_vocab_size)",
                fix="re-export the vocab map",
            )
        if "t2d" not in self.draft.shapes:
            severity = "error" if engine_class(self.spec.engine.kind).reads_t2d else "info"
            self.add(
                "vocab-map",
                severity,
                where=str(self.draft.path),
                message="the weights have d2t but no t2d (SGLang ignores t2d; the local engine "
                "needs it)",
                fix="export t2d with the draft",
            )
