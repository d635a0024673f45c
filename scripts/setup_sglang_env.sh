#!/usr/bin/env bash
# SGLang 0.5.23 in an environment of its own (.sglang-venv), without a CUDA torch, so that its argument parser
# and settings resolution (the oracle of every sglang-engine plan) run on a CPU machine: CI and the tests.
#
#   bash scripts/setup_sglang_env.sh            # then: .sglang-venv/bin/python has sglang 0.5.23
#
# On a GPU node SGLang is installed the normal way (pip install sglang, or its container) and bisect-eagle is
# pointed at it with engine.sglang.python / --sglang-python. Here:
# - sglang is installed with --no-deps, plus the few pure-Python packages its server_args import needs;
# - torch, transformers, pydantic, ... come from the project's .venv (CPU torch) through a .pth file;
# - GPU-only modules that server_args imports (triton, torchvision, tvm_ffi, ...) are stubbed by
#   tests/sglang_env/gpu_stubs.py, loaded by a second .pth file: exactly those modules, nothing else.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
[ -x .venv/bin/python ] || { echo "setup_sglang_env.sh: run the README's install first (.venv missing)" >&2; exit 2; }
python3 -m venv .sglang-venv
# the release the planner is tested with: engines/sglang/rules.py TESTED_SGLANG, pyproject's [sglang] extra
.sglang-venv/bin/pip install -q --no-deps sglang==0.5.23 orjson msgspec pybase64 setproctitle pyzmq xxhash dill \
  einops openai sniffio partial-json-parser
site="$(.sglang-venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
project_site="$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
printf '%s\n%s\n' "$project_site" "$root/tests/sglang_env" > "$site/bisect_eagle_borrow.pth"
echo "import gpu_stubs" > "$site/zz_bisect_eagle_gpu_stubs.pth"
.sglang-venv/bin/python -c 'import importlib.metadata as m, sglang.srt.server_args; print("sglang", m.version("sglang"), "parser ok")'
