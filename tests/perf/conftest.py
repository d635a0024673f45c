"""Perf tests import the planted synthetic engine (``synthetic_engine.py``) that sits next to
them."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
