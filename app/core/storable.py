"""What the arrays, keys and files the service writes can hold: the limits every check of
hostile input is made against (the API's models, the catalog's room, the consumer's event
reader, the archive's quarantine), so that all of them refuse the same values."""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
FLOAT32_MAX = float(np.finfo(np.float32).max)


def fits_int64(value: int) -> bool:
    return INT64_MIN <= value <= INT64_MAX


def fits_float32(values: Iterable[float]) -> bool:
    """Finite, and finite once stored as float32 (1e39 is finite in float64, inf stored)."""
    try:
        return all(math.isfinite(v) and abs(v) <= FLOAT32_MAX for v in values)
    except OverflowError:  # an int no float holds
        return False


def unicode_problem(text: str) -> str | None:
    """Why `text` cannot name a key or be written as UTF-8 (a lone surrogate, which JSON
    may carry escaped), or None."""
    if text.isascii():
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "must be valid Unicode text (no lone surrogates)"
    return None


def identifier_problem(text: str) -> str | None:
    """Why `text` cannot be an id: not Unicode, or holding NUL (arrays of ids, numpy's
    str_, drop trailing NULs: "a" and "a\\0" would be one item)."""
    if "\x00" in text:
        return "must not hold the NUL character"
    return unicode_problem(text)
