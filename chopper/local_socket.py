"""The agent's ``SOCK_SEQPACKET`` sockets beside its unix socket, from the trainer's side.

Where the target is the agent's unix socket, the marker client sends its markers on the marker
socket (``agent.marker_socket``) and holds its ``Control`` stream on the control socket
(``agent.control_socket``), each a file beside the unix socket (``chopper.schema``); where either
cannot be reached (a TCP target, an agent without it, a restart), gRPC carries that stream.
"""
from __future__ import annotations

import os
import socket

# How long a connect may wait on a full backlog before gRPC carries the stream instead, seconds.
CONNECT_TIMEOUT_S = 1.0


def unix_path(target: str) -> str:
    """The socket file of a ``unix:`` target; "" for any other."""
    for scheme in ("unix://", "unix:"):
        if target.startswith(scheme):
            return target[len(scheme):]
    return ""


def connect(path: str) -> socket.socket | None:
    """A blocking connection to the ``SOCK_SEQPACKET`` socket at ``path``; None when there is none to reach.

    None for an empty ``path``, a missing socket (an agent without one, or restarting) or a backlog
    still full after ``CONNECT_TIMEOUT_S``.
    """
    if not path:
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        sock.settimeout(CONNECT_TIMEOUT_S)
        sock.connect(os.fsencode(path))
        sock.settimeout(None)  # sends and receives block their thread only; a shutdown() unblocks them
    except OSError:
        sock.close()
        return None
    return sock
