"""The EAGLE-3 draft: its network (:mod:`.model`), its config.json (:mod:`.config`) and its
checkpoints (:mod:`.checkpoint`). Everything a caller needs is importable from
``bisect_eagle.artifacts.draft``."""

from bisect_eagle.artifacts.draft.checkpoint import (
    DraftCheck,
    DraftLoadError,
    LoadedDraft,
    TensorHeader,
    expected_shapes,
    init_weights,
    inspect_draft,
    load_draft,
    read_headers,
    save_draft,
    target_embedding,
)
from bisect_eagle.artifacts.draft.config import (
    DraftConfig,
    DraftConfigFile,
    parse_draft_config,
    read_draft_config,
)
from bisect_eagle.artifacts.draft.model import (
    DraftAttention,
    DraftLayer,
    DraftMLP,
    Eagle3Draft,
    RMSNorm,
    rope,
)

__all__ = [
    "DraftAttention",
    "DraftCheck",
    "DraftConfig",
    "DraftConfigFile",
    "DraftLayer",
    "DraftLoadError",
    "DraftMLP",
    "Eagle3Draft",
    "LoadedDraft",
    "RMSNorm",
    "TensorHeader",
    "expected_shapes",
    "init_weights",
    "inspect_draft",
    "load_draft",
    "parse_draft_config",
    "read_headers",
    "read_draft_config",
    "rope",
    "save_draft",
    "target_embedding",
]
