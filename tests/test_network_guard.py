"""The suite really runs offline: connections beyond loopback fail, here and in every subprocess."""

import socket
import subprocess
import sys

import pytest


def test_connections_beyond_loopback_fail_in_this_process():
    with pytest.raises(OSError, match="network access blocked"):
        socket.create_connection(("93.184.216.34", 80), timeout=1)


def test_connections_beyond_loopback_fail_in_subprocesses():
    code = "import socket\ntry:\n    socket.create_connection(('93.184.216.34', 80), timeout=1)\nexcept OSError as e:\n    print(e)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "network access blocked" in result.stdout


def test_loopback_stays_open():
    server = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(server.getsockname(), timeout=5)
    client.close()
    server.close()
