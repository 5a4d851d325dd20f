"""Byte-level HTTP/1.1 recorder placed between the gate and Chroma.

It forwards every request unchanged and keeps what went over the wire (request
line, headers as sent, framing, decoded body), so a test can prove from the
upstream side that a refused write never reached the store, and that admitted
writes arrive with a fresh Content-Length and no Transfer-Encoding / Expect.
Stdlib only; one upstream connection per downstream connection, so the gate's
keep-alive reuse is preserved.
"""

from __future__ import annotations

import json
import socket
import threading
from dataclasses import dataclass, field
from typing import Any, Optional


class _Closed(Exception):
    pass


class _Reader:
    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.buf = b""

    def _fill(self) -> None:
        data = self.sock.recv(1 << 16)
        if not data:
            raise _Closed()
        self.buf += data

    def until(self, marker: bytes) -> bytes:
        while marker not in self.buf:
            self._fill()
        i = self.buf.index(marker) + len(marker)
        out, self.buf = self.buf[:i], self.buf[i:]
        return out

    def exact(self, n: int) -> bytes:
        while len(self.buf) < n:
            self._fill()
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def rest(self) -> bytes:
        parts = [self.buf]
        self.buf = b""
        while True:
            data = self.sock.recv(1 << 16)
            if not data:
                return b"".join(parts)
            parts.append(data)


def _parse_head(raw: bytes) -> tuple[str, list[tuple[str, str]]]:
    lines = raw.decode("latin-1").split("\r\n")
    headers = []
    for line in lines[1:]:
        if line:
            k, _, v = line.partition(":")
            headers.append((k, v.strip()))
    return lines[0], headers


def _hget(headers: list[tuple[str, str]], name: str) -> Optional[str]:
    for k, v in headers:
        if k.lower() == name:
            return v
    return None


def _read_body(reader: _Reader, headers: list[tuple[str, str]]) -> tuple[bytes, bytes, str]:
    """(bytes as framed on the wire, decoded body, framing name)."""
    te = _hget(headers, "transfer-encoding")
    if te and "chunked" in te.lower():
        raw, body = b"", b""
        while True:
            line = reader.until(b"\r\n")
            raw += line
            size = int(line.split(b";")[0].strip(), 16)
            if size == 0:
                while True:
                    t = reader.until(b"\r\n")
                    raw += t
                    if t == b"\r\n":
                        return raw, body, "chunked"
            chunk = reader.exact(size + 2)
            raw += chunk
            body += chunk[:-2]
    cl = _hget(headers, "content-length")
    if cl is not None:
        data = reader.exact(int(cl))
        return data, data, "content-length"
    return b"", b"", "none"


@dataclass
class Exchange:
    """One request the upstream received, and the status it answered."""

    method: str
    target: str
    headers: list[tuple[str, str]]
    framing: str
    body: bytes
    status: int = 0
    response_body: bytes = b""
    conn: int = 0

    @property
    def path(self) -> str:
        return self.target.split("?", 1)[0]

    def header(self, name: str) -> Optional[str]:
        return _hget(self.headers, name.lower())

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Recorder:
    upstream: tuple[str, int]
    exchanges: list[Exchange] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _sock: Optional[socket.socket] = None
    _conns: int = 0

    def start(self) -> int:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", 0))
        s.listen(128)
        self._sock = s
        threading.Thread(target=self._accept, daemon=True).start()
        return s.getsockname()[1]

    def stop(self) -> None:
        if self._sock is not None:
            self._sock.close()

    def requests(self, path_contains: str = "", method: Optional[str] = None) -> list[Exchange]:
        with self._lock:
            return [
                e
                for e in self.exchanges
                if path_contains in e.path and (method is None or e.method == method)
            ]

    def bodies_contain(self, needle: str, path_contains: str = "") -> bool:
        """True if any request body seen upstream (on matching paths) holds `needle`."""
        n = needle.encode()
        return any(n in e.body for e in self.requests(path_contains))

    def _accept(self) -> None:
        assert self._sock is not None
        while True:
            try:
                c, _ = self._sock.accept()
            except OSError:
                return
            with self._lock:
                self._conns += 1
                conn = self._conns
            threading.Thread(target=self._serve, args=(c, conn), daemon=True).start()

    def _serve(self, client: socket.socket, conn: int) -> None:
        try:
            up = socket.create_connection(self.upstream)
        except OSError:
            client.close()
            return
        cr, ur = _Reader(client), _Reader(up)
        try:
            while True:
                head = cr.until(b"\r\n\r\n")
                start, headers = _parse_head(head)
                method, target = start.split(" ")[0], start.split(" ")[1]
                ex = Exchange(method, target, headers, "none", b"", conn=conn)
                fwd_head = head
                if (_hget(headers, "expect") or "").lower() == "100-continue":
                    # Recorded as sent; answered here so the body still comes.
                    client.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
                    fwd_head = b"".join(
                        l + b"\r\n"
                        for l in head[:-4].split(b"\r\n")
                        if not l.lower().startswith(b"expect:")
                    ) + b"\r\n"
                raw, ex.body, ex.framing = _read_body(cr, headers)
                with self._lock:
                    self.exchanges.append(ex)
                up.sendall(fwd_head + raw)

                rhead = ur.until(b"\r\n\r\n")
                rstart, rheaders = _parse_head(rhead)
                ex.status = int(rstart.split(" ")[1])
                close_after = False
                if method == "HEAD" or ex.status in (204, 304) or ex.status < 200:
                    rraw = b""
                elif _hget(rheaders, "transfer-encoding") or _hget(rheaders, "content-length"):
                    rraw, ex.response_body, _ = _read_body(ur, rheaders)
                else:
                    rraw = ex.response_body = ur.rest()
                    close_after = True
                client.sendall(rhead + rraw)
                if close_after or (_hget(headers, "connection") or "").lower() == "close":
                    return
        except (_Closed, OSError):
            return
        finally:
            for s in (client, up):
                try:
                    s.close()
                except OSError:
                    pass
