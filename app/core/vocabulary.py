"""The ground floor: the names every layer of the pipeline speaks. Imports nothing of the app.

The stages (in the order the pipeline runs them), why a filter removes a candidate, which
model variant answered, and the arrays handed from stage to stage. Metric labels take their
values from these enums, so a label is always one of a fixed set.
"""

from __future__ import annotations

from enum import StrEnum

import numpy as np
import numpy.typing as npt

Positions = npt.NDArray[np.int64]  # catalog positions of items, in the order of the stage
Indices = npt.NDArray[np.intp]  # indices into a stage's own arrays
Scores = npt.NDArray[np.float32]
# Each row's head probabilities, one column per objective (app.world.schema.HEAD_NAMES).
Heads = npt.NDArray[np.float32]


class Stage(StrEnum):
    """The stages of /recommend, in the order the pipeline runs them."""

    FEATURES = "features"
    RECALL = "recall"
    FILTER = "filter"
    PRERANK = "prerank"
    FETCH = "fetch"
    PACK = "pack"
    RANK = "rank"
    RERANK = "rerank"


class Removal(StrEnum):
    """Why the filter stage removed a candidate."""

    BLOCKED = "blocked"
    SEEN = "seen"
    EXCLUDED = "excluded"
    WITHDRAWN = "withdrawn"  # taken out of the catalog while serving
    VIEWED = "viewed"  # the item the request's page shows


class Viewed(StrEnum):
    """What became of the item a request's page shows (a metric label: a fixed set)."""

    NONE = "none"  # no item named: a feed, not an item page
    KNOWN = "known"  # in the catalog: recalled around, ranked after, never returned
    UNKNOWN = "unknown"  # not in the catalog: the user's feed is served instead


class RedisWorld(StrEnum):
    """What world Redis holds, against the one served."""

    SERVED = "served"  # the served world's load
    ANOTHER = "another"  # another world's load: answers read features of another world
    UNSTAMPED = "unstamped"  # a load without a world id (or a served world without one)
    NONE = "none"  # no layout record at all: flushed, restarted empty, never loaded
    UNKNOWN = "unknown"  # Redis did not answer


class WorldRole(StrEnum):
    """Which of two worlds served side by side made an answer: the stable one, or the
    candidate (the user is in its share)."""

    STABLE = "stable"
    CANDIDATE = "candidate"


class Variant(StrEnum):
    """Which model answered: the stable version, the canary, or (Triton did not) a fallback."""

    STABLE = "stable"
    CANARY = "canary"
    FALLBACK = "fallback"
