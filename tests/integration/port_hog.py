"""A process that takes ports from the kernel's ephemeral range as fast as they come free.

It holds `count` sockets bound to port 0 (the kernel's choice, as any server asking for port 0
gets) and keeps binding: each round closes its oldest and binds as many again, so a port that
another process chose and released is soon bound here. Beside that, a thread keeps opening
and closing outgoing connections to a listener of its own. Run as a script: it prints
"holding N" once it holds its share, and runs until it is killed.
"""

from __future__ import annotations

import collections
import contextlib
import resource
import socket
import sys
import threading
import time

ROUND = 100


def _connections(target: tuple[str, int]) -> None:
    while True:
        with socket.socket() as out, contextlib.suppress(OSError):
            out.connect(target)
        # About a thousand connections a second: churn enough, without a core of CPU that the
        # servers starting beside the hog (and a loaded CI machine) would miss.
        time.sleep(0.001)


def _accept(server: socket.socket) -> None:
    while True:
        conn, _ = server.accept()
        conn.close()


def hog(count: int) -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1024)
    threading.Thread(target=_accept, args=(server,), daemon=True).start()
    threading.Thread(target=_connections, args=(server.getsockname(),), daemon=True).start()
    held: collections.deque[socket.socket] = collections.deque()
    said = False
    while True:
        full = len(held) >= count
        if not full:
            try:
                sock = socket.socket()
            except OSError:  # out of files before the count: hold what it has
                count = len(held)
                continue
            try:
                sock.bind(("127.0.0.1", 0))
                held.append(sock)
                continue
            except OSError:  # the range is full before the count
                sock.close()
        if not said:
            print(f"holding {len(held)}", flush=True)
            said = True
        _close(held, ROUND)


def _close(held: collections.deque[socket.socket], count: int) -> None:
    for _ in range(min(count, len(held))):
        held.popleft().close()
    time.sleep(0.001)  # a round a millisecond takes a released port soon enough


if __name__ == "__main__":
    hog(int(sys.argv[1]))
