"""The ground floor: the pipeline's vocabulary, errors, settings, metrics, small helpers.
Imports nothing above it."""
