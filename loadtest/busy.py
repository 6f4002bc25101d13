"""Run a command beside processes that keep cores busy: the suite on a machine half taken.

    python -m loadtest.busy [--cores N] -- COMMAND ARGS...

The spinners start before the command and are stopped, by pid, when it ends however it
ends; the exit status is the command's.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Sequence

SPIN = "while True: pass"


def run_beside_busy_cores(command: Sequence[str], cores: int) -> int:
    spinners = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(cores)]
    try:
        return subprocess.call(list(command))
    finally:
        for spinner in spinners:
            spinner.kill()
        for spinner in spinners:
            spinner.wait()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.busy", description=__doc__)
    parser.add_argument("--cores", type=int, default=1, help="cores to keep busy (default 1)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND ARGS...")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to run after --")
    return run_beside_busy_cores(command, args.cores)


if __name__ == "__main__":
    sys.exit(main())
