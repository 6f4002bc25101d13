"""Items put into the catalog while serving, and items withdrawn from it.

Every change is an entry of the catalog's change log (app.clients.catalog_log), numbered in
the order the log accepted it. An item the world was not built with gets a position once,
when the log first accepts it (the next past the world's last, or past the last added
one), so every process that applies the log holds every item at the same position. A world
item keeps its own.

`CatalogRoom` is where a process holds the changes: the world's per-item arrays, copied
once into arrays with `capacity` rows to spare, filled in place. A change writes its rows
first and then lets the catalog grow over them, so a request that took the catalog before
never sees a row half written, and no change copies the catalog.

Every value of a change is checked against the array that stores it before any row is
written (`change_problem`: times that fit int64, numbers that fit float32, a vector no
longer than a few times the world's longest); the API refuses a change that fails, and a
process applying the log skips a batch that fails (UnappliableBatchError) whole.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from app.core.errors import UnappliableBatchError
from app.core.storable import FLOAT32_MAX, fits_float32, identifier_problem
from app.core.vocabulary import Positions
from app.release.added_cells import AddedCells

FloatArray = npt.NDArray[np.float32]
# The last second of year 9999: the latest `published_at` a catalog holds (as int64).
LATEST_TIME_S = 253_402_300_799
# Category codes are compared, and counted per code by the category cap: a bound far
# beyond any world's categories, and far inside the int64 they are stored in.
MOST_CATEGORIES = 2**31
# An item's vector may be at most this many times as long as the world's longest: further
# out, its inner product with every user outweighs any other item's (it would be recalled
# for everyone) and products of such vectors leave float32.
NORM_FACTOR = 4.0


@dataclass(frozen=True, slots=True)
class ItemChange:
    """An item put into the catalog: added, or its attributes replaced. `embedding` is the
    one the caller gave or the world's guess from its attributes, made once, by the API."""

    item_id: str
    position: int
    title: str
    categories: tuple[str, ...]
    category: int  # the catalog's code for the first of `categories`
    published_at: int
    dense: tuple[float, ...]
    embedding: tuple[float, ...]
    guessed: bool = False  # the embedding is the world's guess, not the caller's
    # Only the vector changes (the consumer's refit): nothing else of the item, nor whether
    # it is withdrawn, is touched.
    vector_only: bool = False

    def blob(self) -> FloatArray:
        """The item's feature blob, in the schema's item layout: its vector, then its dense
        features (as the world's loader writes it)."""
        return np.asarray(self.embedding + self.dense, dtype="<f4")


@dataclass(frozen=True, slots=True)
class Withdrawal:
    item_id: str
    position: int


@dataclass(frozen=True, slots=True)
class ChangeBatch:
    """One accepted call: its number in the log, and what it changed."""

    seq: int
    puts: tuple[ItemChange, ...] = ()
    withdrawals: tuple[Withdrawal, ...] = ()


def encode_changes(puts: Sequence[ItemChange], withdrawals: Sequence[Withdrawal]) -> str:
    """A batch's body as the log stores it; positions of new items are the log's to give,
    so they are carried beside the body (app.clients.catalog_log), not in it."""
    body = {
        "puts": [
            [
                c.item_id,
                c.title,
                list(c.categories),
                c.category,
                c.published_at,
                list(c.dense),
                list(c.embedding),
                c.guessed,
                c.vector_only,
            ]
            for c in puts
        ],
        "withdrawals": [w.item_id for w in withdrawals],
    }
    return json.dumps(body, separators=(",", ":"))


def float32_problem(values: Sequence[float]) -> str | None:
    """Why `values` cannot be stored as float32 numbers, or None."""
    if fits_float32(values):
        return None
    return f"must be finite numbers within float32's range (at most {FLOAT32_MAX:.4g})"


def vector_problem(vector: Sequence[float], dim: int, longest: float) -> str | None:
    """Why `vector` cannot be an item's vector of `dim` numbers at most `longest` long."""
    if len(vector) != dim:
        return f"must hold {dim} numbers"
    problem = float32_problem(vector)
    if problem is not None:
        return problem
    norm = math.sqrt(math.fsum(v * v for v in vector))
    if norm > longest:
        return (
            f"its length is {norm:.4g}, over {longest:.4g} ({NORM_FACTOR:g} times the world's "
            "longest item vector)"
        )
    return None


def time_problem(seconds: int) -> str | None:
    if 0 <= seconds <= LATEST_TIME_S:
        return None
    return f"must be unix seconds from 0 to {LATEST_TIME_S} (the end of year 9999)"


def decode_changes(seq: int, body: str, positions: Sequence[int]) -> ChangeBatch:
    """A batch back from the log; `positions` are its items', puts first, in order.
    UnappliableBatchError when it is not a batch this code wrote."""
    try:
        return _decoded(seq, body, positions)
    except (ValueError, TypeError, KeyError, IndexError, AttributeError) as exc:
        raise UnappliableBatchError(f"batch {seq} does not decode: {exc!r}") from None


def _decoded(seq: int, body: str, positions: Sequence[int]) -> ChangeBatch:
    raw: dict[str, Any] = json.loads(body)
    puts = tuple(
        ItemChange(
            item_id=str(row[0]),
            position=int(positions[i]),
            title=str(row[1]),
            categories=tuple(str(name) for name in row[2]),
            category=int(row[3]),
            published_at=int(row[4]),
            dense=tuple(float(v) for v in row[5]),
            embedding=tuple(float(v) for v in row[6]),
            guessed=bool(row[7]),
            vector_only=len(row) > 8 and bool(row[8]),
        )
        for i, row in enumerate(raw["puts"])
    )
    offset = len(puts)
    withdrawals = tuple(
        Withdrawal(str(item_id), int(positions[offset + i]))
        for i, item_id in enumerate(raw["withdrawals"])
    )
    if len(positions) != offset + len(withdrawals):
        raise ValueError(f"{len(positions)} positions for {offset + len(withdrawals)} changes")
    return ChangeBatch(seq, puts, withdrawals)


def _grown(array: npt.NDArray[Any], rows: int, fill: Any) -> npt.NDArray[Any]:
    grown = np.full((rows, *array.shape[1:]), fill, dtype=array.dtype)
    grown[: len(array)] = array
    return grown


@dataclass(slots=True)
class CatalogRoom:
    """The catalog's arrays with room for `capacity` items past the world's `base`."""

    base: int
    capacity: int
    categories: npt.NDArray[np.int64]
    published_at: npt.NDArray[np.int64]
    vectors: FloatArray
    blobs: FloatArray  # (capacity, item blob width): the added items' feature rows
    present: npt.NDArray[np.bool_]  # base + capacity: a row that holds an item
    withdrawn: npt.NDArray[np.bool_]  # base + capacity
    ids: list[str] = field(default_factory=list)  # the added items', by position - base
    positions: dict[str, int] = field(default_factory=dict)  # added id -> position
    attributes: dict[int, dict[str, str]] = field(default_factory=dict)  # put items' words
    put: set[int] = field(default_factory=set)  # every position a change put
    # The added items filed under the world index's cells (app.release.added_cells); None:
    # an index without cells, whose added items are scanned whole.
    cells: AddedCells | None = None
    size: int = 0  # base + the rows up to the last added item
    seq: int = 0  # the last batch applied, or skipped
    withdrawals: int = 0  # the items withdrawn now
    longest: float = math.inf  # the longest vector an item may have (NORM_FACTOR)

    @property
    def rows(self) -> int:
        return self.base + self.capacity

    @property
    def added(self) -> int:
        return len(self.positions)

    @property
    def all_live(self) -> bool:
        """Every row past the world's, up to `size`, holds an item not withdrawn."""
        return self.withdrawals == 0 and self.added == self.size - self.base

    def id_at(self, position: int) -> str:
        index = position - self.base
        return self.ids[index] if 0 <= index < len(self.ids) else ""

    def change_problem(
        self, change: ItemChange, vector_fits: bool = False
    ) -> tuple[str, str] | None:
        """The field of `change` this process could not store and why, or None
        (`vector_fits`: its vector is known to, checked with others at once)."""
        dim = self.vectors.shape[1]
        checks: list[tuple[str, str | None]] = [("item_id", identifier_problem(change.item_id))]
        if not vector_fits:
            checks.append(("embedding", vector_problem(change.embedding, dim, self.longest)))
        if not change.vector_only:
            dense = self.blobs.shape[1] - dim
            checks += [
                ("title", identifier_problem(change.title)),
                (
                    "categories",
                    next(filter(None, map(identifier_problem, change.categories)), None),
                ),
                ("published_at", time_problem(change.published_at)),
                ("category", None if 0 <= change.category < MOST_CATEGORIES else "out of range"),
                ("dense", f"must hold {dense} numbers" if len(change.dense) != dense else None),
                ("dense", float32_problem(change.dense)),
            ]
        for name, problem in checks:
            if problem is not None:
                return name, problem
        return None

    def first_problem(self, puts: Sequence[ItemChange]) -> tuple[int, str, str] | None:
        """The first of `puts` this process could not store: its index, field and why. The
        vectors of all of them are checked at once (a thousand of them: a few ms)."""
        dim = self.vectors.shape[1]
        shaped = np.array([len(put.embedding) == dim for put in puts], dtype=bool)
        vectors = np.zeros((len(puts), dim))
        if shaped.any():
            vectors[shaped] = [put.embedding for put in itertools.compress(puts, shaped)]
        with np.errstate(over="ignore", invalid="ignore"):
            fits = shaped & np.isfinite(vectors).all(1) & (np.abs(vectors) <= FLOAT32_MAX).all(1)
            fits &= np.einsum("ij,ij->i", vectors, vectors) <= self.longest**2
        for n, put in enumerate(puts):
            problem = self.change_problem(put, vector_fits=bool(fits[n]))
            if problem is not None:
                return (n, *problem)
        return None

    def check(self, batch: ChangeBatch) -> None:
        """UnappliableBatchError naming the first change of `batch` this process cannot
        store: a position past its room (RECSYS_CATALOG_HEADROOM differs between the
        processes), or a value its arrays cannot hold."""
        named: list[ItemChange | Withdrawal] = [*batch.puts, *batch.withdrawals]
        for change in named:
            if not 0 <= change.position < self.rows:
                raise UnappliableBatchError(
                    f"batch {batch.seq} names {change.item_id!r} at {change.position}, past "
                    f"this process's room ({self.rows} rows): set the same "
                    "RECSYS_CATALOG_HEADROOM everywhere"
                )
        for withdrawal in batch.withdrawals:
            problem = identifier_problem(withdrawal.item_id)
            if problem is not None:
                raise UnappliableBatchError(f"batch {batch.seq} withdraws an id that {problem}")
        found = self.first_problem(batch.puts)
        if found is not None:
            n, field, why = found
            put = batch.puts[n]
            raise UnappliableBatchError(f"batch {batch.seq} puts {put.item_id!r}: {field} {why}")

    def apply(self, batch: ChangeBatch) -> None:
        """Write the batch's rows, once every one of them is known to fit (`check`); the
        caller then takes the catalog at the new size."""
        self.check(batch)
        for change in batch.puts:
            self._put(change)
        filed = np.array([c.position for c in batch.puts if c.position >= self.base], np.int64)
        if self.cells is not None and len(filed):
            self.cells.file(filed, self.vectors[filed])
        for withdrawal in batch.withdrawals:
            self.withdrawals += int(not self.withdrawn[withdrawal.position])
            self.withdrawn[withdrawal.position] = True
        self.seq = max(self.seq, batch.seq)

    def refile(self, cells: AddedCells | None) -> None:
        """File every added item under `cells` (those of a newly read index), which then
        take the place of the ones held. Called where batches are applied (the event loop),
        so no batch is applied to the old filing meanwhile."""
        if cells is not None and self.positions:
            filed = np.fromiter(self.positions.values(), np.int64, len(self.positions))
            cells.file(filed, self.vectors[filed])
        self.cells = cells

    def skip(self, seq: int) -> None:
        """Pass over batch `seq`, which this process cannot apply: requests waiting for it
        stop waiting, and the batches after it are applied."""
        self.seq = max(self.seq, seq)

    def _put(self, change: ItemChange) -> None:
        p = change.position
        self.put.add(p)
        if change.vector_only:
            if self.present[p]:
                self.vectors[p] = change.embedding
                if p >= self.base:
                    self.blobs[p - self.base, : len(change.embedding)] = change.embedding
            return
        self.categories[p] = change.category
        self.published_at[p] = change.published_at
        self.vectors[p] = change.embedding
        self.attributes[p] = {"title": change.title, "categories": "|".join(change.categories)}
        # A world item's blob lives with the world's (the held item features, and Redis,
        # where the API wrote it): the process applying the log writes it there.
        if p >= self.base:
            self.blobs[p - self.base] = change.blob()
            while len(self.ids) <= p - self.base:
                self.ids.append("")
            self.ids[p - self.base] = change.item_id
            self.positions[change.item_id] = p
            self.size = max(self.size, p + 1)
        self.present[p] = True
        self.withdrawals -= int(self.withdrawn[p])  # a put brings a withdrawn item back
        self.withdrawn[p] = False

    def digest(self) -> str:
        """What tells one process's catalog from another's: the added ids at their
        positions, what was withdrawn, the rows put. The rows no change touched are the
        world's, the same in every process of the world: left out, the digest costs a pass
        over the flags and the rows put, not the whole catalog (it runs on the event loop)."""
        put = np.fromiter(sorted(self.put), np.int64, len(self.put))
        added = put[put >= self.base] - self.base
        words = [self.attributes.get(p, {}) for p in put.tolist()]
        hashed = hashlib.sha256("\n".join(self.ids).encode())
        hashed.update(json.dumps(words, sort_keys=True).encode())
        hashed.update(np.packbits(self.withdrawn).tobytes())
        hashed.update(np.packbits(self.present).tobytes())
        hashed.update(put.tobytes())
        hashed.update(self.categories[put].tobytes())
        hashed.update(self.published_at[put].tobytes())
        hashed.update(self.vectors[put].tobytes())
        hashed.update(self.blobs[added].tobytes())  # the added items' dense features too
        return hashed.hexdigest()[:16]

    def known(self, found: Positions, ids: Sequence[str], below: int) -> Positions:
        """`found` (the world's positions of `ids`, -1 where it lacks one) with the added
        items' positions below `below` filled in."""
        missing = np.flatnonzero(found < 0)
        if len(missing) == 0 or not self.positions:
            return found
        added = np.asarray(
            [self.positions.get(ids[i], -1) for i in missing.tolist()], dtype=np.int64
        )
        found[missing] = np.where(added < below, added, -1)
        return found


def make_room(
    categories: npt.NDArray[np.int64],
    published_at: npt.NDArray[np.int64],
    vectors: FloatArray,
    capacity: int,
    blob_width: int,
) -> CatalogRoom:
    """Room for `capacity` items past the world's; one copy of its per-item arrays."""
    base = len(categories)
    rows = base + capacity
    present = np.zeros(rows, dtype=bool)
    present[:base] = True
    norms = np.linalg.norm(vectors.astype(np.float64), axis=1) if base else np.zeros(1)
    return CatalogRoom(
        base=base,
        capacity=capacity,
        categories=_grown(categories, rows, 0),
        published_at=_grown(published_at, rows, 0),
        vectors=_grown(vectors, rows, 0.0),
        blobs=np.zeros((capacity, blob_width), dtype=np.float32),
        present=present,
        withdrawn=np.zeros(rows, dtype=bool),
        size=base,
        # A world of vectors all nought (none in practice) takes none longer than a hair.
        # A world of vectors all nought (none in practice) takes none longer than a hair.
        longest=NORM_FACTOR * max(float(norms.max()), 1e-6),
    )
