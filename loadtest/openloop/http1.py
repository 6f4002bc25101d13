"""A minimal HTTP/1.1 response reader, and what the load generator peeks at in a 200's body."""

from __future__ import annotations

import re
from typing import Final

_MAX_HEAD: Final = 64 * 1024
_HEX: Final = re.compile(rb"[0-9A-Fa-f]{1,15}")
_DEGRADED_KEY: Final = b'"degraded"'
# Group 1 matches only for an empty list: `"degraded": []` in any JSON spacing.
_DEGRADED: Final = re.compile(rb'"degraded"\s*:\s*\[\s*(\])?')
_ITEM_KEY: Final = b'"item_id"'


class ProtocolError(Exception):
    """The server's bytes cannot be read as an HTTP/1.x response."""


_HEAD, _LENGTH, _CHUNKED, _UNTIL_CLOSE = range(4)


class ResponseParser:
    """An incremental HTTP/1.x response reader: status, a few headers, the body.

    Framing follows RFC 9112: no body for 1xx, 204 and 304; Transfer-Encoding wins over
    Content-Length, and ends the body by chunks when its last coding is chunked, otherwise at
    the connection's close; without either the body also runs to the close. Interim 1xx
    responses are skipped. Anything else unreadable raises ProtocolError.
    """

    __slots__ = (
        "_buf",
        "_chunks",
        "_in_trailers",
        "_length",
        "_mode",
        "_pos",
        "body",
        "close",
        "extra",
        "retry_after",
        "status",
    )

    def __init__(self) -> None:
        self._buf = bytearray()
        self.reset()

    def reset(self) -> None:
        self._buf.clear()
        self._mode = _HEAD
        self._length = 0
        self._pos = 0
        self._chunks: list[bytes] = []
        self._in_trailers = False
        self.status = 0
        self.body = b""
        self.close = False  # the server will close, or must not be reused
        self.extra = False  # bytes came after the response: the connection can't be trusted
        self.retry_after = False

    def feed(self, data: bytes) -> bool:
        """Take more bytes; True once a whole response has been read."""
        self._buf += data
        if self._mode == _HEAD and not self._read_head():
            return False
        if self._mode == _LENGTH:
            return self._take_length()
        if self._mode == _CHUNKED:
            return self._take_chunks()
        return False  # _UNTIL_CLOSE: only the end of the connection ends the body

    def feed_eof(self) -> bool:
        """The connection ended; True when that completed a close-delimited response."""
        if self._mode != _UNTIL_CLOSE:
            return False
        self.body = bytes(self._buf)
        self._buf.clear()
        self.close = True
        return True

    def _read_head(self) -> bool:
        while True:
            end = self._buf.find(b"\r\n\r\n")
            if end < 0:
                if len(self._buf) > _MAX_HEAD:
                    raise ProtocolError("response head too long")
                return False
            head = bytes(self._buf[:end])
            del self._buf[: end + 4]
            self._parse_head(head)
            if not (100 <= self.status < 200):
                return True

    def _parse_head(self, head: bytes) -> None:
        self.retry_after = False  # an interim 1xx head may have come first
        lines = head.split(b"\r\n")
        version, _, rest = lines[0].partition(b" ")
        code = rest[:3]
        if not version.startswith(b"HTTP/1.") or len(code) != 3 or not code.isdigit():
            raise ProtocolError(f"bad status line {lines[0][:80]!r}")
        self.status = int(code)
        if self.status == 101:
            raise ProtocolError("unexpected 101 Switching Protocols")
        self.close = version == b"HTTP/1.0"
        length: int | None = None
        coding: bytes | None = None
        for line in lines[1:]:
            name, colon, value = line.partition(b":")
            if not colon:
                raise ProtocolError(f"bad header line {line[:80]!r}")
            name = name.strip().lower()
            if name == b"content-length":
                length = self._content_length(value, length)
            elif name == b"transfer-encoding":
                coding = value.rpartition(b",")[2].strip().lower()
            elif name == b"connection":
                tokens = {token.strip() for token in value.lower().split(b",")}
                self.close = b"close" in tokens or (self.close and b"keep-alive" not in tokens)
            elif name == b"retry-after":
                self.retry_after = True
        self._frame(length, coding)

    @staticmethod
    def _content_length(value: bytes, seen: int | None) -> int:
        value = value.strip()
        if not value.isdigit() or (seen is not None and int(value) != seen):
            raise ProtocolError(f"bad Content-Length {value[:40]!r}")
        return int(value)

    def _frame(self, length: int | None, coding: bytes | None) -> None:
        if self.status < 200 or self.status in (204, 304):
            self._mode, self._length = _LENGTH, 0
        elif coding == b"chunked":
            self._mode = _CHUNKED
        elif coding is not None or length is None:
            self._mode, self.close = _UNTIL_CLOSE, True
        else:
            self._mode, self._length = _LENGTH, length

    def _take_length(self) -> bool:
        if len(self._buf) < self._length:
            return False
        self.body = bytes(self._buf[: self._length])
        del self._buf[: self._length]
        self._done()
        return True

    def _take_chunks(self) -> bool:
        buf, pos = self._buf, self._pos
        while True:
            eol = buf.find(b"\r\n", pos)
            if eol < 0:
                if len(buf) - pos > _MAX_HEAD:
                    raise ProtocolError("chunk size line or trailer too long")
                self._pos = pos
                return False
            if self._in_trailers:
                if eol == pos:
                    self.body = b"".join(self._chunks)
                    del buf[: eol + 2]
                    self._done()
                    return True
                pos = eol + 2
                continue
            size_text = bytes(buf[pos:eol]).partition(b";")[0].strip()
            if not _HEX.fullmatch(size_text):
                raise ProtocolError(f"bad chunk size {size_text[:40]!r}")
            size = int(size_text, 16)
            if size == 0:
                self._in_trailers = True
                pos = eol + 2
                continue
            data_end = eol + 2 + size
            if len(buf) < data_end + 2:
                self._pos = pos  # read this size line again once the whole chunk is here
                return False
            if buf[data_end : data_end + 2] != b"\r\n":
                raise ProtocolError("chunk not followed by CRLF")
            self._chunks.append(bytes(buf[eol + 2 : data_end]))
            pos = data_end + 2

    def _done(self) -> None:
        # One request at a time per connection, so anything after the answer is garbage.
        if self._buf:
            self.extra = True


def is_degraded(body: bytes) -> bool:
    """Whether a 200 body lists degraded stages: a `"degraded"` key whose list is not empty.

    Byte matching instead of JSON parsing: the key is searched from the end (it comes after
    the items in the service's answer) and must be followed by `:` and `[`; only `[]`, in any
    JSON spacing, counts as not degraded. A body without the key is not degraded.
    """
    at = body.rfind(_DEGRADED_KEY)
    if at < 0:
        return False
    match = _DEGRADED.match(body, at) or _DEGRADED.search(body)
    return match is not None and match.group(1) is None


def count_items(body: bytes) -> int:
    """How many `"item_id"` keys a 200 body holds: one per item in the service's answer."""
    return body.count(_ITEM_KEY)
