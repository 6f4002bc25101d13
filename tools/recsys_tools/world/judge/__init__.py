"""Judging worlds: the holdout evaluation, what a world would answer, ablations, measures."""
