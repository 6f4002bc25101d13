"""Recipes that make a whole world: the demo world, a world from an interaction log."""
