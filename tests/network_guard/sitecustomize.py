"""Loaded by every Python process the tests start (the tests put this folder on PYTHONPATH): any connection
beyond this machine fails loudly, so a script that reaches for the internet cannot pass the suite. Loopback stays
open for torch.distributed's gloo and accelerate's rendezvous."""

import socket

_connect = socket.socket.connect
_LOCAL = ("127.0.0.1", "localhost", "::1", "0.0.0.0")


def _guarded_connect(sock, address):
    host = address[0] if isinstance(address, tuple) else address
    if sock.family == socket.AF_UNIX or host in _LOCAL or str(host).startswith("127."):
        return _connect(sock, address)
    raise OSError(f"network access blocked by the sinebert test suite: connection to {address!r}")


socket.socket.connect = _guarded_connect
