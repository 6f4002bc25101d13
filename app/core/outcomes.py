"""What became of a request, a post to /events, an answer offered to the log, a shadow
call, a reload and a world change: each a metric label's fixed set."""

from __future__ import annotations

from enum import StrEnum


class Outcome(StrEnum):
    OK = "ok"
    DEGRADED = "degraded"
    INVALID = "invalid"
    SHED = "shed"
    ERROR = "error"


class Refusal(StrEnum):
    """Why admission refused a request (a metric label: a fixed set)."""

    LOOP_BEHIND = "loop_behind"  # the event loop stays behind: requests wait unread
    FULL = "full"  # every slot taken, and the line full or the worker full for a while
    NO_SLOT = "no_slot"  # waited in line, no slot came free in time


class EventPost(StrEnum):
    """What became of a caller's POST /events (a metric label: a fixed set)."""

    ACCEPTED = "accepted"  # within the caller's quota: handed to the route
    OVER_QUOTA = "over_quota"  # 429
    UNAUTHENTICATED = "unauthenticated"  # no caller's token, or off loopback with none set


class AnswerLogged(StrEnum):
    """What became of an answer offered to the answer log (a metric label: a fixed set)."""

    WRITTEN = "written"
    DROPPED = "dropped"  # the worker's buffer was full
    FAILED = "failed"  # Redis did not take the flush that held it


class ShadowOutcome(StrEnum):
    SCORED = "scored"
    SKIPPED = "skipped"  # too many shadow calls in flight already: the shadow never queues
    FAILED = "failed"


class ReloadOutcome(StrEnum):
    APPLIED = "applied"
    REFUSED = "refused"  # the new artifacts or versions failed a check; the old ones serve
    UNCHANGED = "unchanged"  # the files and versions read again were those served


class WorldChange(StrEnum):
    LOAD = "load"  # a candidate world started beside the stable one
    PROMOTE = "promote"  # the candidate made stable for everyone
    ROLLBACK = "rollback"  # the candidate dropped: the stable world answers everyone
