"""The dependencies (Redis, Triton, the in-process fallback ranker), each behind a circuit
breaker, their errors mapped into the service's own here."""
