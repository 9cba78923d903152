"""A TCP proxy that can stall: the network between the engine and PostgreSQL stops passing bytes.

Once :meth:`StallingProxy.stall` is called, nothing goes through in either
direction and nothing is closed: every socket stays open, new connections are
accepted and never answered. To the engine this is a partition (or a frozen
server, or a middlebox that hung): no error ever arrives, only silence.
"""

from __future__ import annotations

import select
import socket
import threading


class StallingProxy:
    """Forwards 127.0.0.1:<port> to ``target`` until stalled; a thread of its own (daemon)."""

    def __init__(self, target: tuple[str, int]) -> None:
        self._target = target
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._stalled = threading.Event()
        self._sockets: list[socket.socket] = []  # kept open for ever, once stalled
        threading.Thread(target=self._accept, name="stalling proxy", daemon=True).start()

    def url(self, url: str) -> str:
        """``url`` (a postgresql:// URL to ``target``) going through this proxy instead."""
        host, port = self._target
        return url.replace(f"@{host}:{port}/", f"@127.0.0.1:{self.port}/", 1)

    def stall(self) -> None:
        self._stalled.set()

    def _accept(self) -> None:
        while True:
            client, _ = self._listener.accept()
            self._sockets.append(client)
            if self._stalled.is_set():
                continue  # accepted, never answered
            server = socket.create_connection(self._target)
            self._sockets.append(server)
            threading.Thread(target=self._forward, args=(client, server), daemon=True).start()

    def _forward(self, client: socket.socket, server: socket.socket) -> None:
        peers = {client: server, server: client}
        while not self._stalled.is_set():
            readable, _, _ = select.select(list(peers), [], [], 0.05)
            if self._stalled.is_set():
                break
            for source in readable:
                data = source.recv(65536)
                if not data:  # one side closed before the stall: an ordinary end
                    client.close()
                    server.close()
                    return
                peers[source].sendall(data)
        self._stalled.wait()  # stalled: hold both sockets open, pass nothing
