"""Static checks of a spec before any GPU time is spent (see :mod:`.core`)."""

from bisect_eagle.doctor.core import Doctor, Finding, diagnose, installed_sglang, summary
from bisect_eagle.doctor.model import DraftInfo, read_draft

__all__ = ["Doctor", "DraftInfo", "Finding", "diagnose", "installed_sglang", "read_draft", "summary"]
