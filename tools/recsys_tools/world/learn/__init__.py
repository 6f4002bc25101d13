"""Learning from a log: factors, neighbours, features, the pre-rank weights, the blend."""
