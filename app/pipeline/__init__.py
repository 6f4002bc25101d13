"""The /recommend pipeline: the request context, the stage order (recommend.py), the stages."""
