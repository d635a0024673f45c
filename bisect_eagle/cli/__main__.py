"""``python -m bisect_eagle.cli`` runs the same command line as ``bisect-eagle``."""

from bisect_eagle.cli import main

main()
