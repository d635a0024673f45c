"""Torch device names given by a user, checked before anything is loaded onto them."""

from __future__ import annotations

import torch

from bisect_eagle.errors import BadInput

KINDS = ("cpu", "cuda", "mps")


def check_device(device: str, where: str) -> None:
    """Refuse a device this machine cannot run on; ``where`` names its source (``spec.yaml:
    engine.settings.device``).

    Args:
        device: the device name as the user wrote it. Accepted: ``cpu``; ``cuda`` or ``cuda:N`` when
            CUDA is available with more than N devices; ``mps`` when available.
        where: the source of the name, opening the error line.

    Raises:
        BadInput: anything else, one line naming ``where``.
    """
    if not isinstance(device, str):
        raise BadInput(
            f"{where}: device {device!r} is not a device name (expected one of cpu, cuda, cuda:N, "
            "mps)"
        )
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError):
        raise BadInput(
            f"{where}: device {device!r} is not a torch device (expected one of cpu, cuda, cuda:N, "
            "mps)"
        ) from None
    if parsed.type not in KINDS:
        raise BadInput(
            f"{where}: device {device!r} is not supported (expected one of cpu, cuda, cuda:N, mps)"
        )
    if parsed.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise BadInput(f"{where}: device {device!r} but CUDA is not available on this machine")
        if parsed.index is not None and parsed.index >= count:
            raise BadInput(
                f"{where}: device {device!r} but this machine has {count} CUDA device(s) "
                f"(cuda:0..cuda:{count - 1})"
            )
    if parsed.type == "mps" and not torch.backends.mps.is_available():
        raise BadInput(f"{where}: device {device!r} but MPS is not available on this machine")
