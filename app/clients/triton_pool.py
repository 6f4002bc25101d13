"""Several Triton endpoints as one ranking model: each call tries them in turn."""

from __future__ import annotations

import time

import numpy as np
import numpy.typing as npt

from app.clients.ranking_model import RankingModelClient
from app.core.errors import FailureKind, RankingModelError
from app.release.plan import ModelAnswer, Routed
from app.world.schema import ModelSignature

# Failures that come at once, leaving time to ask another endpoint.
_FAST_FAILURES = frozenset({FailureKind.UNAVAILABLE, FailureKind.CIRCUIT_OPEN})


class TritonPool:
    """Several Triton endpoints serving the same model; each request goes to one that is up.

    Requests take the endpoints in turn, skipping one whose breaker is open until its probe
    is due. A call that fails at once (unavailable, breaker open) moves on to the next endpoint
    while time is left; a timeout does not, since it has used the time up. With one endpoint
    this is that endpoint.
    """

    def __init__(self, endpoints: list[RankingModelClient]) -> None:
        if not endpoints:
            raise ValueError("a pool needs at least one Triton endpoint")
        self.endpoints = endpoints
        self._next = 0

    def _turn(self) -> list[RankingModelClient]:
        start = self._next
        self._next = (self._next + 1) % len(self.endpoints)
        rotated = self.endpoints[start:] + self.endpoints[:start]
        up = [endpoint for endpoint in rotated if endpoint.breaker.available()]
        return up or rotated[:1]  # all open: the first fails fast and the answer falls back

    async def score(
        self,
        rows: npt.NDArray[np.float32],
        routed: Routed,
        timeout_s: float,
        request_id: str,
        guarded: bool = True,
    ) -> ModelAnswer:
        deadline = time.monotonic() + timeout_s
        failure: RankingModelError | None = None
        for endpoint in self._turn():
            left = deadline - time.monotonic()
            if failure is not None and left <= 0:
                break
            try:
                return await endpoint.score(rows, routed, left, request_id, guarded)
            except RankingModelError as exc:
                if exc.kind not in _FAST_FAILURES:
                    raise
                failure = exc
        assert failure is not None
        raise failure

    async def ready_signature(
        self, timeout_s: float = 1.0, version: str | None = None
    ) -> ModelSignature:
        """The signature of the first endpoint whose model is ready; UNAVAILABLE when none is."""
        failure: RankingModelError | None = None
        for endpoint in self.endpoints:
            try:
                return await endpoint.ready_signature(timeout_s, version)
            except RankingModelError as exc:
                failure = exc
        assert failure is not None
        raise failure

    async def close(self) -> None:
        for endpoint in self.endpoints:
            await endpoint.close()
