"""The names whose values may be written in clear: NCCL's documented variables, SGLang's and vLLM's
own variables and the engines' flags. Every other name's value is a secret to
:mod:`bisect_eagle.tracking.redact`.

The engines' names are shipped in ``engine_names.json`` (SGLang 0.5.23, vLLM 0.32.0), read from the
engines' code by the functions below: SGLang's variables are the fields of ``Envs`` in
``sglang/srt/environ.py`` (those it marks ``secret=True`` left out), vLLM's the keys of
``environment_variables`` in ``vllm/envs.py``; SGLang's flags come from its own parser, vLLM's from
the ``add_argument`` calls and frontend dataclasses of ``vllm/engine/arg_utils.py`` and
``vllm/entrypoints/launchers/cli_args.py``. ``tests/tracking/test_allowlist.py`` keeps the table
equal to what the installed engines hold. The table, not the engine found at run time, decides: what
is written (and a spec's stored identity) is the same on every machine.
"""

from __future__ import annotations

import ast
import json
from functools import cache
from pathlib import Path

TABLE = Path(__file__).with_name("engine_names.json")

# fmt: off
NCCL_VARIABLES = frozenset({
    "NCCL_SOCKET_IFNAME", "NCCL_SOCKET_FAMILY", "NCCL_SOCKET_RETRY_CNT",
    "NCCL_SOCKET_RETRY_SLEEP_MSEC", "NCCL_SOCKET_POLL_TIMEOUT_MSEC", "NCCL_SOCKET_NTHREADS",
    "NCCL_NSOCKS_PERTHREAD", "NCCL_CROSS_NIC", "NCCL_IB_HCA", "NCCL_IB_TIMEOUT",
    "NCCL_IB_RETRY_CNT", "NCCL_IB_GID_INDEX", "NCCL_IB_ADDR_FAMILY", "NCCL_IB_ADDR_RANGE",
    "NCCL_IB_ROCE_VERSION_NUM", "NCCL_IB_SL", "NCCL_IB_TC", "NCCL_IB_FIFO_TC",
    "NCCL_IB_RETURN_ASYNC_EVENTS", "NCCL_IB_DISABLE", "NCCL_IB_AR_THRESHOLD",
    "NCCL_IB_QPS_PER_CONNECTION", "NCCL_IB_SPLIT_DATA_ON_QPS", "NCCL_IB_CUDA_SUPPORT",
    "NCCL_IB_PCI_RELAXED_ORDERING", "NCCL_IB_ADAPTIVE_ROUTING", "NCCL_IB_ECE_ENABLE",
    "NCCL_IB_MERGE_NICS", "NCCL_IB_MERGE_VFS", "NCCL_IB_ROUTABLE_FLID_GID_INDEX",
    "NCCL_IB_DATA_DIRECT", "NCCL_IB_PKEY", "NCCL_IB_USE_INLINE", "NCCL_OOB_NET_ENABLE",
    "NCCL_OOB_NET_IFNAME", "NCCL_UID_STAGGER_THRESHOLD", "NCCL_UID_STAGGER_RATE", "NCCL_NET",
    "NCCL_NET_PLUGIN", "NCCL_TUNER_PLUGIN", "NCCL_PROFILER_PLUGIN", "NCCL_ENV_PLUGIN",
    "NCCL_IGNORE_CPU_AFFINITY", "NCCL_CONF_FILE", "NCCL_HOSTID", "NCCL_DEBUG", "NCCL_DEBUG_FILE",
    "NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_TIMESTAMP_FORMAT", "NCCL_DEBUG_TIMESTAMP_LEVELS",
    "NCCL_COLLNET_ENABLE", "NCCL_COLLNET_NODE_THRESHOLD", "NCCL_CTA_POLICY", "NCCL_NETDEVS_POLICY",
    "NCCL_TOPO_FILE", "NCCL_TOPO_DUMP_FILE", "NCCL_SET_THREAD_NAME", "NCCL_P2P_DISABLE",
    "NCCL_P2P_LEVEL", "NCCL_P2P_DIRECT_DISABLE", "NCCL_SHM_DISABLE", "NCCL_BUFFSIZE",
    "NCCL_NTHREADS", "NCCL_MAX_NCHANNELS", "NCCL_MIN_NCHANNELS", "NCCL_MAX_CTAS", "NCCL_MIN_CTAS",
    "NCCL_CHECKS_DISABLE", "NCCL_CHECK_POINTERS", "NCCL_LAUNCH_MODE", "NCCL_NET_GDR_LEVEL",
    "NCCL_IB_GDR_LEVEL", "NCCL_NET_GDR_C2C", "NCCL_NET_GDR_READ", "NCCL_NET_SHARED_BUFFERS",
    "NCCL_NET_SHARED_COMMS", "NCCL_SINGLE_RING_THRESHOLD", "NCCL_LL_THRESHOLD",
    "NCCL_TREE_THRESHOLD", "NCCL_ALGO", "NCCL_PROTO", "NCCL_NVB_DISABLE", "NCCL_PXN_DISABLE",
    "NCCL_P2P_PXN_LEVEL", "NCCL_RUNTIME_CONNECT", "NCCL_GRAPH_REGISTER", "NCCL_LOCAL_REGISTER",
    "NCCL_LEGACY_CUDA_REGISTER", "NCCL_WIN_ENABLE", "NCCL_SET_STACK_SIZE",
    "NCCL_GRAPH_MIXING_SUPPORT", "NCCL_DMABUF_ENABLE", "NCCL_P2P_NET_CHUNKSIZE",
    "NCCL_P2P_LL_THRESHOLD", "NCCL_P2P_NVL_CHUNKSIZE", "NCCL_P2P_PCI_CHUNKSIZE",
    "NCCL_P2P_READ_ENABLE", "NCCL_P2P_USE_CUDA_MEMCPY", "NCCL_ALLOC_P2P_NET_LL_BUFFERS",
    "NCCL_COMM_BLOCKING", "NCCL_CUMEM_ENABLE", "NCCL_CUMEM_HOST_ENABLE", "NCCL_NET_OVERHEAD",
    "NCCL_NVLS_ENABLE", "NCCL_NVLS_NCHANNELS", "NCCL_NVLS_CHUNKSIZE", "NCCL_NCHANNELS_PER_NET_PEER",
    "NCCL_MNNVL_ENABLE", "NCCL_MNNVL_UUID", "NCCL_MNNVL_CLIQUE_ID", "NCCL_RAS_ENABLE",
    "NCCL_RAS_ADDR", "NCCL_RAS_TIMEOUT_FACTOR", "NCCL_WORK_FIFO_BYTES",
    "NCCL_COMM_SPLIT_SHARE_RESOURCES", "NCCL_NVLSTREE_MAX_CHUNKSIZE", "NCCL_SHM_USE_CUDA_MEMCPY",
    "NCCL_SHM_MEMCPY_MODE", "NCCL_SHM_LOCALITY", "NCCL_PROXY_APPEND_BATCH_SIZE",
    "NCCL_CREATE_THREAD_CONTEXT", "NCCL_PROGRESS_APPENDOP_FREQ",
    "NCCL_NVLINK_UTIL_CENTRIC_SCHED_ENABLE",
})
# fmt: on
"""NCCL's variables as its user guide documents them (docs.nvidia.com/deeplearning/nccl,
"Environment Variables": system configuration and debugging, up to NCCL 2.28). Only names NCCL
documents belong here: a name such as ``NCCL_PASSPHRASE`` is no NCCL variable, and its value is
hashed like any unknown one."""

EARLIER_FLAGS = frozenset({"--cuda-graph-max-bs"})
"""Flags of earlier releases that the project still takes and renames (SGLang before 0.5.23:
``--cuda-graph-max-bs``, now ``--cuda-graph-max-bs-decode``)."""


@cache
def table() -> dict[str, dict[str, list[str]]]:
    """The shipped table: ``{"sglang"|"vllm": {"version": ..., "env": [...], "flags": [...]}}``.

    Returns:
        The table as stored in ``engine_names.json``.
    """
    return json.loads(TABLE.read_text())


@cache
def harmless_env() -> frozenset[str]:
    """Variables whose values are written in clear: NCCL's and both engines' own.

    Returns:
        The variable names.
    """
    engines = table()
    return NCCL_VARIABLES | frozenset(name for kind in engines.values() for name in kind["env"])


@cache
def harmless_flags() -> frozenset[str]:
    """Both engines' flags (and :data:`EARLIER_FLAGS`), as ``--name``.

    Returns:
        The flag names.
    """
    return EARLIER_FLAGS | frozenset(flag for kind in table().values() for flag in kind["flags"])


def sglang_env_names(source: str) -> set[str]:
    """SGLang's variables in the text of ``sglang/srt/environ.py``: the fields of ``class Envs``
    that are ``Env…(...)`` calls, without those marked ``secret=True``, with their deprecated
    aliases.

    Args:
        source: the file's text.

    Returns:
        The variable names.
    """
    names: set[str] = set()
    envs = next(
        n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == "Envs"
    )
    for node in envs.body:
        if not (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Call)
            and isinstance(node.value.func, ast.Name)
            and node.value.func.id.startswith("Env")
        ):
            continue
        keywords = {k.arg: k.value for k in node.value.keywords}
        secret = keywords.get("secret")
        if isinstance(secret, ast.Constant) and secret.value is True:
            continue
        names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        alias = keywords.get("deprecated_name")
        if alias is None and len(node.value.args) > 1:
            alias = node.value.args[1]
        if isinstance(alias, ast.Constant) and isinstance(alias.value, str):
            names.add(alias.value)
    return names


def vllm_env_names(source: str) -> set[str]:
    """vLLM's variables in the text of ``vllm/envs.py``: the keys of its ``environment_variables``
    mapping.

    Args:
        source: the file's text.

    Returns:
        The variable names.
    """
    for node in ast.parse(source).body:
        target = (
            node.target
            if isinstance(node, ast.AnnAssign)
            else (node.targets[0] if isinstance(node, ast.Assign) else None)
        )
        if (
            isinstance(target, ast.Name)
            and target.id == "environment_variables"
            and isinstance(node.value, ast.Dict)
        ):
            return {
                k.value
                for k in node.value.keys
                if isinstance(k, ast.Constant) and isinstance(k.value, str)
            }
    raise ValueError("no environment_variables mapping in vllm/envs.py")


def vllm_flags(sources: list[str]) -> set[str]:
    """vLLM's flags in the text of ``vllm/engine/arg_utils.py`` and
    ``vllm/entrypoints/launchers/cli_args.py``: every ``--`` string passed to ``add_argument``, and
    ``--field-name`` for each field of the frontend dataclasses (``BaseFrontendArgs``,
    ``FrontendArgs``), which vLLM's parser adds one flag each.

    Args:
        sources: the files' texts.

    Returns:
        The flags, as ``--name``.
    """
    flags: set[str] = set()
    for source in sources:
        for node in ast.walk(ast.parse(source)):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "add_argument"
            ):
                flags |= {
                    a.value
                    for a in node.args
                    if isinstance(a, ast.Constant)
                    and isinstance(a.value, str)
                    and a.value.startswith("--")
                }
            elif isinstance(node, ast.ClassDef) and node.name in (
                "BaseFrontendArgs",
                "FrontendArgs",
            ):
                flags |= {
                    "--" + f.target.id.replace("_", "-")
                    for f in node.body
                    if isinstance(f, ast.AnnAssign) and isinstance(f.target, ast.Name)
                }
    return flags
