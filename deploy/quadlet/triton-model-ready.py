"""Exit 0 when Triton says the model is ready, 1 otherwise: the Triton container's health check.

    python3 triton-model-ready.py HOST:PORT MODEL [VERSION]

Triton runs with HTTP off, so readiness is asked over gRPC (ModelReady). The Triton image has
python3 but no gRPC client, so this speaks just enough HTTP/2 for one unary call, with the
standard library only: the client preface, SETTINGS, one HEADERS frame (HPACK literals, no
Huffman), one DATA frame, then it reads frames until the response's trailers or an error.
"""

from __future__ import annotations

import socket
import struct
import sys

DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY = 0x0, 0x1, 0x3, 0x4, 0x6, 0x7
END_STREAM, ACK, END_HEADERS, PADDED = 0x1, 0x1, 0x4, 0x8
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
PATH = "/inference.GRPCInferenceService/ModelReady"
TIMEOUT_S = 3.0


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return (
        struct.pack(">I", len(payload))[1:]
        + bytes([kind, flags])
        + struct.pack(">I", stream)
        + payload
    )


def hpack_literal(name: str, value: str) -> bytes:
    """A header field as a literal without indexing, new name, no Huffman coding."""
    out = b"\x00"
    for text in (name, value):
        raw = text.encode()
        if len(raw) >= 127:
            raise ValueError(f"header too long: {text!r}")
        out += bytes([len(raw)]) + raw
    return out


def proto_string(field: int, text: str) -> bytes:
    raw = text.encode()
    if len(raw) >= 128:
        raise ValueError(f"too long: {text!r}")
    return bytes([field << 3 | 2, len(raw)]) + raw


def request(authority: str, model: str, version: str) -> bytes:
    message = proto_string(1, model) + (proto_string(2, version) if version else b"")
    headers = b"".join(
        hpack_literal(name, value)
        for name, value in (
            (":method", "POST"),
            (":scheme", "http"),
            (":path", PATH),
            (":authority", authority),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
        )
    )
    body = b"\x00" + struct.pack(">I", len(message)) + message
    return (
        PREFACE
        + frame(SETTINGS, 0, 0)
        + frame(HEADERS, END_HEADERS, 1, headers)
        + frame(DATA, END_STREAM, 1, body)
    )


def read_exact(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError("connection closed")
        data += chunk
    return data


def model_ready(address: str, model: str, version: str = "") -> bool:
    host, _, port = address.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=TIMEOUT_S) as sock:
        sock.settimeout(TIMEOUT_S)
        sock.sendall(request(address, model, version))
        response = b""
        while True:
            head = read_exact(sock, 9)
            length = int.from_bytes(head[:3], "big")
            kind, flags = head[3], head[4]
            stream = int.from_bytes(head[5:9], "big") & 0x7FFFFFFF
            payload = read_exact(sock, length)
            if kind == SETTINGS and not flags & ACK:
                sock.sendall(frame(SETTINGS, ACK, 0))
            elif kind == PING and not flags & ACK:
                sock.sendall(frame(PING, ACK, 0, payload))
            elif kind == GOAWAY or (kind == RST_STREAM and stream == 1):
                return False
            elif kind == DATA and stream == 1:
                if flags & PADDED:
                    payload = payload[1 : len(payload) - payload[0]]
                response += payload
                if flags & END_STREAM:
                    break
            elif kind == HEADERS and stream == 1 and flags & END_STREAM:
                break
    # One gRPC message (5-byte prefix) holding ModelReadyResponse: `bool ready = 1`, so
    # b"\x08\x01" when ready; an error status comes with no message at all.
    return response[5:7] == b"\x08\x01"


def main(argv: list[str]) -> int:
    if len(argv) not in (3, 4):
        print(__doc__, file=sys.stderr)
        return 2
    try:
        ready = model_ready(argv[1], argv[2], argv[3] if len(argv) == 4 else "")
    except (OSError, ValueError) as exc:
        print(f"not ready: {exc}", file=sys.stderr)
        return 1
    if not ready:
        print(f"not ready: model {argv[2]}", file=sys.stderr)
    return 0 if ready else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
