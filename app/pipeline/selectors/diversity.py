"""Selector `diversity`: the answer chosen again by maximal marginal relevance, each next item
the one whose score most outweighs its likeness to the items chosen before it."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from app.core.vocabulary import Indices
from app.pipeline.selectors.selecting import Candidates, Selecting

# How far past n_items maximal marginal relevance looks for items unlike those chosen.
MMR_FACTOR = 3


def unlike_chosen(
    order: Indices,
    final: npt.NDArray[np.float32],
    vectors: npt.NDArray[np.float32],
    n_items: int,
    relevance: float,
) -> Indices:
    """`order` with its first n_items chosen again by maximal marginal relevance among the
    first MMR_FACTOR * n_items scored ones: each next item is the one whose score (scaled to
    0-1 over those) most outweighs its likeness to the items chosen before it."""
    head = order[: MMR_FACTOR * n_items]
    head = head[~np.isnan(final[head])]
    if relevance >= 1.0 or len(head) <= 1:
        return order
    unit = vectors[head].astype(np.float32)
    unit /= np.maximum(np.linalg.norm(unit, axis=1, keepdims=True), 1e-12)
    values = final[head].astype(np.float64)
    spread = float(values.max() - values.min())
    gain = relevance * ((values - values.min()) / spread if spread > 0 else np.ones_like(values))
    picked = [0]
    # Likeness below zero counts as none: an item opposite to one chosen is not worth more
    # than one merely unrelated to it.
    closest = np.maximum(unit @ unit[0], 0.0)
    for _ in range(min(n_items, len(head)) - 1):
        value = gain - (1.0 - relevance) * closest
        value[picked] = -np.inf
        best = int(np.argmax(value))
        picked.append(best)
        np.maximum(closest, unit @ unit[best], out=closest)
    chosen = head[picked]
    rest = order[~np.isin(order, chosen)]
    return np.concatenate([chosen, rest])


class Diversity:
    reason = "diversity ([diversity] relevance): too like items chosen before it"

    def select(self, selecting: Selecting, candidates: Candidates) -> Selecting:
        relevance = candidates.rules.diversity.relevance
        if candidates.vectors is None or relevance >= 1.0:
            return selecting
        order = unlike_chosen(
            selecting.order, selecting.final, candidates.vectors, candidates.n_items, relevance
        )
        return Selecting(order, selecting.final, selecting.aside)
