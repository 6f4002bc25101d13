"""FastAPI dependency aliases."""

from __future__ import annotations

from typing import Annotated, cast

from fastapi import Depends, Request

from app.process.services import Services


# Async on purpose: FastAPI runs a plain `def` dependency in its thread pool, a thread hop
# on every request for what is one attribute read.
async def get_services(request: Request) -> Services:
    return cast(Services, request.app.state.services)


ServicesDep = Annotated[Services, Depends(get_services)]
