"""Loaded by every Python process the tests start (the tests put this folder on PYTHONPATH): any connection
beyond this machine, and any lookup of a host name that is not this machine's, fails loudly, so a script that
reaches for the internet cannot pass the suite. Loopback stays open for torch.distributed's gloo and accelerate's
rendezvous. Libraries that swallow the error (a download counter, say) are still caught: every attempt is also
appended to the file SINEBERT_NETWORK_LOG names, which a test reads."""

import ipaddress
import os
import socket

_connect = socket.socket.connect
_getaddrinfo = socket.getaddrinfo
_LOCAL = ("127.0.0.1", "localhost", "::1", "0.0.0.0", "", None, socket.gethostname())


def _local(host) -> bool:
    return host in _LOCAL or str(host).startswith("127.")


def _record(what: str):
    log = os.environ.get("SINEBERT_NETWORK_LOG")
    if log:
        with open(log, "a", encoding="utf-8") as file:
            file.write(what + "\n")


def _guarded_connect(sock, address):
    host = address[0] if isinstance(address, tuple) else address
    if sock.family == socket.AF_UNIX or _local(host):
        return _connect(sock, address)
    _record(f"connect {address!r}")
    raise OSError(f"network access blocked by the sinebert test suite: connection to {address!r}")


def _numeric(host) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _guarded_getaddrinfo(host, *args, **kwargs):
    name = host.decode() if isinstance(host, bytes) else host
    if _local(name) or _numeric(name):  # an address is no lookup; connecting to it is guarded above
        return _getaddrinfo(host, *args, **kwargs)
    _record(f"lookup {host!r}")
    raise socket.gaierror(socket.EAI_NONAME, f"name lookup blocked by the sinebert test suite: {host!r}")


socket.socket.connect = _guarded_connect
socket.getaddrinfo = _guarded_getaddrinfo
