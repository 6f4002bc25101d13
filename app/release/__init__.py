"""What is served, at run time: the catalog as the service holds it (with room for items
added while serving), the rules, the release plan, the Redis key layout, and the snapshot of
them that one request reads. The files they are read from: app.world."""
