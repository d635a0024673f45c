"""In-process EAGLE-3 speculative decoding (chain drafts, ``topk = 1``) over a Hugging Face causal
LM target.

Token bookkeeping (``x`` = prompt + generated tokens, ``c = len(x) - 1``): the target's KV cache
always holds positions ``0 .. c-1``, i.e. every token but the last; the draft has seen rows ``0 ..
c-1``, where row ``t`` is ``fc(aux_t)`` (the target's captured states at position ``t``) with token
``x[t+1]`` at position ``t``, as EAGLE-3 trains
(:meth:`~bisect_eagle.artifacts.draft.Eagle3Draft.ttt_forward`). A prefill runs the target over all
prompt tokens but the last; then each round

1. extends the draft by the rows it has not seen; its last row drafts ``d_1``;
2. chains: ``(own pre-norm state, d_k)`` at the next position drafts ``d_{k+1}``, up to
   ``num_steps`` drafts;
3. verifies ``[x_c, d_1 .. d_s]`` in one target forward, which also captures the new aux states;
4. accepts the longest prefix with ``d_i`` equal to the target's greedy token, emits it plus the
   target's next (bonus) token, crops the target cache to the accepted tokens and drops the draft's
   chain keys.

Every generated token comes from a verify step, so ``sum(accepted_per_step) == len(tokens)``. The
output is the target's own greedy continuation whatever the draft proposes: a wrong wiring only
lowers acceptance.

``speculative_algorithm = "EAGLE"`` with an EAGLE-3 draft is run the way SGLang runs it
(docs/sglang-facts.md#algorithm-names):
the draft gets the target's final (post-norm) hidden state, 1 × H wide, and ``fc`` is skipped
because the width already matches; acceptance collapses to about 1 token per verify step.

**Pinned acceptance** (:class:`Pin`): each round still drafts ``s`` tokens and verifies ``s + 1`` in
one target forward, so the cost of a round is a natural round's; only how many drafts count as
accepted is drawn from the pin's unconditional profile with its seeded generator (position ``k``
accepted with probability ``rate_k / rate_{k-1}`` once ``k - 1`` was). Which tokens are emitted
depends on whether the pin holds the request's greedy continuation (``reference``):

- with it (the local engine): the verify forward is fed the continuation in place of the draft's
  proposals (the draft's forwards still run, their tokens unused) and the emitted tokens are the
  target's own greedy tokens, so the output is the natural trial's token for token; a position where
  the target disagrees with the continuation (numerics) is never accepted;
- without it (a server, which cannot know a request's continuation before decoding it): the accepted
  drafts are emitted as proposed and the bonus token is the target's, as SGLang's
  ``SGLANG_SIMULATE_ACC_TOKEN_MODE= real-draft-token`` does; the output then differs from the greedy
  one after the first draft accepted against the target.

``cycle_delay_s`` adds a wait to every target forward, inside the model clock: the stand-in server's
documented cost-side fault (:mod:`bisect_eagle.engines.serve`).
"""

from __future__ import annotations

import inspect
import random
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from bisect_eagle.artifacts import layers
from bisect_eagle.artifacts.draft import LoadedDraft
from bisect_eagle.artifacts.target import capture_hidden, decoder_layers
from bisect_eagle.errors import BadInput
from bisect_eagle.keys import IDS_KEY

ALGORITHMS = ("EAGLE3", "EAGLE")


@dataclass(kw_only=True)
class Generation:
    """One request's output and its speculative-decoding counters."""

    tokens: list[int]  # generated token ids (prompt excluded)
    # target forwards after prefill that produced tokens (SGLang's spec_verify_ct)
    verify_steps: int
    accepted_per_step: list[int]  # per verify step: tokens emitted = accepted drafts + 1 bonus
    model_s: float  # seconds inside target + draft forwards
    finished_by_eos: bool
    # per verify step: drafts proposed and judged
    drafted_per_step: list[int] = field(default_factory=list)


@dataclass(kw_only=True)
class Pin:
    """Pinned acceptance for one request (module docstring): the unconditional profile, a seeded
    generator and, where known, the request's greedy continuation (its tokens are then emitted
    unchanged)."""

    rates: list[float]  # unconditional P(drafts 0..k accepted), non-increasing
    rng: random.Random
    reference: list[int] | None = None

    @classmethod
    def seeded(
        cls, rates: list[float], input_ids: list[int], reference: list[int] | None = None
    ) -> Pin:
        """A pin whose draws depend only on the prompt: the same request draws the same acceptances
        on every engine and every run.

        Args:
            rates: the unconditional profile, P(drafts 0..k accepted), non-increasing.
            input_ids: the prompt's token ids (they seed the generator).
            reference: the request's greedy continuation; None when not known.

        Returns:
            The pin.
        """
        return cls(
            rates=list(rates),
            rng=random.Random("pinned:" + ",".join(map(str, input_ids))),
            reference=reference,
        )

    def draw(self, drafted: int) -> int:
        """How many of ``drafted`` leading drafts this round accepts."""
        n, previous = 0, 1.0
        while n < min(drafted, len(self.rates)):
            rate = self.rates[n]
            if rate <= 0 or (rate < previous and self.rng.random() >= rate / previous):
                break
            n, previous = n + 1, rate
        return n

    def verified(self, done: int, drafts: list[int]) -> list[int]:
        """The tokens to verify after ``done`` emitted ones: the continuation's next ``len(drafts)``
        where it has them (the draft's own proposals past its end), or the drafts when there is no
        continuation.

        Args:
            done: tokens emitted so far.
            drafts: the draft's proposals for the next positions.

        Returns:
            As many tokens as ``drafts``.
        """
        if self.reference is None:
            return drafts
        ahead = self.reference[done : done + len(drafts)]
        return ahead + drafts[len(ahead) :]


class SpeculativeDecoder:
    """Greedy decoding of a target, sped up by an EAGLE-3 draft (``draft=None``: the target alone).

    ``layer_ids`` are SGLang-convention ids (-1 = embedding; None = the draft's own ids), captured
    and concatenated in ascending order like SGLang; ``algorithm="EAGLE"`` runs SGLang's EAGLE path
    (module doc).
    """

    def __init__(
        self,
        target_model,
        draft: LoadedDraft | None,
        layer_ids: list[int] | None,
        num_steps: int,
        device: str = "cpu",
        algorithm: str = "EAGLE3",
        cycle_delay_s: float = 0.0,
    ):
        self.target = target_model
        self.cycle_delay_s = cycle_delay_s
        self.draft = draft.model if draft is not None else None
        self.num_steps = num_steps if draft is not None else 0
        self.device = torch.device(device)
        # SGLang's EAGLE path with an EAGLE-3 draft
        self.skip_fc = algorithm == "EAGLE" and draft is not None
        self.num_layers = len(decoder_layers(target_model))
        self.hidden_size = int(target_model.config.hidden_size)
        self._cache_kw = (
            "cache"
            if "cache" in inspect.signature(target_model.forward).parameters
            else "past_key_values"
        )
        if algorithm not in ALGORITHMS:
            raise BadInput(
                f"speculative_algorithm {algorithm!r} is not supported here; expected one of "
                f"{ALGORITHMS}"
            )
        if draft is not None and num_steps < 1:
            raise BadInput(f"num_steps must be >= 1 for speculative decoding, got {num_steps}")
        self.layer_ids = self._resolve_ids(draft, layer_ids)
        self.indices = self._capture_indices()
        if draft is not None:
            self._check_draft(draft)

    # -- setup
    # ------------------------------------------------------------------------------------------

    def _resolve_ids(
        self, draft: LoadedDraft | None, layer_ids: list[int] | None
    ) -> list[int] | None:
        """SGLang-convention ids in capture (ascending) order; the draft's own ids when none are
        given."""
        if self.skip_fc:
            return []
        if layer_ids is None:
            if draft is None:
                return None
            return layers.canonical_to_ids(
                draft.aux_indices(self.num_layers), "sglang", num_layers=self.num_layers
            )
        if len(set(layer_ids)) != len(layer_ids):
            raise BadInput(f"{IDS_KEY} {layer_ids} repeats an id; each layer is captured once")
        ids = sorted(layer_ids)
        try:
            layers.ids_to_canonical(ids, "sglang", num_layers=self.num_layers)
        except layers.LayerIdError as e:
            raise BadInput(f"{IDS_KEY} {layer_ids}: {e}") from None
        return ids

    def _capture_indices(self) -> list[int]:
        """Canonical hidden_states indices the target's hooks capture for the draft."""
        if self.skip_fc:
            return [self.num_layers]  # the final state, normed in _aux like the target's own output
        return layers.ids_to_canonical(self.layer_ids or [], "sglang", num_layers=self.num_layers)

    def _check_draft(self, draft: LoadedDraft) -> None:
        """Refuse a draft whose vocabulary or input width cannot take this target's captured
        states."""
        c = draft.config
        if c.vocab_size != self.target.config.vocab_size:
            raise BadInput(
                f"{draft.path}: draft vocab_size {c.vocab_size} != target vocab_size "
                f"{self.target.config.vocab_size}"
            )
        if self.skip_fc:
            if c.hidden_size != self.hidden_size:
                raise BadInput(
                    f"{draft.path}: speculative_algorithm EAGLE feeds the draft the target's final "
                    f"state ({self.hidden_size} wide) but the draft is {c.hidden_size} wide"
                )
            return
        fc_in = self.draft.fc_in_features
        width, rest = divmod(fc_in, self.hidden_size)
        if rest:
            raise BadInput(
                f"{draft.path}: fc takes {fc_in} inputs, not a multiple of the target hidden size "
                f"{self.hidden_size}"
            )
        refusal = layers.fc_width_refusal(
            self.layer_ids or [],
            width=width,
            where=str(draft.path),
            said_by=f"fc.weight: {fc_in} inputs = {width} × target hidden size {self.hidden_size}",
        )
        if refusal is not None:
            raise BadInput(refusal)

    # -- model calls
    # ------------------------------------------------------------------------------------

    @contextmanager
    def _clock(self, acc: list[float]) -> Iterator[None]:
        """Add the seconds spent inside the block (device work included) to ``acc[0]``."""
        start = time.perf_counter()
        yield
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        acc[0] += time.perf_counter() - start

    def _target_forward(self, ids: torch.Tensor, cache, keep: int = 0) -> torch.Tensor:
        """Logits [T, V] (the last ``keep`` rows when keep > 0) of ``ids`` [1, T] continuing
        ``cache``."""
        out = self.target(
            input_ids=ids, use_cache=True, logits_to_keep=keep, **{self._cache_kw: cache}
        )
        if self.cycle_delay_s > 0:
            time.sleep(self.cycle_delay_s)
        return out.logits[0]

    def _aux(self, got: dict[int, torch.Tensor]) -> torch.Tensor:
        """The draft's input states [1, T, k·H] from the last target forward's captures."""
        if self.skip_fc:
            return self.target.model.norm(got[self.num_layers])
        return torch.cat([got[i] for i in self.indices], dim=-1)

    def _new_cache(self):
        """An empty KV cache for the target (cropped on rollback)."""
        from transformers import DynamicCache

        return DynamicCache(config=self.target.config)

    # -- public
    # -----------------------------------------------------------------------------------------

    @torch.inference_mode()
    def aux_hidden_states(self, input_ids: list[int]) -> torch.Tensor:
        """[T, k·H] concatenated captured aux states of a prompt, in ascending id order (like
        SGLang).

        Args:
            input_ids: the prompt's token ids.

        Returns:
            A ``[len(input_ids), k·H]`` tensor on the decoder's device.

        Raises:
            BadInput: the decoder has no aux layers to capture.
        """
        if not self.indices:
            raise BadInput("no aux layers to capture: give layer_ids or a draft")
        ids = torch.tensor([input_ids], device=self.device)
        with capture_hidden(self.target, self.indices) as got:
            self.target(input_ids=ids, logits_to_keep=1)
            return self._aux(got)[0]

    @torch.inference_mode()
    def generate(
        self,
        input_ids: list[int],
        *,
        max_new_tokens: int,
        eos_token_id: int | None = None,
        pin: Pin | None = None,
    ) -> Generation:
        """Greedy continuation of ``input_ids``: at most ``max_new_tokens`` tokens, stopping after
        EOS; with ``pin`` (speculative decoding only) acceptance is drawn from its profile (module
        docstring).

        Args:
            input_ids: the prompt's token ids (at least one).
            max_new_tokens: the most tokens to emit.
            eos_token_id: the token that ends the generation; None never stops early.
            pin: pinned acceptance for this request; None decodes naturally.

        Returns:
            The emitted tokens with the per-step accepted and drafted counts.

        Raises:
            BadInput: an empty prompt, or ``pin`` without a draft.
        """
        if not input_ids:
            raise BadInput("generate needs at least one prompt token")
        if self.draft is None:
            if pin is not None:
                raise BadInput(
                    "pinned acceptance needs a draft: the target alone accepts no drafts"
                )
            return self._generate_plain(input_ids, max_new_tokens, eos_token_id)
        return self._generate_spec(input_ids, max_new_tokens, eos_token_id, pin)

    # -- decode loops
    # -----------------------------------------------------------------------------------

    def _generate_plain(self, input_ids: list[int], max_new: int, eos: int | None) -> Generation:
        """Baseline: prefill the whole prompt, then one target forward per token."""
        model_s = [0.0]
        cache = self._new_cache()
        out: list[int] = []
        ids = torch.tensor([input_ids], device=self.device)
        while len(out) < max_new:
            with self._clock(model_s):
                token = int(self._target_forward(ids, cache, keep=1)[-1].argmax())
            out.append(token)
            if token == eos:
                break
            ids = torch.tensor([[token]], device=self.device)
        n = len(out)
        return Generation(
            tokens=out,
            verify_steps=n,
            accepted_per_step=[1] * n,
            model_s=model_s[0],
            finished_by_eos=bool(out) and out[-1] == eos,
            drafted_per_step=[0] * n,
        )

    def _generate_spec(
        self, input_ids: list[int], max_new: int, eos: int | None, pin: Pin | None
    ) -> Generation:
        """Speculative rounds as in the module docstring, the last round drafting no more than
        fits."""
        model_s = [0.0]
        chain = DraftChain(
            self.draft, len(input_ids) + max_new + self.num_steps, self.device, self.skip_fc
        )
        cache = self._new_cache()
        out: list[int] = []
        accepted: list[int] = []
        drafted: list[int] = []
        last = input_ids[-1]
        with capture_hidden(self.target, self.indices) as got:
            pending_aux, pending_tokens = None, input_ids[1:]
            if len(input_ids) > 1:
                with self._clock(model_s):
                    self._target_forward(
                        torch.tensor([input_ids[:-1]], device=self.device), cache, keep=1
                    )
                    pending_aux = self._aux(got)
            while len(out) < max_new:
                steps = (
                    min(self.num_steps, max_new - len(out) - 1) if pending_aux is not None else 0
                )
                with self._clock(model_s):
                    drafts = chain.propose(pending_aux, pending_tokens, steps=steps)
                if pin is not None:
                    drafts = pin.verified(len(out), drafts)
                verify_ids = torch.tensor([[last, *drafts]], device=self.device)
                with self._clock(model_s):
                    greedy = self._target_forward(verify_ids, cache).argmax(-1).tolist()
                n = _accepted_prefix(drafts, greedy)
                if pin is not None:
                    drawn = pin.draw(len(drafts))
                    n = drawn if pin.reference is None else min(drawn, n)
                if n < len(drafts):
                    cache.crop(n - len(drafts))
                pending_aux = self._aux(got)[:, : n + 1]
                emitted = [*drafts[:n], greedy[n]]
                pending_tokens, last = emitted, emitted[-1]
                if eos is not None and eos in emitted:
                    emitted = emitted[: emitted.index(eos) + 1]
                out.extend(emitted)
                accepted.append(len(emitted))
                drafted.append(len(drafts) if len(emitted) == n + 1 else len(emitted) - 1)
                if emitted[-1] == eos:
                    break
        return Generation(
            tokens=out,
            verify_steps=len(accepted),
            accepted_per_step=accepted,
            model_s=model_s[0],
            finished_by_eos=bool(out) and out[-1] == eos,
            drafted_per_step=drafted,
        )


def _accepted_prefix(drafts: list[int], greedy: list[int]) -> int:
    """How many leading drafts equal the target's greedy tokens."""
    n = 0
    while n < len(drafts) and drafts[n] == greedy[n]:
        n += 1
    return n


class DraftChain:
    """The draft's KV cache as preallocated tensors, and its extend + chain drafting for one
    request.

    Extended rows' keys stay; the chain's keys sit above them and are overwritten by the next
    extend, which is the rollback.
    """

    def __init__(self, draft, capacity: int, device: torch.device, skip_fc: bool):
        c = draft.config
        dtype = draft.fc.weight.dtype
        self.draft = draft
        self.k = torch.empty(
            1, c.num_key_value_heads, capacity, c.head_dim, device=device, dtype=dtype
        )
        self.v = torch.empty_like(self.k)
        # extended rows = keys kept; chain keys live above them until the next rollback
        self.rows = 0
        self.device = device
        self.skip_fc = skip_fc

    def _attend(self, hidden: torch.Tensor, tokens: torch.Tensor, start: int) -> torch.Tensor:
        """Cache the keys of rows at positions ``start..`` (same slots); the last row's pre-norm h
        [1, 1, H].

        Keys depend only on a row's own inputs (one layer), and only the last row's output drafts,
        so the other rows skip attention and the MLP; the last row sees every cached key, so no mask
        is needed.
        """
        t = tokens.shape[1]
        positions = torch.arange(start, start + t, device=self.device)[None]
        residual, q, k, v = self.draft.pre_attention(hidden, tokens, positions=positions)
        self.k[:, :, start : start + t] = k
        self.v[:, :, start : start + t] = v
        end = start + t
        return self.draft.post_attention(
            residual[:, -1:], q[:, :, -1:], k=self.k[:, :, :end], v=self.v[:, :, :end], mask=None
        )

    def _pick(self, h: torch.Tensor) -> int:
        """The draft's greedy token (target vocabulary) from a pre-norm state [1, 1, H]."""
        return int(self.draft.to_target_ids(self.draft.logits(h[0, 0]).argmax()))

    def propose(self, aux: torch.Tensor | None, tokens: list[int], *, steps: int) -> list[int]:
        """Extend by rows (aux [1, T, ·], their next tokens) if ``steps`` > 0, then draft ``steps``
        tokens."""
        if steps == 0:
            return []
        hidden = aux if self.skip_fc else self.draft.project(aux)
        ids = torch.tensor([tokens], device=self.device)
        h = self._attend(hidden, ids, self.rows)
        self.rows += len(tokens)
        drafts = [self._pick(h)]
        for k in range(1, steps):
            h = self._attend(h, torch.tensor([[drafts[-1]]], device=self.device), self.rows - 1 + k)
            drafts.append(self._pick(h))
        return drafts


def accept_rates(gens: list[Generation], num_steps: int) -> list[float]:
    """Per draft position k: P(draft k accepted | drafts before it accepted), over the drafts
    judged."""
    reached, passed = [0] * num_steps, [0] * num_steps
    for g in gens:
        for emitted, drafted in zip(g.accepted_per_step, g.drafted_per_step, strict=True):
            for k in range(min(drafted, emitted)):
                reached[k] += 1
                passed[k] += k < emitted - 1
    return [p / r if r else float("nan") for p, r in zip(passed, reached, strict=True)]
