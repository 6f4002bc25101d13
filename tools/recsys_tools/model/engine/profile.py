"""TensorRT tunes its kernels for the profile's shapes, so they follow the service's chunking.

The service cuts every request into chunks of at most max_batch_size with its own
chunk_bounds; the profile is computed from that same function, so opt is the chunk a typical
request really arrives in.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.clients.ranking_model import chunk_bounds
from app.core.cascade import PRERANK_KEEP

# A request's model rows: what pre-rank keeps of the pool.
REQUEST_ROWS: int = PRERANK_KEEP


@dataclass(frozen=True, slots=True)
class Profile:
    input_name: str
    width: int
    min_rows: int
    opt_rows: int
    max_rows: int
    request_rows: int

    def shape(self, rows: int) -> str:
        return f"{self.input_name}:{rows}x{self.width}"

    @property
    def shapes(self) -> dict[str, str]:
        return {
            "min": self.shape(self.min_rows),
            "opt": self.shape(self.opt_rows),
            "max": self.shape(self.max_rows),
        }


def profile_for(config: Any, request_rows: int) -> Profile:
    """min 1; opt the chunk a typical request is sent in; max the largest chunk, max_batch_size."""
    top = int(config.max_batch_size)
    opt = max(end - start for start, end in chunk_bounds(request_rows, top))
    return Profile(config.input[0].name, int(config.input[0].dims[-1]), 1, opt, top, request_rows)
