"""What produced a run: MLflow's source tags (user, commit, tool), the environment's versions, host
and GPUs, and a cheap digest of an input file or folder."""

from __future__ import annotations

import contextlib
import functools
import getpass
import hashlib
import platform
import socket
import subprocess
from importlib import metadata
from pathlib import Path

PACKAGES = ("bisect-eagle", "torch", "transformers", "optuna", "mlflow", "sglang")


@functools.cache
def _git_sha() -> str:
    repo = Path(__file__).resolve().parents[2]
    try:
        out = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
        dirty = subprocess.run(
            ["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    if out.returncode != 0:
        return "unknown (no commit)"
    return out.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def source_tags() -> dict[str, str]:
    """MLflow's own source tags for every run: who ran it, from which commit, with which tool."""
    tags = {"mlflow.source.name": "bisect-eagle", "mlflow.source.type": "LOCAL"}
    with contextlib.suppress(KeyError, OSError):
        tags["mlflow.user"] = getpass.getuser()
    sha = _git_sha()
    if not sha.startswith("unknown"):
        tags["mlflow.source.git.commit"] = sha.removesuffix("-dirty")
    return tags


def path_digest(path: Path) -> str:
    """A short digest of a file or folder's names, sizes and modification times (cheap; not its
    bytes)."""
    h = hashlib.sha256()
    files = sorted(path.rglob("*")) if path.is_dir() else [path]
    for f in files:
        with contextlib.suppress(OSError):
            st = f.stat()
            name = f.relative_to(path) if path.is_dir() else f.name
            h.update(f"{name}:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()[:16]


def environment_info() -> dict[str, str]:
    """Versions, git sha, host and GPUs, as parent-run params.

    Returns:
        ``python``, ``host``, ``platform``, ``git_sha``, ``version.<package>`` (``not installed``
        where absent; SGLang left out then), ``gpus`` (``none`` without CUDA) and ``cuda``.
    """
    info = {
        "python": platform.python_version(),
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "git_sha": _git_sha(),
    }
    for pkg in PACKAGES:
        try:
            info[f"version.{pkg}"] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            if pkg != "sglang":
                info[f"version.{pkg}"] = "not installed"
    import torch

    if torch.cuda.is_available():
        names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        info["gpus"] = ", ".join(names)
        info["cuda"] = str(torch.version.cuda)
    else:
        info["gpus"] = "none"
    return info
