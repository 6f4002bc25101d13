"""The operator's tools for the ranking model: `recsys model ...` (see command.py)."""
