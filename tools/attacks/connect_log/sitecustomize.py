"""Loaded by the attacked server (the attack suite puts this folder on its PYTHONPATH): every
`connect()` to an address other than loopback or a local socket is written to the file named by
SPECVIZ_CONNECT_LOG and refused, so an attack can count the connections a request caused, and
nothing leaves the machine even where the app would have fetched."""

from __future__ import annotations

import os
import socket

_LOG = os.environ.get("SPECVIZ_CONNECT_LOG")


def _outside(address: object) -> bool:
    host = address[0] if isinstance(address, tuple) else str(address)
    return host not in ("127.0.0.1", "::1", "localhost") and not str(address).startswith("/")


def _record(address: object) -> None:
    with open(_LOG, "a", encoding="utf-8") as log:  # type: ignore[arg-type]
        log.write(f"{address!r}\n")


if _LOG:
    _connect, _connect_ex = socket.socket.connect, socket.socket.connect_ex

    def _guarded(sock: socket.socket, address: object) -> None:
        if _outside(address):
            _record(address)
            raise ConnectionRefusedError(f"attack suite: no connection to {address}")
        return _connect(sock, address)

    def _guarded_ex(sock: socket.socket, address: object) -> int:
        if _outside(address):
            _record(address)
            return 111  # ECONNREFUSED
        return _connect_ex(sock, address)

    socket.socket.connect = _guarded  # type: ignore[method-assign]
    socket.socket.connect_ex = _guarded_ex  # type: ignore[method-assign]
