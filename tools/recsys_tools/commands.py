"""How a command reaches `recsys`: every module that owns commands has one `register`.

`register(commands)` adds the module's command (or group) to the top-level subparsers and
points each at its handler through `set_defaults(run=...)`; cli.py lists the modules once.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TypeAlias

# A string: argparse's class is generic to type checkers only.
Commands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
Register: TypeAlias = Callable[[Commands], None]
