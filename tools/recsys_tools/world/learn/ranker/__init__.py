"""The ranking model: its network, and its training on generated or logged interactions."""
