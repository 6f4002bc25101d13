"""Whether one Triton knows this process's shared-memory region, kept true across its restarts.

A Triton that restarts forgets every region registered with it. Until the region is known
to be registered again, rows go inline over gRPC (which a restarted Triton answers at once)
while one registration runs beside the requests, so the first call after a restart succeeds
as a plain one would, and the calls after it use the region again. Nothing here waits on a
request's path.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any, Protocol

from tritonclient.utils import InferenceServerException

from app.clients.shared_memory import InputSlots

log = logging.getLogger(__name__)

# Between two attempts while Triton does not take the region (it is down, or restarting).
RETRY_S = 0.25
ATTEMPT_TIMEOUT_S = 2.0
_KNOWN_ALREADY = "StatusCode.ALREADY_EXISTS"


class RegionClient(Protocol):
    async def register_system_shared_memory(
        self, name: str, key: str, byte_size: int, offset: int = 0, **kwargs: Any
    ) -> Any: ...

    async def unregister_system_shared_memory(self, name: str = "", **kwargs: Any) -> Any: ...


def region_unknown(exc: InferenceServerException) -> bool:
    """Triton's answer to an input in a region it does not hold (it restarted since)."""
    return "unable to find shared memory region" in str(exc.message()).lower()


class Registration:
    """One region and whether the Triton behind `client` holds it now."""

    def __init__(self, client: RegionClient, slots: InputSlots) -> None:
        self._client = client
        self.slots = slots
        self.registered = False
        self._attempt: asyncio.Task[None] | None = None
        self._next_attempt = 0.0

    async def register(self, timeout_s: float) -> None:
        """Register now (at start-up); raises InferenceServerException when Triton refuses."""
        slots = self.slots
        try:
            await self._client.register_system_shared_memory(
                slots.name, slots.key, slots.byte_size, client_timeout=timeout_s
            )
        except InferenceServerException as exc:
            if str(exc.status()) != _KNOWN_ALREADY:
                raise
        self.registered = True

    def lost(self) -> None:
        """Triton may have forgotten the region (it answered so, or could not be reached)."""
        if self.registered:
            log.info("shared-memory region %s to be registered again", self.slots.name)
        self.registered = False
        self.renew()

    def renew(self) -> None:
        """Start one registration in the background unless one runs or ran just now."""
        now = time.monotonic()
        if self.registered or self._attempt is not None or now < self._next_attempt:
            return
        self._next_attempt = now + RETRY_S
        self._attempt = asyncio.get_running_loop().create_task(
            self._renew(), name=f"register {self.slots.name}"
        )

    async def _renew(self) -> None:
        try:
            await self.register(ATTEMPT_TIMEOUT_S)
            log.info("shared-memory region %s registered again", self.slots.name)
        except InferenceServerException:
            pass  # not back yet: the next call tries again after RETRY_S
        finally:
            self._attempt = None

    async def close(self) -> None:
        if self._attempt is not None:
            self._attempt.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._attempt
        if self.registered:
            with contextlib.suppress(InferenceServerException):
                await self._client.unregister_system_shared_memory(
                    self.slots.name, client_timeout=1.0
                )
        self.slots.close()
