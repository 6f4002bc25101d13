"""Reading what an operator hands the builder: logs, item and user tables, in their formats."""
