"""``python -m bisect_eagle.engines.serve``: the stand-in server (see the package docstring)."""

import sys

from bisect_eagle.engines.serve.app import main

sys.exit(main())
