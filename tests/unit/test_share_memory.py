"""Which Tritons get model inputs through shared memory: auto falls back, on refuses."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import pytest

from app.clients.shared_memory import PREFIX, SHM_DIR, InputSlots
from app.core.errors import ConfigError, FailureKind, RankingModelError
from app.core.settings import Settings
from app.process.model_inputs import share_memory
from app.world.schema import ModelSignature
from tests.unit.tiny_schema import tiny_schema

SIGNATURE = ModelSignature("m", "1", "features", "FP32", (-1, 7), "score", "FP32", 8)


def _ours() -> set[str]:
    # Other apps this process serves (the integration tests' session apps) have regions too.
    return {path.name for path in SHM_DIR.glob(f"{PREFIX}{os.getpid()}-*")}


@dataclass
class Endpoint:
    url: str
    maps_our_memory: bool
    slots: list[InputSlots] = field(default_factory=list)

    async def use_shared_memory(self, slots: InputSlots, timeout_s: float) -> None:
        if not self.maps_our_memory:
            raise RankingModelError(FailureKind.ERROR, "Unable to open shared memory region")
        self.slots.append(slots)


@dataclass
class Pool:
    endpoints: list[Endpoint]


async def test_auto_shares_with_the_tritons_that_can_and_sends_plain_to_the_others() -> None:
    here, elsewhere = Endpoint("localhost:8001", True), Endpoint("gpu2:8001", False)
    before = _ours()
    try:
        sharing = await share_memory(
            Pool([here, elsewhere]), tiny_schema(), SIGNATURE, 2, required=False
        )
        assert sharing == 1
        assert len(here.slots) == 1
        assert elsewhere.slots == []
        # The refused endpoint's region is not left behind.
        assert _ours() - before == {here.slots[0].name}
    finally:
        for slots in here.slots:
            slots.close()


async def test_on_refuses_to_start_without_it() -> None:
    with pytest.raises(ConfigError, match="gpu2:8001 cannot use this host's shared memory"):
        await share_memory(
            Pool([Endpoint("gpu2:8001", False)]), tiny_schema(), SIGNATURE, 2, required=True
        )


@pytest.mark.parametrize(
    ("given", "means"),
    [("true", "on"), ("false", "off"), ("1", "on"), ("auto", "auto"), ("OFF", "off")],
)
def test_the_old_switch_values_still_read(given: str, means: str) -> None:
    assert Settings.model_validate({"triton_shared_memory": given}).triton_shared_memory == means
