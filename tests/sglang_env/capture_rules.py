"""Run in SGLang's interpreter: what each model family's own ``set_eagle3_layers_to_capture`` captures.

Prints one JSON object: ``{model_type: {"ids as JSON": layers_to_capture, "null": default}}`` for a grid of
id lists on a target of ``N`` layers (argv[1]). The method is SGLang's own, called on a minimal stand-in
for the model object (its ``pp_group``, ``config`` and ``model`` attributes: all the method reads).
"""

from __future__ import annotations

import importlib
import json
import sys
from types import SimpleNamespace

FAMILIES = {  # model_type -> (module, class) that SGLang 0.5.23 serves it with
    "llama": ("sglang.srt.models.llama", "LlamaForCausalLM"),
    "qwen2": ("sglang.srt.models.qwen2", "Qwen2ForCausalLM"),
    "qwen3": ("sglang.srt.models.qwen3", "Qwen3ForCausalLM"),
    "glm4_moe": ("sglang.srt.models.glm4_moe", "Glm4MoeForCausalLM"),
    "glm_moe_dsa": ("sglang.srt.models.glm4_moe", "GlmMoeDsaForCausalLM"),
    "glm4_moe_lite": ("sglang.srt.models.glm4_moe_lite", "Glm4MoeLiteForCausalLM"),
    "deepseek_v2": ("sglang.srt.models.deepseek_v2", "DeepseekV2ForCausalLM"),
    "deepseek_v3": ("sglang.srt.models.deepseek_v2", "DeepseekV3ForCausalLM"),
    "deepseek_v32": ("sglang.srt.models.deepseek_v2", "DeepseekV32ForCausalLM"),
    "gpt_oss": ("sglang.srt.models.gpt_oss", "GptOssForCausalLM"),
}


def captured(cls, ids, n: int):
    me = SimpleNamespace(pp_group=SimpleNamespace(is_last_rank=True), config=SimpleNamespace(num_hidden_layers=n),
                         model=SimpleNamespace(layers_to_capture=None), capture_aux_hidden_states=False)
    cls.set_eagle3_layers_to_capture(me, ids)
    return list(me.model.layers_to_capture)


def main() -> None:
    n = int(sys.argv[1])
    grid = [None, [1, n // 2 - 1, n - 4], [2, n // 2, n - 3], [3, n // 2 + 1, n - 2], [-1, 2, n // 2],
            [0, 5, 9], [2, n // 2, n - 1], [2, n // 2, n], [5, 1, 9]]
    out = {}
    for model_type, (module, name) in FAMILIES.items():
        cls = getattr(importlib.import_module(module), name)
        out[model_type] = {json.dumps(ids): captured(cls, ids, n) for ids in grid}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
