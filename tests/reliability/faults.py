"""Faults injected into real peers: a broker paused by signal, a network path to a server cut and restored.

A paused broker (SIGSTOP) is what a hung or partitioned Kafka looks like to its clients: connections stay
open and nothing answers, then everything resumes with the data intact (SIGCONT). A TCP forwarder in front
of PostgreSQL or the v3io server lets a test take the server away from the clients (existing connections
reset, new ones refused) and give it back, without stopping the shared server itself.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
from collections.abc import Iterator

from dagster_streamgroup.local import procfs


@contextlib.contextmanager
def paused(pid: int | None) -> Iterator[None]:
    """The process stopped (SIGSTOP) for the block, continued (SIGCONT) after it, also when the block raises."""
    assert pid is not None, "only a process this test started can be paused"
    os.kill(pid, signal.SIGSTOP)
    try:
        procfs.wait_until_stopped(pid)
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


class TcpForwarder:
    """Listens on a free 127.0.0.1 port and forwards every connection to ``target``; ``cut()`` drops every
    connection and refuses new ones until ``restore()`` listens again on the same port."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._listener: socket.socket | None = None
        self.port = self._listen(0)

    def _listen(self, port: int) -> int:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()
        bound: int = listener.getsockname()[1]
        return bound

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # the listener was closed by cut() or close()
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                self._sockets.update((client, upstream))
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
            with self._lock:
                self._sockets.difference_update((source, sink))

    def cut(self) -> None:
        """Refuse new connections and reset every open one, as a server that went away."""
        if self._listener is not None:
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() blocked on it; close() alone does not
            self._listener.close()
            self._listener = None
        with self._lock:
            sockets = list(self._sockets)
            self._sockets.clear()
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def restore(self) -> None:
        if self._listener is None:
            self._listen(self.port)

    def close(self) -> None:
        self.cut()
