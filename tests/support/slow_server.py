"""A model server too slow to wait for: the fake of the remote edge that deadline tests hold against.

`Trickle` is a TCP listener on 127.0.0.1 (a thread per connection) that reads one request and
then sends its canned HTTP reply one byte per `interval_s`, after sending the first `at_once`
bytes whole, and ends the connection; `reply=None` accepts and never answers. It stands in for a real server that is
overloaded, stuck mid-reply, or behind a proxy that dribbles: a client whose timeout is per read
(urllib's) never ends against it, a client whose deadline is the whole request's does.

    with Trickle(http_reply(b'{"data": []}'), at_once=0) as server:
        probe(server.url, "completions", timeout_s=0.5)      # ServerUnavailable after ~0.5 s
"""
from __future__ import annotations

import socket
import threading


def http_reply(body: bytes, status: str = "200 OK", content_type: str = "application/json") -> bytes:
    return (f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n").encode() + body


class Trickle:
    def __init__(self, reply: bytes | None, *, at_once: int = 0, interval_s: float = 0.05):
        self.reply, self.at_once, self.interval_s = reply, at_once, interval_s
        self.stopping = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.threads: list[threading.Thread] = []
        self.connections: list[socket.socket] = []

    def __enter__(self) -> "Trickle":
        self.threads.append(threading.Thread(target=self._accept, daemon=True))
        self.threads[0].start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        try:
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept (close alone does not)
        except OSError:
            pass
        self.listener.close()
        for connection in list(self.connections):
            connection.close()
        for thread in self.threads:
            thread.join(10)

    def _accept(self) -> None:
        while not self.stopping.is_set():
            try:
                connection, _ = self.listener.accept()
            except OSError:  # closed by __exit__
                return
            self.connections.append(connection)
            thread = threading.Thread(target=self._answer, args=(connection,), daemon=True)
            self.threads.append(thread)
            thread.start()

    def _answer(self, connection: socket.socket) -> None:
        try:
            connection.recv(1 << 16)  # the request (small: a GET or a short POST)
            if self.reply is None:
                self.stopping.wait()
                return
            connection.sendall(self.reply[:self.at_once])
            for i in range(self.at_once, len(self.reply)):
                if self.stopping.wait(self.interval_s):
                    return
                connection.sendall(self.reply[i:i + 1])
            connection.shutdown(socket.SHUT_WR)  # the whole reply sent: a reply cut short ends here
        except OSError:  # the client gave up and closed: what a deadline does
            return
