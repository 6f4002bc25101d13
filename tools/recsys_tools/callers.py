"""`recsys event-caller NAME`: a new token for a caller of /events, and its list entry.

The token goes to the caller (the frontend or backend that posts events) and nowhere else;
the entry (`NAME=sha256:...`) joins RECSYS_EVENT_CALLERS, comma-separated: the service
keeps only the digest.
"""

from __future__ import annotations

import argparse

from app.core.callers import entry, new_token, parse_callers
from app.core.errors import ConfigError
from recsys_tools.commands import Commands


def _run(args: argparse.Namespace) -> None:
    token = new_token()
    line = entry(args.name, token)
    try:
        parse_callers(line)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    print(f"token (give it to {args.name} only): {token}")
    print(f"entry (add it to RECSYS_EVENT_CALLERS): {line}")


def register(commands: Commands) -> None:
    caller = commands.add_parser(
        "event-caller",
        help="a new token for a caller of /events, and its entry",
        description=__doc__,
    )
    caller.add_argument("name", help="lower-case letters, digits, - and _; metrics carry it")
    caller.set_defaults(run=_run)
