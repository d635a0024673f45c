"""Searching deployments: :mod:`.space` (the search space), :mod:`.gate` (the stage-1 standalone
gate), :mod:`.study` (the staged Optuna search of ``bisect-eagle run``/``worker``) and
:mod:`.bisect` (finding which differences between a good and a bad config make it slow)."""
