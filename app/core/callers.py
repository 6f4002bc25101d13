"""Who may post events: named callers, each with a token the service keeps only as a digest.

A caller list is `name=sha256:HEX` entries, comma-separated (`recsys event-caller NAME`
makes a token and its entry). Only digests are configured, so the list itself is no secret
worth stealing, and a caller's name is what metrics and quotas are kept by: a fixed set,
known at start.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass

_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")
_DIGEST = re.compile(r"^sha256:([0-9a-f]{64})$")
TOKEN_BYTES = 32
# Callers nobody configured: the loopback sender (no list configured) and the refused.
LOOPBACK = "loopback"
UNKNOWN = "unknown"
RESERVED = frozenset({LOOPBACK, UNKNOWN})


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    return secrets.token_urlsafe(TOKEN_BYTES)


def entry(name: str, token: str) -> str:
    """The caller-list entry for `name` holding `token`."""
    return f"{name}=sha256:{token_digest(token)}"


@dataclass(frozen=True, slots=True)
class Callers:
    """The configured callers, by the digest of their token."""

    by_digest: Mapping[str, str]

    @property
    def names(self) -> list[str]:
        return sorted(self.by_digest.values())

    def who(self, token: str) -> str | None:
        """The caller holding `token`, or None. Every digest is compared in constant time,
        so how long a refusal takes tells nothing of how close a guess came."""
        sent = token_digest(token)
        found = None
        for digest, name in self.by_digest.items():
            if hmac.compare_digest(sent, digest):
                found = name
        return found


def parse_callers(text: str) -> Callers:
    """The callers of a list; ValueError naming the first bad entry."""
    by_digest: dict[str, str] = {}
    for raw in text.split(","):
        item = raw.strip()
        if not item:
            continue
        name, sep, rest = item.partition("=")
        name = name.strip()
        match = _DIGEST.match(rest.strip())
        if not sep or match is None:
            raise ValueError(f"caller entry {name or item[:20]!r}: expected name=sha256:<64 hex>")
        if not _NAME.match(name) or name in RESERVED:
            raise ValueError(
                f"caller name {name!r}: lower-case letters, digits, - and _ (up to 32), "
                f"not {sorted(RESERVED)}"
            )
        if name in by_digest.values():
            raise ValueError(f"caller {name!r} is listed twice")
        if match.group(1) in by_digest:
            raise ValueError(f"caller {name!r} has the same token as {by_digest[match.group(1)]!r}")
        by_digest[match.group(1)] = name
    if not by_digest:
        raise ValueError("the caller list names no caller")
    return Callers(by_digest)
