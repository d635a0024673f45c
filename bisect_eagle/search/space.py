"""Stage 2's search space: spec parameters as Optuna suggestions, and sampled values as
:class:`LiveSettings`.

Optuna's categorical choices must be ``str``/``int``/``float``/``bool``/``None``, so list values
(layer-id lists) travel as strings like ``"1,5,9"`` and are decoded back; ``when`` conditions make a
parameter active only while other settings (searched, fixed, or at their defaults) hold one of the
listed values.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

from bisect_eagle.errors import BadInput
from bisect_eagle.spec.schema import Param, settings_from
from bisect_eagle.spec.settings import LiveSettings

ENUMERATION_LIMIT = 100_000


def encode(value: Any) -> Any:
    """A choice as Optuna stores it: lists become comma-joined strings, scalars stay as they are.

    Args:
        value: a setting value as the spec writes it (a layer-id list, a number, a string, ...).

    Returns:
        ``"1,5,9"`` for a list or tuple, ``value`` itself otherwise.
    """
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    return value


def flatten(values: dict[str, Any]) -> dict[str, Any]:
    """Nested ``env``/``server_args`` mappings as dotted names (``env.NCCL_ALGO``), other names
    unchanged."""
    out: dict[str, Any] = {}
    for name, value in values.items():
        if name in ("env", "server_args") and isinstance(value, dict):
            out.update({f"{name}.{k}": v for k, v in value.items()})
        else:
            out[name] = value
    return out


def _default(name: str) -> Any:
    field = LiveSettings.model_fields.get(name)
    return None if field is None else field.get_default(call_default_factory=True)


class SearchSpace:
    """The searched parameters in dependency order, over fixed settings."""

    def __init__(self, params: dict[str, Param], fixed: dict[str, Any], where: str):
        self.params = params
        self.fixed = flatten(fixed)
        self.where = where
        self.order = self._order()
        self._decode = {
            name: {encode(c): c for c in p.choices or []}
            for name, p in params.items()
            if p.type == "categorical"
        }
        for name, table in self._decode.items():
            if len(table) != len(params[name].choices or []):
                raise BadInput(
                    f"{where}: space.{name}.choices: a choice is listed twice "
                    f"({params[name].choices})"
                )

    def _order(self) -> list[str]:
        """Parameters sorted so that each comes after the searched settings its ``when`` reads."""
        order: list[str] = []
        pending = dict(self.params)
        while pending:
            ready = [n for n, p in pending.items() if all(o not in pending for o in p.when)]
            if not ready:
                raise BadInput(
                    f"{self.where}: space: the 'when' conditions of {sorted(pending)} form a cycle"
                )
            for n in ready:
                order.append(n)
                del pending[n]
        return order

    def _current(self, name: str, sampled: dict[str, Any]) -> Any:
        if name in sampled:
            return sampled[name]
        if name in self.fixed:
            return self.fixed[name]
        return _default(name)

    def active(self, name: str, sampled: dict[str, Any]) -> bool:
        """Whether ``name``'s conditions hold for the values chosen so far."""
        return all(
            self._current(other, sampled) in values
            for other, values in self.params[name].when.items()
        )

    def suggest(self, trial) -> dict[str, Any]:
        """Ask an Optuna trial for every active parameter; returns decoded values."""
        sampled: dict[str, Any] = {}
        for name in self.order:
            if not self.active(name, sampled):
                continue
            p = self.params[name]
            if p.type == "categorical":
                raw = trial.suggest_categorical(name, [encode(c) for c in p.choices or []])
                sampled[name] = self._decode[name][raw]
            elif p.type == "int":
                sampled[name] = trial.suggest_int(
                    name, int(p.low), int(p.high), step=int(p.step or 1), log=p.log
                )
            else:
                sampled[name] = trial.suggest_float(name, p.low, p.high, step=p.step, log=p.log)
        return sampled

    def decode(self, params: dict[str, Any]) -> dict[str, Any]:
        """Optuna's stored params of a trial back to setting values.

        Args:
            params: a trial's params as Optuna stores them (``trial.params``).

        Returns:
            The same names, categorical choices decoded (``"1,5,9"`` back to ``[1, 5, 9]``), other
            values unchanged.

        Raises:
            KeyError: a categorical value that is not one of the parameter's choices.
        """
        return {k: self._decode[k][v] if k in self._decode else v for k, v in params.items()}

    def settings(self, sampled: dict[str, Any]) -> LiveSettings:
        """Fixed settings overlaid with sampled values.

        Args:
            sampled: decoded values by setting name (:meth:`suggest`, :meth:`decode`).

        Returns:
            The validated settings.

        Raises:
            BadInput: a combination the settings schema refuses, naming the spec and the sample.
        """
        return settings_from({**self.fixed, **sampled}, f"{self.where}: sampled settings {sampled}")

    def values(self, name: str) -> list[Any] | None:
        """Every value a parameter can take, or None for a continuous range.

        Args:
            name: a searched parameter.

        Returns:
            The choices of a categorical parameter, ``low..high`` by ``step`` for an int or a float
            with a step; None for a float range without a step.
        """
        p = self.params[name]
        if p.type == "categorical":
            return list(p.choices or [])
        if p.type == "int":
            return list(range(int(p.low), int(p.high) + 1, int(p.step or 1)))
        if p.step is None:
            return None
        n = int(round((p.high - p.low) / p.step))
        return [p.low + i * p.step for i in range(n + 1)]

    def grid(self) -> dict[str, list[Any]]:
        """The full grid for Optuna's GridSampler (encoded choices)."""
        out = {}
        for name in self.order:
            vals = self.values(name)
            if vals is None:
                raise BadInput(
                    f"{self.where}: space.{name}: the grid sampler needs a 'step' for float ranges"
                )
            out[name] = [encode(v) for v in vals]
        return out

    def enumerate(self) -> Iterator[dict[str, Any]] | None:
        """Every combination of active parameters, or None when the space is continuous or too
        large."""
        sizes = [self.values(n) for n in self.order]
        if any(v is None for v in sizes):
            return None
        total = 1
        for v in sizes:
            total *= max(1, len(v))
        if total > ENUMERATION_LIMIT:
            return None
        return self._combos()

    def _combos(self) -> Iterator[dict[str, Any]]:
        seen = set()
        for combo in itertools.product(*(self.values(n) for n in self.order)):
            sampled: dict[str, Any] = {}
            for name, value in zip(self.order, combo, strict=True):
                if self.active(name, sampled):
                    sampled[name] = value
            key = repr(sorted(sampled.items()))
            if key not in seen:
                seen.add(key)
                yield sampled

    def describe(self) -> dict[str, Any]:
        """The space as plain data, for logging.

        Returns:
            Parameter name → its spec entry without defaults, in dependency order.
        """
        return {name: self.params[name].model_dump(exclude_defaults=True) for name in self.order}
