"""The one spelling of the key that names the draft's aux hidden-state layer ids.

``eagle_aux_hidden_state_layer_ids`` is at once a key of a draft's ``config.json`` (top level, or
under ``eagle_config``), a live setting, a key of a plan's effective settings and of a trial's
logged parameters, and the word messages use for the ids. Every layer says it, the throughput
model included, so it lives here, below them all; ``tests/test_architecture.py`` keeps it the only
string that spells it.
"""

IDS_KEY = "eagle_aux_hidden_state_layer_ids"
