"""Storing worlds: a world written whole (its catalog, index and every file in one order),
its stamp and manifest, a new index beside it, loading it into Redis. The files' records are
app/world's."""
