"""Doctor checks of the layer ids: where the engine reads them, their range per model family, -1,
the final layer, and the layers fed to the draft against the dump it was trained on
(``docs/sglang-facts.md#layer-ids``)."""

from __future__ import annotations

import difflib

from bisect_eagle.artifacts import layers
from bisect_eagle.keys import IDS_KEY

PLUS_ONE_WORKS = ("qwen2", "qwen3")  # -1 works on these dense models in both known versions
KNOWN_VERSIONS = ((0, 5, 5), (0, 5, 23))


class IdChecks:
    """Mixed into :class:`~bisect_eagle.doctor.core.Doctor` (uses its spec, draft, target facts and
    ``add``)."""

    def fed_ids(self) -> tuple[list[int] | None, str, str]:
        """(ids the engine feeds the draft, their convention, where they come from)."""
        override = self.settings.eagle_aux_hidden_state_layer_ids
        if override is not None:
            return list(override), self.family, f"{self.src}: engine.settings.{IDS_KEY}"
        ids, conv = self.draft.declared(self.reader)
        conv = self.family if conv == "sglang" else conv
        key = IDS_KEY if conv == "vllm" else f"eagle_config.{IDS_KEY}"
        return ids, conv, f"{self.draft.path / 'config.json'}: {key}"

    def check_location(self) -> None:
        """Ids where the engine reads them (SGLang: nested; vLLM: top level)."""
        where = str(self.draft.path / "config.json")
        cfg = self.draft.config
        eagle = cfg.get("eagle_config")
        if (
            self.reader.vllm_ids
            and self.draft.top_ids is None
            and self.draft.nested_ids is not None
        ):
            self.check_vllm_reads_nested(where)
            return
        if self.reader.reads_top_level(self.draft.layout):
            if self.draft.top_ids is None:
                defaults = layers.CONVENTIONS["vllm"].defaults(self.num_layers)
                self.add(
                    "ids-location",
                    "error",
                    where=f"{where}: {IDS_KEY}",
                    message=f"no {IDS_KEY} at the top level or under eagle_config; vLLM then "
                    f"captures its default layers {defaults} silently",
                    fix=f"write the ids (vLLM's numbering) at the top level of {where}",
                )
            return
        if self.draft.nested_ids is not None:
            if isinstance(eagle, dict) and eagle.get("use_aux_hidden_state") is False:
                self.add(
                    "aux-disabled",
                    "error",
                    where=f"{where}: eagle_config.use_aux_hidden_state",
                    message="use_aux_hidden_state is false: SGLang captures no aux states for an "
                    "EAGLE-3 draft",
                    fix="set eagle_config.use_aux_hidden_state to true (or remove it)",
                )
            return
        misspelt = difflib.get_close_matches(
            IDS_KEY, list(eagle) if isinstance(eagle, dict) else [], n=1
        )
        if misspelt:
            msg = f"eagle_config has {misspelt[0]!r}, not {IDS_KEY!r}"
        elif self.draft.top_ids is not None:
            msg = (
                f"{IDS_KEY} is at the top level; SGLang reads only eagle_config.{IDS_KEY} "
                "(top-level ids size fc)"
            )
        else:
            msg = f"eagle_config.{IDS_KEY} is missing"
        overridden = (
            self.reader.sglang_capture
            and self.settings.eagle_aux_hidden_state_layer_ids is not None
        )
        self.add(
            "ids-location",
            "warning" if overridden else "error",
            where=f"{where}: eagle_config.{IDS_KEY}",
            message=f"{msg}; SGLang then silently captures its default layers "
            f"{layers.CONVENTIONS['sglang'].defaults(self.num_layers)} without a log line",
            fix=f"write the ids as eagle_config: {{{IDS_KEY}: [...]}} in {where}",
        )

    def check_vllm_reads_nested(self, where: str) -> None:
        """vLLM without top-level ids reads the nested ids *verbatim as vLLM ids*
        (``vllm/v1/worker/gpu_model_runner.py``, ``_get_eagle3_aux_layers_from_config``):
        SGLang-convention ids (SpecForge's) then feed states one layer shallower than the draft was
        trained on."""
        nested = list(self.draft.nested_ids or [])
        # the engine writes the top level
        overridden = self.settings.eagle_aux_hidden_state_layer_ids is not None
        try:
            canonical = layers.ids_to_canonical(nested, "sglang", num_layers=self.num_layers)
            write = layers.canonical_to_ids(canonical, "vllm", num_layers=self.num_layers)
        except layers.LayerIdError:
            write = None
        to_write = (
            f" {IDS_KEY}: {write} at the top level"
            if write is not None
            else " the ids at the top level"
        )
        self.add(
            "ids-location",
            "warning" if overridden else "error",
            where=f"{where}: eagle_config.{IDS_KEY}",
            message=f"no top-level {IDS_KEY}: vLLM reads the nested {nested} verbatim as vLLM ids, "
            f"i.e. hidden_states {nested}; in SGLang's convention they mean hidden_states "
            f"{[i + 1 for i in nested]}, so the draft is fed states one layer shallower than it "
            "was trained on (silently: a lower accept length, no error)"
            + (
                " — the vllm engine writes this spec's ids at the top level of each trial's draft "
                "copy"
                if overridden
                else ""
            ),
            fix=f"write{to_write} of {where} (vLLM's numbering: id L = hidden_states[L])",
        )

    def _in_range(self, ids: list[int], conv: str, where: str) -> bool:
        try:
            layers.ids_to_canonical(ids, conv, num_layers=self.num_layers)
        except layers.LayerIdError as e:
            c = layers.CONVENTIONS[conv]
            self.add(
                "ids-range",
                "error",
                where=where,
                message=f"{e}",
                fix=f"use {conv} ids in [{c.min_id}, {c.max_id(self.num_layers)}] for this "
                f"{self.num_layers}-layer target",
            )
            return False
        return True

    def check_ids(self, ids: list[int], conv: str, *, where: str) -> bool:
        """Range (by the family's rule), -1, repeats and the final layer; True when usable for
        further checks."""
        sglang = conv.startswith("sglang") and not self.reader.vllm_ids
        if sglang and -1 in ids and not self.check_minus_one(ids, where):
            return False
        if self.reader.vllm_ids and -1 in ids:
            self.add(
                "minus-one",
                "error",
                where=where,
                message=f"id -1 in {ids}: vLLM has no embedding capture; it accepts -1 at start-up "
                "and its engine dies at the first request (shape error under the draft's fc), the "
                "server dead after that",
                fix="drop -1 (vLLM id 0 is the embedding: hidden_states[0])",
            )
            return False
        if not self._in_range(ids, conv, where):
            return False
        if len(set(ids)) != len(ids):
            self.add(
                "ids-repeated",
                "error",
                where=where,
                message=f"ids {ids} repeat a layer; each layer is captured once",
                fix="list each layer once",
            )
        if sglang:
            self.check_final_layer(ids, conv, where=where)
        return True

    def check_final_layer(self, ids: list[int], conv: str, *, where: str) -> None:
        """SGLang captures layer *inputs* 0..N-1: hs[N] (the final state) only where the model class
        captures it at the final norm (gpt-oss, MiniMax-M3); elsewhere the class's failure
        (``capture.CaptureRule.failure``)."""
        if (
            self.num_layers not in layers.ids_to_canonical(ids, conv, num_layers=self.num_layers)
            or self.capture.final
        ):
            return
        how = {
            "index": f"raises IndexError at start-up ({self.capture.source or self.model_type})",
            "counted": "is never captured: start-up fails with 'captured 2 of 3 aux hidden states'",
        }.get(
            self.capture.failure,
            "is never captured, so the draft gets one aux state fewer than fc takes: a shape error "
            "in fc at load",
        )
        severity = "error" if self.reader.sglang_capture else "warning"
        engine_note = (
            ""
            if self.reader.sglang_capture
            else " (this spec's local engine captures it; SGLang would not)"
        )
        self.add(
            "final-layer-id",
            severity,
            where=where,
            message=f"ids {ids} reach hidden_states[{self.num_layers}], the final layer's output, "
            f"which on {self.model_type or 'this model'} {how}{engine_note}",
            fix="use ids below the final layer (docs/sglang-facts.md#final-layer-ids)",
        )

    def check_minus_one(self, ids: list[int], where: str) -> bool:
        """-1 by model family and SGLang version; False when it makes the ids unusable."""
        if not self.reader.sglang_capture:
            return True
        v = self.version
        known = "" if self.version_text else " (SGLang version unknown: give --sglang-version)"
        if self.family == "sglang-deepseek":
            counted = self.model_type != "glm4_moe_lite"
            detail = (
                "SGLang captures these ids as given (first id is not 1), and -1 never matches a "
                "layer: start-up fails with 'captured 2 of 3 aux hidden states'"
                if counted
                else "SGLang captures these ids as given and -1 never matches: the draft gets "
                "fewer aux states than fc takes (a width error at load)"
            )
            self.add(
                "minus-one",
                "error",
                where=where,
                message=f"id -1 on {self.model_type}: {detail}{known}",
                fix="drop -1 (SGLang has no embedding-capture flag on this family; "
                "docs/sglang-facts.md#sglang-deepseek-family)",
            )
            return False
        if self.model_type == "llama":
            if v is not None and v >= KNOWN_VERSIONS[1]:
                return True
            if v is not None and v <= KNOWN_VERSIONS[0]:
                self.add(
                    "minus-one",
                    "error",
                    where=where,
                    message=f"id -1 on llama with SGLang {self.version_text}: TypeError "
                    "(residual=None) at the first forward (works from 0.5.23)",
                    fix="upgrade SGLang to >= 0.5.23, or drop -1",
                )
            else:
                self.add(
                    "minus-one",
                    "warning",
                    where=where,
                    message="id -1 on llama works in SGLang 0.5.23 but raises TypeError in 0.5.5; "
                    f"not verified for {self.version_text or 'this version'}{known}",
                    fix="check the installed SGLang version",
                )
        elif self.model_type not in PLUS_ONE_WORKS:
            self.add(
                "minus-one",
                "warning",
                where=where,
                message=f"id -1 on {self.model_type or 'this architecture'} is not known to work "
                "in SGLang (it is reached only through the +1 arithmetic; there is no "
                "embedding-capture flag)",
                fix="verify with `bisect-eagle fingerprint --server` before a long run",
            )
        return True

    def check_wiring(self, ids: list[int], conv: str, *, where: str) -> None:
        """The layers fed to the draft vs the dump it was trained on (``dump_layer_ids``)."""
        dump_ids = self.spec.dump_layer_ids
        if dump_ids is None:
            return
        dump_where = f"{self.src}: dump_layer_ids"
        if not self._in_range(dump_ids, "sglang", dump_where):
            return
        fed = layers.ids_to_canonical(ids, conv, num_layers=self.num_layers)
        # outputs of those layers
        held = layers.ids_to_canonical(dump_ids, "sglang", num_layers=self.num_layers)
        if len(fed) != len(held):  # dump_layer_ids vs the dump itself is check_dump's finding
            return
        if sorted(fed) != sorted(held):
            fix_ids = layers.canonical_to_ids(
                held, conv if conv.startswith("sglang") else "sglang", num_layers=self.num_layers
            )
            rule = f" ({self.model_type}: {conv} rule)" if conv != "sglang" else ""
            self.add(
                "dump-wiring",
                "error",
                where=where,
                message=f"the draft will be fed hidden_states{fed} (ids {ids}{rule}) but the dump "
                f"it was trained on holds hidden_states{held} (the outputs of layers {dump_ids}): "
                "a wiring mismatch, acceptance collapses",
                fix=f"set {IDS_KEY} to {fix_ids}; check the dump with `bisect-eagle fingerprint`",
            )
        elif fed != sorted(fed) or held != sorted(held):
            self.add(
                "dump-wiring",
                "warning",
                where=where,
                message="SGLang concatenates aux states in ascending layer order; the draft's ids "
                f"{ids} or the dump's {dump_ids} are not ascending, so fc may see them in another "
                "order than in training",
                fix="check the order with `bisect-eagle standalone` rules",
            )
