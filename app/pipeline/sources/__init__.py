"""Candidate sources: each adds the candidates it knows of that the sources before it lack."""
