"""How likely each candidate breaking set is, given the probes: a posterior, as flake-aware culprit
finding gives.

A set ``S`` of changes is a *minimal breaking set* when ``S`` applied to the good configuration is
truly below the limit and ``S`` without any one of its changes is not. Each configuration's chance
of being truly below the limit is its prior updated by its samples:

- **The prior** (:func:`prior_bad`) comes from what was known before the first probe: each change
  has a prior chance :data:`BASE_PRIOR` of breaking the good configuration, :data:`FLAGGED_PRIOR`
  when ``doctor`` flags the setting in the bad configuration or the plans show it masked (hidden at
  one end by another setting: the incident's shape); a configuration's prior is the chance that at
  least one of its changes breaks it (``1 − Π (1 − p_c)``). The good configuration itself is the
  reference: never below it.
- **The evidence** (:class:`~bisect_eagle.bisect.judge.Verdict` ``p_below``): with a flat prior on
  the log-ratio ``d`` to the limit, the samples give ``q = P(d < 0 | samples)`` (Student's t
  posterior). A prior ``π`` spread over each side of the limit as the flat one is updates to
  posterior odds ``π/(1 − π) · q/(1 − q)``. A deterministic or replayed verdict is certain (``q`` 0
  or 1); a configuration never judged keeps its prior.
- **A set's probability** is ``P(S below) · Π_x (1 − P(S − {x} below))``: the configurations are
  measured apart, so their errors are taken as independent (they share the reference's samples,
  which this ignores).

Standard library only.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

BASE_PRIOR = 0.2  # a change's prior chance of breaking the good configuration
FLAGGED_PRIOR = 0.6  # ... when doctor flags it or the plans show it masked
# evidence is clipped to [CERTAIN, 1 − CERTAIN]: a posterior is never exactly 0 or 1 from samples
CERTAIN = 1e-9


def prior_bad(config: Iterable[str], priors: Mapping[str, float]) -> float:
    """The prior chance that ``config`` (changes applied to the good configuration) is below the
    limit.

    Args:
        config: the changes applied.
        priors: each change's prior chance of breaking it (missing: :data:`BASE_PRIOR`).
    """
    keep = 1.0
    for name in config:
        keep *= 1 - priors.get(name, BASE_PRIOR)
    return 1 - keep


def posterior_bad(prior: float, p_below: float | None) -> float:
    """The chance that a configuration is below the limit: ``prior`` updated by the samples'
    ``p_below`` (the flat- prior posterior; None: not judged, the prior stands)."""
    if p_below is None or prior <= 0 or prior >= 1:
        return prior
    q = min(max(p_below, CERTAIN), 1 - CERTAIN)
    odds = prior / (1 - prior) * q / (1 - q)
    return odds / (1 + odds)


def set_probability(
    changes: Iterable[str],
    below: Mapping[frozenset[str], float | None],
    priors: Mapping[str, float],
) -> float:
    """The posterior chance that ``changes`` is a minimal breaking set (module docstring).

    Args:
        changes: the candidate set.
        below: each judged configuration's ``p_below`` (None where it could not be judged).
        priors: each change's prior chance of breaking the good configuration.
    """
    s = frozenset(changes)

    def bad(config: frozenset[str]) -> float:
        """The posterior chance that ``config`` breaks the good configuration.

        Args:
            config: the changes applied to the good configuration (empty: the good configuration).

        Returns:
            A probability; 0.0 for the empty set (the reference).
        """
        if not config:
            return 0.0  # the good configuration: the reference
        return posterior_bad(prior_bad(config, priors), below.get(config))

    p = bad(s)
    for name in s:
        p *= 1 - bad(s - {name})
    return p


def change_priors(names: Iterable[str], flagged: Iterable[str]) -> dict[str, float]:
    """Each change's prior: :data:`FLAGGED_PRIOR` for the flagged ones (doctor's findings, masks),
    else
    :data:`BASE_PRIOR`."""
    marked = set(flagged)
    return {n: FLAGGED_PRIOR if n in marked else BASE_PRIOR for n in names}
