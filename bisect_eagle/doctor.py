"""Static checks of a spec before any GPU time is spent: each finding has a severity and the fix.

Reads only configs, safetensors headers and one dump sample (pickle-free); runs no model. What it knows
comes from the facts sheet: SGLang reads capture ids only from nested ``eagle_config`` (vLLM only from the
top level), silently falls back to its defaults otherwise and never captures id ``N - 1``; ``-1`` breaks on
some architectures and versions (section 2); ``topk == 1`` overrides ``num_draft_tokens``; ``EAGLE`` with an
EAGLE-3 draft runs at accept length 1.0; a draft vocabulary needs ``d2t``; and the draft must be fed the
layers of the dump it was trained on.
"""

from __future__ import annotations

import difflib
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from bisect_eagle import layers
from bisect_eagle.draft import DraftConfigFile, read_draft_config, read_headers
from bisect_eagle.dumps import DumpReader
from bisect_eagle.errors import BadInput
from bisect_eagle.settings import LiveSettings
from bisect_eagle.spec import WIRING_SETTING, Spec
from bisect_eagle.target import read_target_config
from bisect_eagle.wiring import check_width, parse_rule

SEVERITIES = ("error", "warning", "info")
IDS_KEY = "eagle_aux_hidden_state_layer_ids"
EAGLE3_ARCHS = ("Eagle3Speculator",)
DEEPSEEK_FAMILY = ("deepseek_v2", "deepseek_v3", "kimi_k2", "glm4_moe_lite")
PLUS_ONE_WORKS = ("qwen2", "qwen3")  # -1 works on these dense models in both known versions
KNOWN_VERSIONS = ((0, 5, 5), (0, 5, 23))


@dataclass
class Finding:
    """One problem (or note) and how to fix it."""

    code: str
    severity: str  # error | warning | info
    where: str  # file and key
    message: str
    fix: str

    def to_json(self) -> dict[str, str]:
        return asdict(self)


@dataclass
class DraftInfo:
    """What a draft directory declares: its config.json (the one draft-config reader) and tensor shapes."""

    file: DraftConfigFile
    shapes: dict[str, list[int]]  # canonical (``midlayer.*``) tensor name -> shape, from the headers

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

    def declared(self, engine: str) -> tuple[list[int] | None, str]:
        """The ids this engine reads from the draft, and their convention."""
        return self.file.declared_ids(engine)  # type: ignore[arg-type]


def read_draft(path: Path) -> DraftInfo:
    """A draft's config and tensor shapes (headers only)."""
    return DraftInfo(read_draft_config(path), {n: list(h.shape) for n, h in read_headers(Path(path)).items()})


def engine_family(spec: Spec) -> str:
    """sglang, vllm (a server launched with vllm) or local."""
    if spec.engine.kind == "local":
        return "local"
    return "vllm" if any("vllm" in part for part in spec.engine.sglang.launch_command) else "sglang"


def _version(text: str | None) -> tuple[int, ...] | None:
    if not text:
        return None
    parts = []
    for piece in text.split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts) or None


def installed_sglang() -> str | None:
    try:
        return metadata.version("sglang")
    except metadata.PackageNotFoundError:
        return None


class Doctor:
    """Collects the findings of one spec."""

    def __init__(self, spec: Spec, sglang_version: str | None = None):
        self.spec = spec
        self.src = str(spec.source)
        self.findings: list[Finding] = []
        self.engine = engine_family(spec)
        self.version_text = sglang_version or (installed_sglang() if self.engine == "sglang" else None)
        self.version = _version(self.version_text)
        paths = spec.paths()
        self.target_cfg = read_target_config(paths["target"])
        self.draft = read_draft(Path(paths["draft"]))
        self.dump = Path(paths["dump"])
        try:
            self.num_layers = int(self.target_cfg["num_hidden_layers"])
            self.hidden = int(self.target_cfg["hidden_size"])
        except (KeyError, TypeError, ValueError):
            raise BadInput(f"{paths['target']}/config.json: keys 'num_hidden_layers' and 'hidden_size' are "
                           "required") from None
        self.settings: LiveSettings = spec.fixed_settings()

    def add(self, code: str, severity: str, where: str, message: str, fix: str) -> None:
        self.findings.append(Finding(code, severity, where, message, fix))

    # -- ids ------------------------------------------------------------------------------------------

    def fed_ids(self) -> tuple[list[int] | None, str, str]:
        """(ids the engine feeds the draft, their convention, where they come from)."""
        override = self.settings.eagle_aux_hidden_state_layer_ids
        if override is not None:
            return list(override), "sglang", f"{self.src}: engine.settings.{WIRING_SETTING}"
        ids, conv = self.draft.declared(self.engine)
        key = IDS_KEY if conv == "vllm" else f"eagle_config.{IDS_KEY}"
        return ids, conv, f"{self.draft.path / 'config.json'}: {key}"

    def check_location(self) -> None:
        """Ids where the engine reads them (SGLang: nested; vLLM: top level)."""
        where = str(self.draft.path / "config.json")
        cfg = self.draft.config
        eagle = cfg.get("eagle_config")
        if self.engine == "vllm" or (self.engine == "local" and self.draft.layout == "speculators"):
            if self.draft.top_ids is None:
                nested = " (they are nested under eagle_config, which vLLM ignores)" if self.draft.nested_ids else ""
                self.add("ids-location", "error", f"{where}: {IDS_KEY}",
                         f"no top-level {IDS_KEY}{nested}; vLLM then captures its default layers silently",
                         f"write the ids at the top level of {where}")
            return
        if self.draft.nested_ids is not None:
            if isinstance(eagle, dict) and eagle.get("use_aux_hidden_state") is False:
                self.add("aux-disabled", "error", f"{where}: eagle_config.use_aux_hidden_state",
                         "use_aux_hidden_state is false: SGLang captures no aux states for an EAGLE-3 draft",
                         "set eagle_config.use_aux_hidden_state to true (or remove it)")
            return
        misspelt = difflib.get_close_matches(IDS_KEY, list(eagle) if isinstance(eagle, dict) else [], n=1)
        if misspelt:
            msg = f"eagle_config has {misspelt[0]!r}, not {IDS_KEY!r}"
        elif self.draft.top_ids is not None:
            msg = f"{IDS_KEY} is at the top level; SGLang reads only eagle_config.{IDS_KEY} (top-level ids size fc)"
        else:
            msg = f"eagle_config.{IDS_KEY} is missing"
        overridden = self.engine == "sglang" and self.settings.eagle_aux_hidden_state_layer_ids is not None
        self.add("ids-location", "warning" if overridden else "error", f"{where}: eagle_config.{IDS_KEY}",
                 f"{msg}; SGLang then silently captures its default layers "
                 f"{layers.CONVENTIONS['sglang'].defaults(self.num_layers)} without a log line",
                 f"write the ids as eagle_config: {{{IDS_KEY}: [...]}} in {where}")

    def _in_range(self, ids: list[int], conv: str, where: str) -> bool:
        try:
            layers.ids_to_canonical(ids, conv, self.num_layers)
        except layers.LayerIdError as e:
            c = layers.CONVENTIONS[conv]
            self.add("ids-range", "error", where, f"{e}",
                     f"use {conv} ids in [{c.min_id}, {c.max_id(self.num_layers)}] for this "
                     f"{self.num_layers}-layer target")
            return False
        return True

    def check_ids(self, ids: list[int], conv: str, where: str) -> bool:
        """Range, SGLang's dropped final layer and -1; True when the ids are usable for further checks."""
        if not self._in_range(ids, conv, where):
            return False
        if len(set(ids)) != len(ids):
            self.add("ids-repeated", "error", where, f"ids {ids} repeat a layer; each layer is captured once",
                     "list each layer once")
        if conv == "sglang" and self.engine != "vllm":
            self.check_final_layer(ids, where)
            self.check_minus_one(ids, where)
        return True

    def check_final_layer(self, ids: list[int], where: str) -> None:
        last = self.num_layers - 1
        if last not in ids:
            return
        moe = self.target_cfg.get("model_type") in ("qwen2_moe", "qwen3_moe")
        how = "raises IndexError at start-up (Qwen2/3-MoE, 0.5.23)" if moe else "is silently never captured"
        severity = "error" if self.engine == "sglang" else "warning"
        engine_note = "" if self.engine == "sglang" else " (this spec's local engine captures it; SGLang would not)"
        self.add("final-layer-id", severity, where,
                 f"SGLang id {last} (output of the final layer) {how}: SGLang's capture loop ends before it, so "
                 f"the draft gets fewer aux states than it was trained on{engine_note}",
                 f"use ids <= {last - 1}; to feed the final state, train the draft on an earlier layer")

    def check_minus_one(self, ids: list[int], where: str) -> None:
        if -1 not in ids or self.engine != "sglang":
            return
        model_type = str(self.target_cfg.get("model_type", ""))
        v = self.version
        known = "" if self.version_text else " (SGLang version unknown: give --sglang-version)"
        if model_type in DEEPSEEK_FAMILY:
            detail = ("TypeError (residual=None) at the first forward in 0.5.5; in 0.5.23 the raw -1 never matches "
                      "and start-up fails with 'captured 2 of 3 aux hidden states' (unconfirmed)")
            self.add("minus-one", "error", where, f"id -1 on {model_type}: {detail}{known}",
                     "drop -1 (SGLang has no embedding-capture flag), or use a draft trained without the embedding")
        elif model_type == "llama":
            if v is not None and v >= KNOWN_VERSIONS[1]:
                return
            if v is not None and v <= KNOWN_VERSIONS[0]:
                self.add("minus-one", "error", where,
                         f"id -1 on llama with SGLang {self.version_text}: TypeError (residual=None) at the first "
                         "forward (works from 0.5.23)", "upgrade SGLang to >= 0.5.23, or drop -1")
            else:
                self.add("minus-one", "warning", where,
                         f"id -1 on llama works in SGLang 0.5.23 but raises TypeError in 0.5.5; not verified for "
                         f"{self.version_text or 'this version'}{known}", "check the installed SGLang version")
        elif model_type not in PLUS_ONE_WORKS:
            self.add("minus-one", "warning", where,
                     f"id -1 on {model_type or 'this architecture'} is not known to work in SGLang (it is reached "
                     "only through the +1 arithmetic; there is no embedding-capture flag)",
                     "verify with `bisect-eagle fingerprint --server` before a long run")

    def check_fc_width(self, ids: list[int], where: str) -> bool:
        """fc input width vs len(ids) × target hidden size; True when it fits."""
        fc = self.draft.shapes.get("fc.weight")
        if fc is None:
            self.add("fc-width", "error", str(self.draft.path), "the draft has no fc.weight",
                     "point draft at an EAGLE-3 checkpoint (fc.weight: k·H -> H)")
            return False
        draft_h = self.draft.config.get("target_hidden_size")
        if draft_h is not None and int(draft_h) != self.hidden:
            self.add("fc-width", "error", f"{self.draft.path / 'config.json'}: target_hidden_size",
                     f"the draft was built for a target hidden size of {draft_h}; this target's is {self.hidden}",
                     "use the draft trained for this target")
            return False
        need = len(ids) * self.hidden
        if fc[1] != need:
            self.add("fc-width", "error", where,
                     f"fc takes {fc[1]} inputs = {fc[1] // self.hidden} layers × {self.hidden}, but {len(ids)} ids "
                     f"{ids} × target hidden size {self.hidden} = {need}",
                     f"give exactly {fc[1] // self.hidden} layer ids (the draft's fc was trained on that many)")
            return False
        return True

    def check_wiring(self, ids: list[int], conv: str, where: str) -> None:
        """The layers fed to the draft vs the dump it was trained on (``dump_layer_ids``)."""
        dump_ids = self.spec.dump_layer_ids
        if dump_ids is None:
            return
        dump_where = f"{self.src}: dump_layer_ids"
        if not self._in_range(dump_ids, "sglang", dump_where):
            return
        fed = layers.ids_to_canonical(ids, conv, self.num_layers)
        held = layers.ids_to_canonical(dump_ids, "sglang", self.num_layers)
        if len(fed) != len(held):  # dump_layer_ids vs the dump itself is check_dump's finding
            return
        if sorted(fed) != sorted(held):
            self.add("dump-wiring", "error", where,
                     f"the draft will be fed hs{fed} ({conv} ids {ids}) but the dump it was trained on holds hs{held} "
                     f"(SGLang ids {dump_ids}): a wiring mismatch, acceptance collapses",
                     f"set {WIRING_SETTING} to {dump_ids} (or leave it unset if the draft's config says so); "
                     "check the dump with `bisect-eagle fingerprint`")
        elif fed != sorted(fed) or held != sorted(held):
            self.add("dump-wiring", "warning", where,
                     f"SGLang concatenates aux states in ascending layer order; the draft's ids {ids} or the dump's "
                     f"{dump_ids} are not ascending, so fc may see them in another order than in training",
                     "check the order with `bisect-eagle standalone` rules")

    def check_dump(self) -> None:
        """The dump's state count and width against dump_layer_ids and the target."""
        reader = DumpReader(self.dump)
        sample = next(iter(reader.head(1)), None)
        if sample is None:
            raise BadInput(f"{self.dump}: no readable samples")
        width = sample.states[0].shape[-1]
        if width != self.hidden:
            self.add("dump-width", "error", f"{self.src}: dump",
                     f"the dump's states are {width} wide, the target's hidden size is {self.hidden}",
                     "use the dump made from this target")
        fc = self.draft.shapes.get("fc.weight")
        aux = len(sample.states) - 1
        if fc is not None and width == self.hidden and fc[1] != aux * width:
            self.add("dump-wiring", "error", f"{self.src}: dump",
                     f"the dump holds {aux} aux states (+ the final state) but the draft's fc takes "
                     f"{fc[1] // width} × {width}: the draft was not trained on this dump",
                     "point dump at the draft's training dump")
        ids = self.spec.dump_layer_ids
        if ids is not None and len(ids) + 1 != len(sample.states):
            self.add("dump-layers", "error", f"{self.src}: dump_layer_ids",
                     f"dump_layer_ids names {len(ids)} aux layers (+ the final state = {len(ids) + 1}), but "
                     f"{sample.source} holds {len(sample.states)} states",
                     "run `bisect-eagle fingerprint` on the dump and copy its recommended ids")
        for i, w in enumerate(self.spec.standalone.wirings):
            if w.rule is None:
                continue
            try:
                check_width(parse_rule(w.rule), len(sample.states), width, fc[1] if fc else 0)
            except BadInput as e:
                self.add("fc-width", "error", f"{self.src}: standalone.wirings[{i}]", str(e),
                         f"give a rule that selects {(fc[1] if fc else 0) // max(width, 1)} states")

    # -- speculative settings ---------------------------------------------------------------------------

    def check_algorithm(self) -> None:
        algo = self.settings.speculative_algorithm
        where = f"{self.src}: engine.settings.speculative_algorithm"
        archs = self.draft.config.get("architectures")
        if algo == "EAGLE" and self.draft.is_eagle3:
            self.add("eagle-vs-eagle3", "error", where,
                     f"speculative_algorithm EAGLE with an EAGLE-3 draft ({archs}): SGLang accepts it, feeds the "
                     "draft 1×H, skips fc, and accept length is exactly 1.0",
                     "set speculative_algorithm: EAGLE3")
        elif algo == "EAGLE3" and not self.draft.is_eagle3:
            self.add("eagle-vs-eagle3", "error", where,
                     f"speculative_algorithm EAGLE3 with a draft whose architectures are {archs} (not EAGLE-3)",
                     "use an EAGLE-3 draft (e.g. LlamaForCausalLMEagle3) or speculative_algorithm EAGLE")
        space = self.spec.space.get("speculative_algorithm")
        if space and "EAGLE" in (space.choices or []) and self.draft.is_eagle3:
            self.add("eagle-vs-eagle3", "warning", f"{self.src}: space.speculative_algorithm",
                     "the search may try EAGLE with an EAGLE-3 draft (accept length 1.0, a wasted trial)",
                     "drop EAGLE from the choices")

    def check_draft_tokens(self) -> None:
        s = self.settings
        if s.is_baseline or s.topk != 1 or s.num_draft_tokens is None or s.num_draft_tokens == s.num_steps + 1:
            return
        self.add("ndt-override", "warning", f"{self.src}: engine.settings.num_draft_tokens",
                 f"topk 1 forces num_draft_tokens = num_steps + 1 = {s.num_steps + 1}; the requested "
                 f"{s.num_draft_tokens} is overridden with only a warning in the server log",
                 f"set num_draft_tokens: {s.num_steps + 1}, or raise num_steps to {s.num_draft_tokens - 1}, "
                 "or use topk > 1")

    def check_vocab(self) -> None:
        cfg = self.draft.config
        body = cfg.get("transformer_layer_config") if self.draft.layout == "speculators" else cfg
        vocab = (body or {}).get("vocab_size")
        target_vocab = self.target_cfg.get("vocab_size")
        where = str(self.draft.path / "config.json")
        if vocab is not None and target_vocab is not None and int(vocab) != int(target_vocab):
            self.add("vocab-size", "error", f"{where}: vocab_size",
                     f"the draft's vocab_size {vocab} != the target's {target_vocab}",
                     "use the draft trained for this target's tokenizer")
        draft_vocab = cfg.get("draft_vocab_size")
        if draft_vocab is None or vocab is None or int(draft_vocab) == int(vocab):
            return
        d2t = self.draft.shapes.get("d2t")
        if d2t is None:
            self.add("vocab-map", "error", str(self.draft.path),
                     f"draft_vocab_size {draft_vocab} != vocab_size {vocab} but the weights have no d2t map: draft "
                     "token i would be read as target token i",
                     "export d2t (and t2d) with the draft (SpecForge: vocab_mapping.pt)")
        elif d2t != [int(draft_vocab)]:
            self.add("vocab-map", "error", str(self.draft.path),
                     f"d2t has shape {d2t}, expected [{draft_vocab}] (draft_vocab_size)", "re-export the vocab map")
        if "t2d" not in self.draft.shapes:
            severity = "error" if self.engine == "local" else "info"
            self.add("vocab-map", severity, str(self.draft.path),
                     "the weights have d2t but no t2d (SGLang ignores t2d; the local engine needs it)",
                     "export t2d with the draft")

    # -- all --------------------------------------------------------------------------------------------

    def run(self) -> list[Finding]:
        self.check_algorithm()
        self.check_location()
        self.check_vocab()
        self.check_draft_tokens()
        ids, conv, where = self.fed_ids()
        uses_aux = not self.settings.is_baseline and self.settings.speculative_algorithm == "EAGLE3"
        if ids is not None and uses_aux and self.check_ids(ids, conv, where) and self.check_fc_width(ids, where):
            self.check_wiring(ids, conv, where)
        space = self.spec.space.get(WIRING_SETTING)
        for i, choice in enumerate(space.choices or [] if space else []):
            if isinstance(choice, list):
                w = f"{self.src}: space.{WIRING_SETTING}.choices[{i}]"
                if self.check_ids(choice, "sglang", w):
                    self.check_fc_width(choice, w)
        for i, wiring in enumerate(self.spec.standalone.wirings):
            if wiring.layer_ids is not None:
                w = f"{self.src}: standalone.wirings[{i}].layer_ids"
                if self.check_ids(wiring.layer_ids, "sglang", w):
                    self.check_fc_width(wiring.layer_ids, w)
        self.check_dump()
        order = {s: i for i, s in enumerate(SEVERITIES)}
        return sorted(self.findings, key=lambda f: order[f.severity])


def diagnose(spec: Spec, sglang_version: str | None = None) -> list[Finding]:
    """All findings for ``spec`` (errors first)."""
    return Doctor(spec, sglang_version).run()


def summary(findings: list[Finding]) -> dict[str, Any]:
    counts = {s: sum(f.severity == s for f in findings) for s in SEVERITIES}
    return {"ok": counts["error"] == 0, "counts": counts, "findings": [f.to_json() for f in findings]}
