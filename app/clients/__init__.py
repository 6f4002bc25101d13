"""Thin clients of the service's dependencies; each maps its library's errors at the edge."""
