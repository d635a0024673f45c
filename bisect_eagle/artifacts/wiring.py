"""Wiring rules: which dumped tensors, in which order, feed the draft's ``fc``.

Grammar (over a dump's list of states, whose last entry is the final state):

* a Python slice: ``[:-1]`` (speculators' ``standardize_data_v1``), ``[1:]``, ``[0:3]``, ``[::2]``;
* an index list: ``[0,1,2]``, ``[0,-2]``;
* ``emb`` inside a list: the embedding output of the sample's tokens, from the target's table:
  ``[emb,0,1]``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from bisect_eagle.errors import BadInput

EMB = "emb"
_SLICE = re.compile(r"^\[\s*(-?\d*)\s*:\s*(-?\d*)\s*(?::\s*(-?\d*)\s*)?\]$")
_LIST = re.compile(r"^\[\s*((?:emb|-?\d+)(?:\s*,\s*(?:emb|-?\d+))*)\s*\]$")


class WiringError(BadInput):
    """A rule that does not parse, or that does not fit the dump or the draft."""


@dataclass(frozen=True)
class Rule:
    """A parsed rule; ``select`` resolves it against a dump with ``n`` states."""

    text: str
    items: tuple[int | str, ...] | None = None  # index list (may contain EMB)
    bounds: tuple[int | None, int | None, int | None] | None = None  # slice

    def select(self, n: int) -> list[int | str]:
        """Resolved items: non-negative state indices, or ``EMB``.

        Args:
            n: the number of states in a dump sample (the last one the final state).

        Returns:
            The items in rule order: indices in ``[0, n)`` (negative ones taken from the end), and
            ``EMB`` where the rule names the embedding; a slice may give an empty list.

        Raises:
            WiringError: a listed index outside ``[-n, n)``.
        """
        if self.bounds is not None:
            return list(range(n))[slice(*self.bounds)]
        out: list[int | str] = []
        for item in self.items or ():
            if item == EMB:
                out.append(EMB)
                continue
            i = int(item)
            if not -n <= i < n:
                raise WiringError(f"rule {self.text}: index {i} is outside a dump of {n} states")
            out.append(i % n)
        return out

    def apply(
        self,
        states: list[torch.Tensor],
        input_ids: torch.Tensor,
        *,
        embed: torch.Tensor | None,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The selected states of one sample side by side: the fc input [S, k·H] (float32).

        Args:
            states: the sample's dumped states, each [S, H], the final state last.
            input_ids: the sample's tokens [S] (used only for ``emb``).
            embed: the target's embedding table [V, H]; needed only when the rule uses ``emb``.
            out: a preallocated ``[rows, k·H]`` tensor; its rows are filled from the first ``rows``
                positions, with no copies in between. None: a new [S, k·H] float32 tensor.

        Returns:
            The fc input (``out`` itself when given), the selected states side by side in rule
            order.

        Raises:
            WiringError: an index outside the sample's states, or ``emb`` without ``embed``.
        """
        chosen = self.select(len(states))
        hidden = states[0].shape[-1]
        if out is None:
            out = torch.empty(input_ids.shape[0], len(chosen) * hidden)
        rows = out.shape[0]
        for j, item in enumerate(chosen):
            if item == EMB:
                if embed is None:
                    raise WiringError(
                        f"rule {self.text} uses emb but no target embedding table was given"
                    )
                part = embed[input_ids[:rows]]
            else:
                part = states[int(item)][:rows]
            out[:, j * hidden : (j + 1) * hidden] = part
        return out


def parse_rule(text: str) -> Rule:
    """Parse a rule string, or raise :class:`WiringError` saying what the grammar allows.

    Args:
        text: the rule as written (the module docstring's grammar); spaces are ignored.

    Returns:
        The rule, its text normalized (spaces removed).

    Raises:
        WiringError: text that does not parse, or a slice step of zero.
    """
    t = text.strip().replace(" ", "")
    m = _SLICE.match(t)
    if m:
        a, b, c = (int(g) if g not in (None, "") else None for g in m.groups())
        if c == 0:
            raise WiringError(f"rule {text!r}: slice step cannot be zero")
        return Rule(t, bounds=(a, b, c))
    m = _LIST.match(t)
    if m:
        items = tuple(EMB if x == EMB else int(x) for x in m.group(1).split(","))
        return Rule(t, items=items)
    raise WiringError(
        f"rule {text!r} does not parse; expected a slice like [:-1] or [1:], an index list like "
        "[0,1,2], or a list with the embedding like [emb,0,1]"
    )


def check_width(rule: Rule, n_states: int, *, hidden: int, fc_in: int) -> list[int | str]:
    """Resolve ``rule`` and check it yields exactly ``fc_in`` features.

    Args:
        rule: the parsed rule.
        n_states: the number of states in a dump sample.
        hidden: the dump's hidden size H (the target's).
        fc_in: the draft's ``fc`` input width (aux count × target hidden size).

    Returns:
        The selection (:meth:`Rule.select`), ``fc_in // hidden`` items long.

    Raises:
        WiringError: an index outside the dump, ``fc_in`` not a multiple of ``hidden``, or a rule
            selecting another number of tensors than ``fc`` takes.
    """
    chosen = rule.select(n_states)
    if fc_in % hidden:
        raise WiringError(
            f"fc expects {fc_in} inputs, not a multiple of the dump's hidden size {hidden}"
        )
    need = fc_in // hidden
    if len(chosen) != need:
        raise WiringError(
            f"fc expects {need} × {hidden} = {fc_in} inputs; rule {rule.text} gives {len(chosen)} "
            f"tensors = {len(chosen) * hidden}"
        )
    return chosen
