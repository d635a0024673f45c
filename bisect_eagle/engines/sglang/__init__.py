"""The ``sglang`` engine: one SGLang server per live trial, planned and checked by the installed
SGLang itself.

Modules: :mod:`.planner` (the trial plan), :mod:`.oracle` / :mod:`.oracle_script` (SGLang's own
parser and resolution, run in SGLang's interpreter), :mod:`.flags` (executables, flag lists,
renames), :mod:`.launch` (argv, environment, per-trial draft copy), :mod:`.client` (HTTP),
:mod:`.readback` (``/server_info`` and metrics), :mod:`.failures` (failure classes), :mod:`.engine`
(the trial itself), :mod:`.export` (a logged trial's launch, for ``bisect-eagle export``).
"""

from bisect_eagle.engines.sglang.engine import SglangEngine
from bisect_eagle.engines.sglang.failures import classify_failure

__all__ = ["SglangEngine", "classify_failure"]
