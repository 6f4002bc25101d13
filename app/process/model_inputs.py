"""How the model's inputs reach Triton: through this host's shared memory where it can map
it, else inside the gRPC messages."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol

from app.clients.shared_memory import InputSlots, remove_stale_regions
from app.clients.triton_pool import TritonPool
from app.core.errors import ConfigError, RankingModelError
from app.core.settings import Settings
from app.process.startup_checks import STARTUP_CALL_TIMEOUT_S
from app.world.schema import FeatureSchema, ModelSignature

log = logging.getLogger(__name__)


class SharingEndpoint(Protocol):
    @property
    def url(self) -> str: ...

    async def use_shared_memory(self, slots: InputSlots, timeout_s: float) -> None: ...


class SharingPool(Protocol):
    @property
    def endpoints(self) -> Sequence[SharingEndpoint]: ...


async def share_memory(
    pool: SharingPool,
    schema: FeatureSchema,
    signature: ModelSignature,
    max_in_flight: int,
    required: bool,
) -> int:
    """A shared-memory region per endpoint that can map it: a slot per chunk the worker may
    have in flight. Returns how many endpoints use one; the others are sent plain gRPC,
    unless shared memory is `required`."""
    removed = remove_stale_regions()
    if removed:
        log.info("removed %d shared-memory regions of processes now gone", len(removed))
    slot_bytes = signature.max_batch_size * schema.width * 4
    sharing = 0
    for endpoint in pool.endpoints:
        slots = InputSlots(2 * max_in_flight, slot_bytes)
        try:
            await endpoint.use_shared_memory(slots, STARTUP_CALL_TIMEOUT_S)
        except RankingModelError as exc:
            slots.close()
            if required:
                raise ConfigError(
                    f"Triton at {endpoint.url} cannot use this host's shared memory ({exc}): "
                    "set RECSYS_TRITON_SHARED_MEMORY=auto or off unless Triton runs here, "
                    "sharing /dev/shm"
                ) from None
            log.info("Triton at %s gets model inputs by gRPC: %s", endpoint.url, exc)
            continue
        sharing += 1
        log.info("Triton at %s gets model inputs through shared memory", endpoint.url)
    return sharing


async def widest_with_memory(
    settings: Settings,
    model: TritonPool,
    schema: FeatureSchema,
    signatures: Sequence[ModelSignature],
) -> ModelSignature:
    """The routed version taking the largest batches, its inputs through shared memory
    where the setting asks for it."""
    signature = max(signatures, key=lambda each: each.max_batch_size)
    if settings.triton_shared_memory != "off":
        required = settings.triton_shared_memory == "on"
        await share_memory(model, schema, signature, settings.max_in_flight, required)
    return signature
