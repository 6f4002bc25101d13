"""Every file a world directory holds, by name: the one place a world's layout is spelt.

What each holds, field by field, is in docs/world-format.md. The optional parts' records and
readers live in this package beside this module; the catalog's three files (items, index,
default user) are read by app.release.catalog, which holds them as the service serves them.
"""

from __future__ import annotations

# The catalog (app.release.catalog): ids (str), embeddings (n, dim), dense (n, item dense),
# categories (int), published_at (unix seconds), popularity (float).
ITEMS_FILE = "items.npz"
# Every user the world knows: ids (str), embeddings (n, dim), dense (n, user dense).
USERS_FILE = "users.npz"
# An inner-product FAISS index whose row i is item i.
INDEX_FILE = "index.faiss"
# The blob a user without stored features is served with (cold start).
DEFAULT_USER_FILE = "default_user.npy"
# The ranking model Triton serves, also the in-process fallback ranker.
MODEL_FILE = "model.onnx"
# Every user's history (user_ids, offsets, item_ids newest first), loaded into Redis.
SEEN_FILE = "seen.npz"
# Each user's positives, oldest first, repeats kept: what the consumer folds vectors in from.
POSITIVES_FILE = "positives.npz"
# Labelled rows the model did not learn from (recsys model compare); build-world and build-demo
# save them.
HOLDOUT_FILE = "holdout.npz"
# The schema the world was built for; the service serves it by default.
SCHEMA_FILE = "feature_schema.json"
# How the world was built, its id and each file's digest (app.world.manifest).
MANIFEST_FILE = "manifest.json"
# The build's own evaluation and counts; read by people and tools, never by the service.
REPORT_FILE = "report.json"
# Optional parts: each item's nearest items, the item page's own where a build scores them
# by another model (else the page reads the first), pre-rank's weights, the words a client
# may ask for with each item, the guess of an added item's vector, the fold-in's constants.
NEIGHBOURS_FILE = "neighbours.npz"
PAGE_NEIGHBOURS_FILE = "page_neighbours.npz"
PRERANK_FILE = "prerank.json"
ATTRIBUTES_FILE = "attributes.npz"
ITEM_PRIOR_FILE = "item_prior.npz"
FOLDIN_FILE = "foldin.npz"
# The order model: a GRU over the latest positives and an output vector per item
# (app.world.order); only where the build learnt one.
ORDER_FILE = "order.npz"

# What the service itself reads from the world directory, checked against the manifest.
SERVED_FILES = (
    ITEMS_FILE,
    INDEX_FILE,
    DEFAULT_USER_FILE,
    NEIGHBOURS_FILE,
    PAGE_NEIGHBOURS_FILE,
    PRERANK_FILE,
    ATTRIBUTES_FILE,
    ITEM_PRIOR_FILE,
    ORDER_FILE,
)
# What the stamp digests (all but the manifest, the report and the held-out rows).
STAMPED_FILES = (
    ITEMS_FILE,
    USERS_FILE,
    SEEN_FILE,
    POSITIVES_FILE,
    FOLDIN_FILE,
    INDEX_FILE,
    DEFAULT_USER_FILE,
    MODEL_FILE,
    SCHEMA_FILE,
    NEIGHBOURS_FILE,
    PAGE_NEIGHBOURS_FILE,
    ITEM_PRIOR_FILE,
    PRERANK_FILE,
    ATTRIBUTES_FILE,
    ORDER_FILE,
)
# In the directory but never loaded into a serving process's memory.
NOT_LOADED = frozenset({HOLDOUT_FILE, REPORT_FILE, MANIFEST_FILE})
