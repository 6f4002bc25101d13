"""Item attributes a client may ask /recommend for: the catalog's words (a title, the
category names), never its features, and never sent unless asked for.

attributes.npz holds one string array per attribute, each as long as the catalog and in its
order; an empty string where an item has none. A world without the file has none to give.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from app.core.errors import ConfigError
from app.core.vocabulary import Positions
from app.world.layout import ATTRIBUTES_FILE
from app.world.stored import reading

# The attributes a world may hold, and a client ask for: a fixed set, so the API's schema
# names them. A world without one answers null for it.
AttributeName = Literal["title", "categories"]
ATTRIBUTE_NAMES: tuple[str, ...] = AttributeName.__args__  # type: ignore[attr-defined]


@dataclass(frozen=True, slots=True)
class ItemAttributes:
    columns: Mapping[str, npt.NDArray[np.str_]] = field(default_factory=dict)
    # Items put while serving, by position (app.release.arrivals): their words win.
    extra: Mapping[int, Mapping[str, str]] = field(default_factory=dict)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(sorted(self.columns))

    def of(self, positions: Positions, asked: Sequence[str]) -> list[dict[str, str | None]]:
        """Each position's asked attributes, in order: None for one the world lacks (or a
        position of -1)."""
        rows: list[dict[str, str | None]] = []
        for position in positions.tolist():
            put = self.extra.get(position)
            if put is not None:
                rows.append({name: put.get(name) for name in asked})
                continue
            rows.append(
                {
                    name: None
                    if position < 0 or name not in self.columns
                    else str(self.columns[name][position])
                    for name in asked
                }
            )
        return rows


def save_attributes(world: Path, columns: Mapping[str, npt.NDArray[np.str_]]) -> None:
    """Write the attributes, or remove the file when there are none (an older build's)."""
    path = world / ATTRIBUTES_FILE
    path.unlink(missing_ok=True)
    if columns:
        arrays: dict[str, Any] = {name: np.asarray(v, dtype=np.str_) for name, v in columns.items()}
        np.savez(path, **arrays)


def load_attributes(world: Path, n_items: int) -> ItemAttributes:
    path = world / ATTRIBUTES_FILE
    if not path.is_file():
        return ItemAttributes()
    with reading(path), np.load(path) as stored:
        columns = {name: stored[name].astype(np.str_) for name in stored.files}
    unknown = sorted(set(columns) - set(ATTRIBUTE_NAMES))
    if unknown:
        raise ConfigError(
            f"{path} holds {unknown}, not attributes the service knows "
            f"({', '.join(ATTRIBUTE_NAMES)}): rebuild the world"
        )
    for name, values in columns.items():
        if values.shape != (n_items,):
            raise ConfigError(
                f"{path} holds {values.shape} values of {name!r} for a catalog of {n_items} "
                "items: rebuild the world"
            )
    return ItemAttributes(columns)
