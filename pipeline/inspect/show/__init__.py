"""``seam show``: one rollout as the model saw it (model.py: what; load.py: from where; terminal.py, html.py: drawn)."""
