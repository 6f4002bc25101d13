"""Where a world's data lives in Redis: the keys of users, items, seen lists and the layout.

Part of the release: the loader writes these keys and the service reads them, and a prefix
lets two worlds share one Redis.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt


@dataclass(frozen=True, slots=True)
class KeySpace:
    prefix: str

    def user(self, user_id: str) -> str:
        return f"{self.prefix}:u:{user_id}"

    def item(self, item_id: str) -> str:
        return f"{self.prefix}:i:{item_id}"

    def seen(self, user_id: str) -> str:
        return f"{self.prefix}:seen:{user_id}"

    @property
    def meta(self) -> str:
        return f"{self.prefix}:meta"

    def item_keys(self, item_ids: npt.NDArray[np.str_]) -> npt.NDArray[np.bytes_]:
        """Every item's key, encoded once, so a request only indexes into this array."""
        keys: npt.NDArray[np.bytes_] = np.char.encode(np.char.add(self.item(""), item_ids), "utf-8")
        return keys
