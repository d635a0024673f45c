"""Static checks of a spec before any GPU time is spent (see :mod:`.core`), and the throughput split
of a logged study (:mod:`.split`)."""

from bisect_eagle.doctor.core import (
    Doctor,
    Finding,
    by_severity,
    diagnose,
    installed_sglang,
    summary,
)
from bisect_eagle.doctor.model import DraftInfo, read_draft
from bisect_eagle.doctor.split import split_finding

__all__ = [
    "Doctor",
    "DraftInfo",
    "Finding",
    "by_severity",
    "diagnose",
    "installed_sglang",
    "read_draft",
    "split_finding",
    "summary",
]
