"""Selector `backfill`: what was set aside goes back at the end of the running, in the order it
was set aside, so an answer short of items is filled from it rather than left short."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from app.pipeline.selectors.selecting import NONE, Candidates, Selecting


class SetAsideBackfill:
    reason = "set aside, and not needed to fill the answer"

    def select(self, selecting: Selecting, candidates: Candidates) -> Selecting:
        if not len(selecting.aside):
            return selecting
        order = np.concatenate([selecting.order, selecting.aside])
        return replace(selecting, order=order, aside=NONE)
