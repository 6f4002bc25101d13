"""One keep-alive connection of the pool, as an asyncio Protocol: no task per request."""

from __future__ import annotations

import asyncio
from typing import Protocol, cast

from loadtest.openloop.http1 import ProtocolError, ResponseParser
from loadtest.openloop.request import PROTOCOL


class Pool(Protocol):
    """What a connection tells the run that owns it (runner.Run)."""

    connections: set[Connection]

    def answered(self, conn: Connection) -> None: ...
    def failed(self, conn: Connection, kind: str) -> None: ...
    def lost(self, conn: Connection) -> None: ...
    def unsolicited(self, conn: Connection) -> None: ...


class Connection(asyncio.Protocol):
    __slots__ = ("current", "idle_since", "parser", "run", "transport")

    def __init__(self, run: Pool) -> None:
        self.run = run
        self.parser = ResponseParser()
        self.current = -1  # index of the request it carries, -1 when idle
        self.idle_since = 0.0
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.transport = cast(asyncio.Transport, transport)
        self.run.connections.add(self)

    def data_received(self, data: bytes) -> None:
        if self.current < 0:
            self.run.unsolicited(self)
            return
        try:
            complete = self.parser.feed(data)
        except ProtocolError:
            self.run.failed(self, PROTOCOL)
            return
        if complete:
            self.run.answered(self)

    def eof_received(self) -> bool | None:
        return None  # close our side too; connection_lost settles any request

    def connection_lost(self, exc: Exception | None) -> None:
        self.run.lost(self)

    def send(self, index: int, data: bytes) -> None:
        assert self.transport is not None
        self.current = index
        self.parser.reset()
        self.transport.write(data)

    def shut(self, *, abort: bool) -> None:
        self.current = -1
        if self.transport is not None:
            if abort:
                self.transport.abort()
            else:
                self.transport.close()
