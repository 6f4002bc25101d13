"""A world on disk: its files by name (layout), the record each holds with its read and write,
the manifest and the stamp that names the world whole. The format both engines write and the
service reads; docs/world-format.md describes it field by field."""
