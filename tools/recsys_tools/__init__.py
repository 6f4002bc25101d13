"""The operator's tools around the server: worlds, Redis loading, the local stack, host checks."""
