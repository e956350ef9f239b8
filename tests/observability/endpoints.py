"""Misbehaving endpoints on loopback: one that accepts and never answers, and a closed port."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def hanging_listener() -> Iterator[tuple[str, list[socket.socket]]]:
    """``(http://127.0.0.1:<port>, accepted connections)`` of a socket that accepts every
    connection and never answers (until the test ends)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    held: list[socket.socket] = []
    done = threading.Event()

    def accept() -> None:
        server.settimeout(0.1)
        while not done.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            held.append(conn)  # kept open, never answered

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}", held
    finally:
        done.set()
        thread.join()
        for conn in held:
            conn.close()
        server.close()


def closed_port() -> str:
    """``http://127.0.0.1:<port>`` where nothing listens (the port was just released)."""
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    return f"http://127.0.0.1:{port}"
