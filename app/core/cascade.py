"""The candidate cascade's defaults: how many items each step takes, by default.

The service's settings default to these; the build's fits, its evaluation and the model tools
read them here, so the answers measured offline come from the cascade the service runs.
"""

from __future__ import annotations

CANDIDATE_COUNT = 2500  # nearest items to the user's vector
POPULAR_CANDIDATES = 100
SIMILAR_CANDIDATES = 400  # from the neighbours of the user's latest positives
VIEWED_CANDIDATES = 300  # around the item an item page shows
RECENT_ITEMS = 20  # the user's latest positives read with their features
RECENT_DECAY = 0.9  # how much less each older positive counts in the similar score
PRERANK_KEEP = 500  # the candidates the model scores
INDEX_NPROBE = 32  # IVF cells searched
