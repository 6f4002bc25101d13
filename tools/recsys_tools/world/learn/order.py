"""The order model, learnt: a GRU that reads a user's latest positives in time order and
names the next one (GRU4Rec's shape, Hidasi et al. 2016), with a full softmax over the
catalog.

Each example is one positive and the RECENT_ITEMS positives before it, read from a zero
state: exactly what the service reads when it asks (app.world.order), so what was learnt is
what is served. Each user's last positive is held out to stop on: the epochs end when
hit@10 on those stops rising, and the best epoch's weights are kept.

Measured on MovieLens 100k's earlier part (docs/benchmarks.md, the order model): alone it
recalls less than EASE; summed with it, more than either. Where users rate in sessions the
next positive follows from the last few; where they do not (a log without times, a shuffled
history) it learns little, and the blend weighs it little.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from app.core.cascade import RECENT_ITEMS
from app.core.errors import ConfigError
from app.world.order import ARRAYS, OrderModel
from app.world.schema import FeatureSchema, parse_schema
from recsys_tools.world.learn.early_stop import BestEpoch
from recsys_tools.world.read.log import InteractionLog

if TYPE_CHECKING:
    import torch

IntArray = npt.NDArray[np.int64]
# The softmax in training scores every item for each example: 256 x 100,000 floats a batch.
MAX_ITEMS = 100_000
CHECKED_AT_ONCE = 256


def with_order(schema: FeatureSchema) -> FeatureSchema:
    """`schema` with the order signal last in its sequence block (the block appended to the
    layout where it has none): the world's own schema, as it is written beside it."""
    if "order" in schema.sequence:
        return schema
    if not schema.source:
        raise ConfigError("the schema has no text to add the order signal to")
    spec = json.loads(schema.source)
    spec["sequence"] = [*spec.get("sequence", []), "order"]
    if "sequence" not in spec["layout"]:
        spec["layout"] = [*spec["layout"], "sequence"]
    return parse_schema(
        json.dumps(spec, indent=2) + "\n", "the build's schema with the order signal"
    )


@dataclass(frozen=True, slots=True)
class OrderShape:
    hidden: int = 64
    epochs: int = 40
    patience: int = 3
    batch: int = 256
    learning_rate: float = 2e-3
    # Examples drawn afresh each epoch where a log has more: the cost of an epoch stays
    # bounded (about 30 s at this size and 10,000 items on one core).
    examples_per_epoch: int = 200_000
    window: int = RECENT_ITEMS


@dataclass(frozen=True, slots=True)
class OrderReport:
    examples: int
    epochs_run: int
    checking_hit_at_10: float
    checking_users: int

    def as_dict(self) -> dict[str, float | int]:
        return {
            "examples": self.examples,
            "epochs_run": self.epochs_run,
            "checking_hit@10": self.checking_hit_at_10,
            "checking_users": self.checking_users,
        }


@dataclass(frozen=True, slots=True)
class _Positives:
    """Every positive of a part, by user then time, each with where its user's begin: the
    windows are cut from these as each batch asks (a window per positive, made at once,
    would be 160 bytes a positive: gigabytes at tens of millions)."""

    items: IntArray
    first: IntArray  # the index of the first positive of each positive's user
    pad: int  # what fills a window before a user's first positive: the catalog's size

    def windows(self, at: IntArray, width: int) -> IntArray:
        """The `width` positives before each of `at`, left-padded with `pad`."""
        out = np.full((len(at), width), self.pad, dtype=np.int64)
        for back in range(1, width + 1):
            earlier = at - back
            inside = earlier >= self.first[at]
            out[inside, width - back] = self.items[earlier[inside]]
        return out


@dataclass(frozen=True, slots=True)
class _Examples:
    positives: _Positives
    at: IntArray  # the positives to name, each from the window before it
    width: int

    @property
    def targets(self) -> IntArray:
        named: IntArray = self.positives.items[self.at]
        return named

    def windows(self, rows: IntArray | slice) -> IntArray:
        return self.positives.windows(self.at[rows], self.width)


def _examples(part: InteractionLog, window: int) -> tuple[_Examples, _Examples]:
    """Every positive after a user's first, with the `window` before it; the last of each
    user's is the checking half's."""
    liked = part.positive
    users = part.user[liked]  # by user, then time: the log's order
    starts = np.flatnonzero(np.r_[True, users[1:] != users[:-1]])
    lengths = np.diff(np.r_[starts, len(users)])
    owner = np.repeat(np.arange(len(starts)), lengths)
    first = starts[owner]
    rank = np.arange(len(users)) - first
    last = rank == lengths[owner] - 1
    positives = _Positives(part.item[liked].astype(np.int64), first, part.n_items)
    learn = np.flatnonzero((rank >= 1) & ~last)
    check = np.flatnonzero((rank >= 1) & last)
    return _Examples(positives, learn, window), _Examples(positives, check, window)


def fit_order(
    part: InteractionLog, seed: int, shape: OrderShape = OrderShape()
) -> tuple[OrderModel, OrderReport]:
    """The order model learnt from `part`'s positives. Refused where no user has a positive
    after their first two (nothing to learn the order from and to check it on), where the
    catalog is past MAX_ITEMS, and where training diverged."""
    import torch

    if part.n_items > MAX_ITEMS:
        raise ConfigError(
            f"the order model scores every item in training (a softmax over the catalog): "
            f"{part.n_items:,} items is past its {MAX_ITEMS:,} (build without --order-model)"
        )
    learn, check = _examples(part, shape.window)
    if not len(learn.at):
        raise ConfigError(
            "the order model has nothing to learn from: no user has three positives in the "
            "part it learns from (the log less its held-out share, and that part's early "
            "rows; build without --order-model)"
        )
    threads = torch.get_num_threads()
    # The GRU's products are small: threads cost more than they give (measured ten times
    # slower beside a second build on two cores).
    torch.set_num_threads(1)
    try:
        torch.manual_seed(seed)
        rng = np.random.default_rng(seed)
        net = _Net(part.n_items, shape.hidden, shape.window)
        epochs, hit = _train(net, learn, check, shape, rng)
    finally:
        torch.set_num_threads(threads)
    served = net.served()
    if not all(np.isfinite(getattr(served, name)).all() for name in ARRAYS):
        raise ConfigError("the order model's training diverged (NaN or Inf weights)")
    report = OrderReport(len(learn.at), epochs, round(hit, 4), len(check.at))
    return served, report


class _Net:
    def __init__(self, n_items: int, hidden: int, window: int = RECENT_ITEMS) -> None:
        from torch import nn

        self.n_items, self.window = n_items, window
        self.inputs = nn.Embedding(n_items + 1, hidden, padding_idx=n_items)
        self.gru = nn.GRU(hidden, hidden, batch_first=True)
        self.outputs = nn.Linear(hidden, n_items)
        self.modules = nn.ModuleList([self.inputs, self.gru, self.outputs])

    def logits(self, windows: npt.NDArray[np.int64]) -> torch.Tensor:
        """Each window's next-item logits: the GRU run from zero over the window's items
        only (the padding is packed away, as the service never reads it)."""
        import torch

        x = torch.from_numpy(windows)
        lengths = (x != self.n_items).sum(dim=1)
        # Right-align -> left-align, so packing reads each window from its first item.
        width = x.shape[1]
        shift = (width - lengths)[:, None]
        gather = (torch.arange(width)[None, :] + shift) % width
        aligned = torch.gather(x, 1, gather)
        packed = torch.nn.utils.rnn.pack_padded_sequence(
            self.inputs(aligned), lengths.clamp(min=1), batch_first=True, enforce_sorted=False
        )
        _, state = self.gru(packed)
        logits: torch.Tensor = self.outputs(state[0])
        return logits

    def served(self) -> OrderModel:
        def array(tensor: torch.Tensor) -> npt.NDArray[np.float32]:
            return np.ascontiguousarray(tensor.detach().numpy(), dtype=np.float32)

        outputs = array(self.outputs.weight)
        bias = array(self.outputs.bias)
        gru = dict(self.gru.named_parameters())
        return OrderModel(
            inputs=array(self.inputs.weight)[: self.n_items],
            weight_ih=array(gru["weight_ih_l0"]),
            weight_hh=array(gru["weight_hh_l0"]),
            bias_ih=array(gru["bias_ih_l0"]),
            bias_hh=array(gru["bias_hh_l0"]),
            # Less the catalog's mean: scores are over the average item, a new item's 0.
            outputs=outputs - outputs.mean(axis=0),
            output_bias=bias - bias.mean(),
            window=self.window,
        )


def _hit_at_10(net: _Net, check: _Examples) -> float:
    import torch

    hits = 0
    targets_all = check.targets
    with torch.no_grad():
        for start in range(0, len(targets_all), CHECKED_AT_ONCE):
            rows = slice(start, start + CHECKED_AT_ONCE)
            logits = net.logits(check.windows(rows))
            target_logit = logits.gather(1, torch.from_numpy(targets_all[rows])[:, None])
            ahead = (logits > target_logit).sum(dim=1)
            # A NaN score is ahead of nothing: counted a miss, not a hit.
            hits += int(((ahead < 10) & torch.isfinite(target_logit[:, 0])).sum())
    return hits / len(targets_all)


def _train(
    net: _Net, learn: _Examples, check: _Examples, shape: OrderShape, rng: np.random.Generator
) -> tuple[int, float]:
    import torch

    parameters = list(net.modules.parameters())
    optimiser = torch.optim.Adam(parameters, lr=shape.learning_rate)
    kept, epochs = BestEpoch(parameters, shape.patience, _higher, -math.inf), 0
    targets = learn.targets
    drawn = min(len(targets), shape.examples_per_epoch)
    for epoch in range(shape.epochs):
        epochs = epoch + 1
        order = rng.permutation(len(targets))[:drawn]
        for start in range(0, drawn, shape.batch):
            rows = order[start : start + shape.batch]
            optimiser.zero_grad()
            loss = torch.nn.functional.cross_entropy(
                net.logits(learn.windows(rows)), torch.from_numpy(targets[rows])
            )
            loss.backward()  # type: ignore[no-untyped-call]
            optimiser.step()
        if kept.offer(_hit_at_10(net, check)):
            break
    kept.restore()
    return epochs, kept.best


def _higher(hit: float, best: float) -> bool:
    return hit > best
