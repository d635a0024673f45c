"""Which target layer did each dumped (or server-captured) hidden state come from?

The target runs (transformers, hooks from :func:`~bisect_eagle.artifacts.target.capture_hidden`) on
the dump's own ``input_ids``; every canonical index ``0..N`` is a candidate, plus the final state
after the target's final norm (SpecForge dumps store it normed, speculators' legacy dumps pre-norm;
docs/sglang-facts.md#final-state-norm). Per token, the cosine similarity says whether the directions
agree and the norm ratio (dumped / candidate) whether the scales do; a dumped tensor is matched to
the candidate with the smallest mean relative error ``||x - y|| / ||x||``, which is small only when
both agree (cosine alone cannot tell the final
state from its normed copy: RMSNorm keeps most of the direction). The runner-up's relative error
over the best's is the separation; the first values let a person check by eye. A server that returns
its captured aux states (``return_hidden_states``) is matched the same way, chunk by chunk.

From the matches: the SGLang ids to write under ``eagle_config.eagle_aux_hidden_state_layer_ids``
and the wiring rule over the dump that feeds the draft the layers its config names.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
import torch
import torch.nn.functional as F

from bisect_eagle.artifacts import layers
from bisect_eagle.artifacts.draft import LoadedDraft
from bisect_eagle.artifacts.dumps import DumpReader, Sample
from bisect_eagle.artifacts.target import capture_hidden
from bisect_eagle.errors import BadInput
from bisect_eagle.keys import IDS_KEY

ID_CONVENTIONS = ("sglang", "vllm", "specforge")
FIRST_VALUES = 4


@dataclass
class LayerCandidate:
    """A target state a tensor may match: canonical ``index``, optionally after the final norm."""

    index: int
    normed: bool = False

    def label(self, num_layers: int) -> str:
        """How a report names this candidate.

        Args:
            num_layers: the target's number of layers (to describe ``index``).

        Returns:
            ``final (post-norm)``, or ``hs[index]`` followed by the layer's description.
        """
        return (
            "final (post-norm)"
            if self.normed
            else f"hs[{self.index}] {layers.describe(self.index, num_layers)}"
        )


@dataclass
class Match:
    """One dumped or captured tensor and the target state it matches best."""

    source: str  # "dump" or "server"
    position: int  # index in the dump's state list, or the server's chunk index
    role: str  # "aux" or "final" (dump), "aux" (server)
    index: int  # canonical hidden_states index of the best match
    normed: bool  # the best match is the final state after the final norm
    label: str
    similarity: float  # mean per-token cosine similarity with the best match
    norm_ratio: float  # mean per-token norm: tensor / best match
    error: float  # mean per-token relative error ||x - y|| / ||x|| against the best match
    runner_up: str
    runner_up_similarity: float
    runner_up_error: float
    ids: dict[str, int | None]  # the best match as a layer id of each convention (None: no such id)
    first_values: list[float]  # first values of the tensor (first token)
    target_first_values: list[float]  # first values of the best match (first token)

    @property
    def separation(self) -> float:
        """How many times farther the runner-up is than the best match (relative error ratio)."""
        return self.runner_up_error / max(self.error, 1e-12)


@dataclass
class Fingerprint:
    """All matches and what they imply."""

    num_layers: int
    samples: int
    tokens: int
    matches: list[Match]
    recommended: dict
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        """The fingerprint as plain data (``bisect-eagle fingerprint --json``).

        Returns:
            Every field by name, each match with its ``separation`` added.
        """
        out = asdict(self)
        for m, d in zip(self.matches, out["matches"], strict=True):
            d["separation"] = m.separation
        return out


class Scores:
    """Running per-token sums (cosine, norm ratio, relative error) of tensors against all
    candidates."""

    def __init__(self, tensors: int, candidates: int):
        self.cos = torch.zeros(tensors, candidates, dtype=torch.float64)
        self.ratio = torch.zeros_like(self.cos)
        self.error = torch.zeros_like(self.cos)
        self.tokens = 0

    def add(self, tensors: list[torch.Tensor], candidates: torch.Tensor) -> None:
        """``tensors``: each [T, H]; ``candidates``: [C, T, H].

        Args:
            tensors: the dumped or captured tensors of one sample, each [T, H] (T tokens, H hidden).
            candidates: every candidate target state of the same tokens, [C, T, H].
        """
        cand_norm = candidates.norm(dim=-1).clamp_min(1e-12)
        for j, t in enumerate(tensors):
            t = t.float()
            norm = t.norm(dim=-1).clamp_min(1e-12)[None]
            self.cos[j] += F.cosine_similarity(t[None], candidates, dim=-1).sum(-1).double()
            self.ratio[j] += (norm / cand_norm).sum(-1).double()
            self.error[j] += ((t[None] - candidates).norm(dim=-1) / norm).sum(-1).double()
        self.tokens += candidates.shape[1]

    def means(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.cos / self.tokens, self.ratio / self.tokens, self.error / self.tokens


def candidates_for(num_layers: int) -> list[LayerCandidate]:
    return [
        *(LayerCandidate(i) for i in range(num_layers + 1)),
        LayerCandidate(num_layers, normed=True),
    ]


@torch.inference_mode()
def target_states(model, input_ids: torch.Tensor) -> torch.Tensor:
    """[N + 2, T, H]: canonical states 0..N of one sequence, then the final state after the final
    norm."""
    n = len(model.model.layers)
    with capture_hidden(model, range(n + 1)) as got:
        model(input_ids=input_ids[None].to(model.device))
    states = [got[i][0].float().cpu() for i in range(n + 1)]
    states.append(model.model.norm(got[n])[0].float().cpu())
    return torch.stack(states)


def _ids(c: LayerCandidate, num_layers: int) -> dict[str, int | None]:
    out: dict[str, int | None] = {}
    for conv in ID_CONVENTIONS:
        try:
            out[conv] = (
                None if c.normed else layers.from_canonical(c.index, conv, num_layers=num_layers)
            )
        except layers.LayerIdError:
            out[conv] = None
    return out


def _matches(
    source: str,
    roles: list[str],
    scores: Scores,
    cands: list[LayerCandidate],
    num_layers: int,
    first: list[torch.Tensor],
    states: torch.Tensor,
) -> list[Match]:
    """Best and runner-up candidate of each tensor from the accumulated scores."""
    out = []
    cos, ratio, error = scores.means()
    for j, role in enumerate(roles):
        order = error[j].argsort().tolist()
        b, r = order[0], order[1]
        best, second = cands[b], cands[r]
        out.append(
            Match(
                source=source,
                position=j,
                role=role,
                index=best.index,
                normed=best.normed,
                label=best.label(num_layers),
                similarity=float(cos[j, b]),
                norm_ratio=float(ratio[j, b]),
                error=float(error[j, b]),
                runner_up=second.label(num_layers),
                runner_up_similarity=float(cos[j, r]),
                runner_up_error=float(error[j, r]),
                ids=_ids(best, num_layers),
                first_values=[round(float(v), 4) for v in first[j][0, :FIRST_VALUES]],
                target_first_values=[round(float(v), 4) for v in states[b, 0, :FIRST_VALUES]],
            )
        )
    return out


def match_dump(model, reader: DumpReader, *, samples: int) -> tuple[list[Match], int, int, Sample]:
    """Matches of each of the dump's states over its first ``samples`` samples; also the first
    sample."""
    num_layers = len(model.model.layers)
    cands = candidates_for(num_layers)
    scores: Scores | None = None
    first_sample, first_states, seen = None, None, 0
    for sample in reader.head(samples):
        states = target_states(model, sample.input_ids)
        if scores is None:
            scores = Scores(len(sample.states), len(cands))
            first_sample, first_states = sample, states
        elif len(sample.states) != scores.cos.shape[0]:
            raise BadInput(
                f"{sample.source}: {len(sample.states)} hidden states, the first sample had "
                f"{scores.cos.shape[0]}"
            )
        _check_width(sample.states[0].shape[-1], states.shape[-1], str(sample.source))
        scores.add(sample.states, states)
        seen += 1
    if scores is None:
        raise BadInput(f"{reader.path}: no readable samples")
    roles = ["aux"] * (len(first_sample.states) - 1) + ["final"]
    found = _matches("dump", roles, scores, cands, num_layers, first_sample.states, first_states)
    return found, seen, scores.tokens, first_sample


def _check_width(got: int, hidden: int, where: str) -> None:
    if got != hidden:
        raise BadInput(
            f"{where}: hidden states are {got} wide but the target's hidden size is {hidden}"
        )


def fetch_server_states(
    url: str, input_ids: list[int], *, client: httpx.Client | None = None, timeout_s: float = 120.0
) -> torch.Tensor:
    """[T, k·H] aux states a running server captured for ``input_ids`` (``POST /generate``)."""
    body = {
        "input_ids": input_ids,
        "return_hidden_states": True,
        "sampling_params": {"max_new_tokens": 1, "temperature": 0},
    }
    endpoint = url.rstrip("/") + "/generate"
    own = client is None
    client = client or httpx.Client(timeout=timeout_s)
    try:
        response = client.post(endpoint, json=body)
    except httpx.HTTPError as e:
        raise BadInput(f"--server {url}: POST /generate failed ({type(e).__name__}: {e})") from None
    finally:
        if own:
            client.close()
    if response.status_code != 200:
        raise BadInput(
            f"--server {url}: POST /generate returned HTTP {response.status_code}: "
            f"{response.text[:200]}"
        )
    try:
        hidden = response.json()["meta_info"]["hidden_states"]
    except (ValueError, KeyError, TypeError):
        raise BadInput(
            f"--server {url}: the response has no meta_info.hidden_states (start the server with "
            "return of aux hidden states enabled)"
        ) from None
    t = torch.tensor(hidden, dtype=torch.float32)
    if t.dim() == 3 and t.shape[0] == 1:  # a batch of one
        t = t[0]
    if t.dim() != 2 or t.shape[0] != len(input_ids):
        raise BadInput(
            f"--server {url}: meta_info.hidden_states has shape {list(t.shape)}; expected "
            f"[{len(input_ids)}, k × hidden] for the {len(input_ids)} prompt tokens"
        )
    return t


def match_server(model, sample: Sample, *, captured: torch.Tensor) -> list[Match]:
    """Matches of each H-wide chunk of the server's captured states for ``sample``."""
    num_layers = len(model.model.layers)
    hidden = int(model.config.hidden_size)
    if captured.shape[-1] % hidden:
        raise BadInput(
            f"server hidden states are {captured.shape[-1]} wide, not a multiple of the target's "
            f"hidden size {hidden}"
        )
    chunks = list(captured.split(hidden, dim=-1))
    states = target_states(model, sample.input_ids)
    cands = candidates_for(num_layers)
    scores = Scores(len(chunks), len(cands))
    scores.add(chunks, states)
    return _matches("server", ["aux"] * len(chunks), scores, cands, num_layers, chunks, states)


def _rule_text(positions: list[int | str], n_states: int) -> str:
    if positions == list(range(n_states - 1)):
        return "[:-1]"
    if positions == list(range(1, n_states)):
        return "[1:]"
    return "[" + ",".join(str(p) for p in positions) + "]"


def draft_rule(dump: list[Match], draft_indices: list[int]) -> tuple[str | None, list[str]]:
    """The rule over the dump's states that yields the draft's aux layers in order, or None and why
    not."""
    positions: list[int | str] = []
    missing = []
    for index in draft_indices:
        found = [m.position for m in dump if m.index == index and not m.normed]
        if found:
            positions.append(found[0])
        elif index == 0:
            positions.append("emb")
        else:
            missing.append(index)
    if missing:
        return None, [
            f"no rule fits: the draft reads hs{draft_indices}, and the dump does not hold "
            f"{', '.join(f'hs[{i}]' for i in missing)}"
        ]
    return _rule_text(positions, len(dump)), []


def recommend(
    dump: list[Match],
    *,
    num_layers: int,
    draft: LoadedDraft | None,
    server: list[Match] | None = None,
) -> tuple[dict, list[str]]:
    """SGLang ids and the draft's wiring rule implied by the matches, with notes on what would go
    wrong."""
    aux = [m for m in dump if m.role == "aux"]
    notes = []
    final = dump[-1]
    if final.index != num_layers:
        notes.append(
            f"the dump's final state matches {final.label}, not the target's final state "
            f"hs[{num_layers}]"
        )
    if any(m.normed for m in aux):
        notes.append(
            "an aux state matches the post-norm final state; SGLang captures pre-norm states only"
        )
    indices = [m.index for m in aux if not m.normed]
    sglang_ids = layers.canonical_to_ids(indices, "sglang", num_layers=num_layers)
    if num_layers in indices:
        notes.append(
            f"SGLang id {num_layers - 1} (the final layer) is never captured by SGLang: it is "
            "silently dropped, so the draft would get fewer aux states than it was trained on"
        )
    if indices != sorted(indices):
        notes.append(
            "SGLang concatenates captured states in ascending layer order, not in the dump's order"
        )
    rec: dict = {
        IDS_KEY: sglang_ids,
        "hidden_states": indices,
        "rule": "[:-1]" if len(aux) == len(dump) - 1 else None,
    }
    if draft is not None:
        draft_indices = draft.aux_indices(num_layers)
        rec["draft_hidden_states"] = draft_indices
        rec["rule"], missing = draft_rule(dump, draft_indices)
        notes.extend(missing)
        if draft_indices != indices:
            notes.append(
                f"the draft's config names hs{draft_indices} but the dump's aux states are "
                f"hs{indices}: set {IDS_KEY} to {sglang_ids} if the draft was trained on this dump"
            )
    if server is not None:
        captured = [m.index for m in server]
        rec["server_hidden_states"] = captured
        if captured != sorted(indices):
            notes.append(
                f"the server captures hs{captured}, but the dump's aux states are "
                f"hs{sorted(indices)}"
            )
    return rec, notes


def match_layers(
    model,
    reader: DumpReader,
    *,
    samples: int = 4,
    draft: LoadedDraft | None = None,
    server_url: str | None = None,
    client: httpx.Client | None = None,
) -> Fingerprint:
    """Match a dump (and optionally a server's captures) to the layers of ``model``.

    Args:
        model: the target, a Llama-style causal LM
            (:func:`~bisect_eagle.artifacts.target.load_target`).
        reader: the dump's samples.
        samples: how many samples to match over (≥ 1).
        draft: the draft, to compare its configured layers with the dump's and derive its wiring
            rule; None: left out.
        server_url: a capture-only SGLang server's URL; its captures of the first sample are
            matched too. None: no server.
        client: the HTTP client for the server (for tests); None: a new one.

    Returns:
        Every dumped (and captured) tensor's best match, the ids and rule they imply, and notes on
        what would go wrong.

    Raises:
        BadInput: ``samples`` below 1, or a dump, server answer or draft that cannot be matched.
    """
    if samples < 1:
        raise BadInput(f"--samples must be >= 1, got {samples}")
    num_layers = len(model.model.layers)
    matches, seen, tokens, first = match_dump(model, reader, samples=samples)
    server = None
    if server_url is not None:
        captured = fetch_server_states(server_url, first.input_ids.tolist(), client=client)
        server = match_server(model, first, captured=captured)
        matches = [*matches, *server]
    dump = [m for m in matches if m.source == "dump"]
    rec, notes = recommend(dump, num_layers=num_layers, draft=draft, server=server)
    return Fingerprint(num_layers, seen, tokens, matches, rec, notes)


def load(target: Path, dump: Path, *, draft: Path | None):
    """(target model, dump reader, draft or None) for :func:`fingerprint`.

    Args:
        target: the target's Hugging Face directory.
        dump: the dump directory.
        draft: the draft directory; None: no draft.

    Returns:
        ``(model, reader, loaded)``: the target on the CPU, the dump's reader, and the loaded
        draft or None.

    Raises:
        BadInput: a dump directory without samples, a draft that does not load, or a target that
            does not (config, weights).
    """
    from bisect_eagle.artifacts.draft import load_draft
    from bisect_eagle.artifacts.target import load_target

    reader = DumpReader(dump)
    loaded = load_draft(draft, target=target) if draft is not None else None
    model, _ = load_target(target)
    return model, reader, loaded
