"""Rerank's selectors: boost, category cap, backfill, diversity, one file each."""
