"""What systemd receives on ``$NOTIFY_SOCKET``: the sd_notify datagrams, parsed."""
from __future__ import annotations

import socket


class FakeSystemd:
    """The receiving end of ``$NOTIFY_SOCKET``: a bound unix datagram socket (``@name``: abstract).

    Each datagram is read as systemd does: ``KEY=value`` lines, one dict per datagram.
    """

    def __init__(self, address: str) -> None:
        self.address = address
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind("\0" + address[1:] if address.startswith("@") else address)

    def recv(self, timeout_s: float = 20.0) -> dict[str, str]:
        """The next message; waits up to ``timeout_s`` (raises ``TimeoutError`` past it)."""
        self.sock.settimeout(timeout_s)
        data = self.sock.recv(4096).decode()
        return dict(line.split("=", 1) for line in data.splitlines())

    def pending(self) -> list[dict[str, str]]:
        """Every message already queued, without waiting."""
        out: list[dict[str, str]] = []
        while True:
            try:
                self.sock.settimeout(0.0)
                data = self.sock.recv(4096).decode()
            except BlockingIOError:
                return out
            out.append(dict(line.split("=", 1) for line in data.splitlines()))
