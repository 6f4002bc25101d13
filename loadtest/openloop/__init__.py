"""Open-loop HTTP load generator: a fixed schedule of requests, latency timed from the schedule.

A closed-loop generator (N workers, each sending its next request when the previous answer
arrives) slows down exactly when the server does, so it under-reports latency and never shows
what a real stream of users does to a struggling service ("coordinated omission"). Here the
send times are fixed before the run: request i is due at offset i/rate (or at the i-th arrival
of a seeded Poisson process), whatever the server is doing. A request that has to wait for a
free connection, or is sent late because the generator was busy, still has its latency counted
from its due time, so queueing anywhere between the user and the answer shows up.

The client is raw HTTP/1.1 over asyncio Protocols on a pool of keep-alive connections: no task,
no HTTP library and no JSON parsing per request, so one core can offer several thousand
requests per second while the service under test keeps the other. The schedule, the timeout
scan and the connection pool are plain loop callbacks; only opening a connection is a task.

Per request a `Record` keeps the status, an error kind, the latency, whether a 200 was degraded
and how many items it held. `summarize` turns a run into counts, rates, nearest-rank latency
percentiles and a time series of windows; `recovery_time` says how long after an event the
answers were clean again for a while; `sweep` finds the highest rate meeting a p99 bound.
The command line runs on uvloop when it is installed; `run` works in any asyncio loop.

The rooms: request.py (the load and its records), http1.py (reading responses),
connection.py, runner.py (the schedule and the pool), stats.py, sweep.py and cli.py.

    python -m loadtest.openloop --url http://127.0.0.1:8080/recommend --rate 200 --duration 10
    python -m loadtest.openloop --url http://127.0.0.1:8080/recommend --duration 10 \\
        --sweep 100,200,400,800 --p99-ms 50
"""

from recsys_tools.measure import percentile, schedule

from loadtest.openloop.cli import demo_bodies, demo_users, parse_header
from loadtest.openloop.connection import Connection
from loadtest.openloop.http1 import ProtocolError, ResponseParser, count_items, is_degraded
from loadtest.openloop.request import (
    CONNECT,
    ERROR_KINDS,
    PROTOCOL,
    RESET,
    TIMEOUT,
    Bodies,
    Load,
    Record,
    RequestBytes,
    RunResult,
    Target,
    parse_url,
)
from loadtest.openloop.runner import run
from loadtest.openloop.stats import (
    Latency,
    Summary,
    Window,
    is_good,
    latency_of,
    recovery_time,
    summarize,
    windows_of,
)
from loadtest.openloop.sweep import SweepPoint, SweepResult, passes, sweep

__all__ = [
    "CONNECT",
    "ERROR_KINDS",
    "PROTOCOL",
    "RESET",
    "TIMEOUT",
    "Bodies",
    "Connection",
    "Latency",
    "Load",
    "ProtocolError",
    "Record",
    "RequestBytes",
    "ResponseParser",
    "RunResult",
    "Summary",
    "SweepPoint",
    "SweepResult",
    "Target",
    "Window",
    "count_items",
    "demo_bodies",
    "demo_users",
    "is_degraded",
    "is_good",
    "latency_of",
    "parse_header",
    "parse_url",
    "passes",
    "percentile",
    "recovery_time",
    "run",
    "schedule",
    "summarize",
    "sweep",
    "windows_of",
]
