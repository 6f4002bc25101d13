"""Storing worlds: the files a world is made of, its stamp, its index, loading it into Redis."""
