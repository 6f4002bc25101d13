"""What is served: the feature schema, the world's files, the rules, the release plan,
and the snapshot of them that one request reads."""
