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
from app.world.order import OrderModel
from app.world.schema import FeatureSchema, parse_schema
from recsys_tools.world.read.log import InteractionLog

if TYPE_CHECKING:
    import torch

IntArray = npt.NDArray[np.int64]


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
class _Examples:
    """Windows of item positions, left-padded with `pad` (the catalog's size), one target
    each."""

    windows: IntArray
    targets: IntArray


def _examples(part: InteractionLog, window: int) -> tuple[_Examples, _Examples]:
    """Every positive after a user's first, with the `window` before it; the last of each
    user's is the checking half's."""
    liked = part.positive
    users, items = part.user[liked], part.item[liked]  # by user, then time: the log's order
    pad = part.n_items
    starts = np.flatnonzero(np.r_[True, users[1:] != users[:-1]])
    ends = np.r_[starts[1:], len(users)]
    learn: list[tuple[int, int]] = []
    check: list[tuple[int, int]] = []
    for start, end in zip(starts.tolist(), ends.tolist(), strict=True):
        if end - start < 2:
            continue
        learn.extend((start, at) for at in range(start + 1, end - 1))
        check.append((start, end - 1))

    def windows(spans: list[tuple[int, int]]) -> _Examples:
        out = np.full((len(spans), window), pad, dtype=np.int64)
        for row, (start, at) in enumerate(spans):
            taken = items[max(start, at - window) : at]
            out[row, window - len(taken) :] = taken
        return _Examples(out, items[[at for _, at in spans]].astype(np.int64))

    return windows(learn), windows(check)


def fit_order(
    part: InteractionLog, seed: int, shape: OrderShape = OrderShape()
) -> tuple[OrderModel, OrderReport]:
    """The order model learnt from `part`'s positives. Refused where no user has a positive
    after their first two: nothing to learn the order from and to check it on."""
    import torch

    learn, check = _examples(part, shape.window)
    if not len(learn.targets):
        raise ConfigError(
            "the order model has nothing to learn from: no user has three positives "
            "(build without --order-model)"
        )
    threads = torch.get_num_threads()
    # The GRU's products are small: threads cost more than they give (measured ten times
    # slower beside a second build on two cores).
    torch.set_num_threads(1)
    try:
        torch.manual_seed(seed)
        rng = np.random.default_rng(seed)
        net = _Net(part.n_items, shape.hidden)
        epochs, hit = _train(net, learn, check, shape, rng)
    finally:
        torch.set_num_threads(threads)
    report = OrderReport(len(learn.targets), epochs, round(hit, 4), len(check.targets))
    return net.served(), report


class _Net:
    def __init__(self, n_items: int, hidden: int) -> None:
        from torch import nn

        self.n_items = n_items
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
        )


def _hit_at_10(net: _Net, check: _Examples) -> float:
    import torch

    hits = 0
    with torch.no_grad():
        for start in range(0, len(check.targets), 1024):
            logits = net.logits(check.windows[start : start + 1024])
            targets = torch.from_numpy(check.targets[start : start + 1024])
            target_logit = logits.gather(1, targets[:, None])
            hits += int(((logits > target_logit).sum(dim=1) < 10).sum())
    return hits / len(check.targets)


def _train(
    net: _Net, learn: _Examples, check: _Examples, shape: OrderShape, rng: np.random.Generator
) -> tuple[int, float]:
    import torch

    parameters = list(net.modules.parameters())
    optimiser = torch.optim.Adam(parameters, lr=shape.learning_rate)
    best, best_state, stale, epochs = -math.inf, None, 0, 0
    drawn = min(len(learn.targets), shape.examples_per_epoch)
    for epoch in range(shape.epochs):
        epochs = epoch + 1
        order = rng.permutation(len(learn.targets))[:drawn]
        for start in range(0, drawn, shape.batch):
            rows = order[start : start + shape.batch]
            optimiser.zero_grad()
            loss = torch.nn.functional.cross_entropy(
                net.logits(learn.windows[rows]),
                torch.from_numpy(learn.targets[rows]),
            )
            loss.backward()  # type: ignore[no-untyped-call]
            optimiser.step()
        hit = _hit_at_10(net, check)
        if hit > best:
            best, stale = hit, 0
            best_state = [p.detach().clone() for p in parameters]
        else:
            stale += 1
            if stale >= shape.patience:
                break
    if best_state is not None:
        with torch.no_grad():
            for p, kept in zip(parameters, best_state, strict=True):
                p.copy_(kept)
    return epochs, best
