"""FastAPI dependency aliases."""

from __future__ import annotations

from typing import Annotated, cast

from fastapi import Depends, Request

from app.process.services import Services
from app.process.worlds import Worlds


# Async on purpose: FastAPI runs a plain `def` dependency in its thread pool, a thread hop
# on every request for what is one attribute read.
async def get_worlds(request: Request) -> Worlds:
    return cast(Worlds, request.app.state.worlds)


async def get_services(request: Request) -> Services:
    """The stable world's: what every route but /recommend serves from."""
    return cast(Worlds, request.app.state.worlds).stable.services


ServicesDep = Annotated[Services, Depends(get_services)]
WorldsDep = Annotated[Worlds, Depends(get_worlds)]
