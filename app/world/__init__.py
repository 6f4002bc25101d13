"""A world on disk: its files by name (layout), the optional parts' records with their reads
and writes, the manifest, and the stamp that names the world whole and checks its parts. The
format both engines write and the service reads; docs/world-format.md describes it."""
