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


def test_name_lookups_beyond_this_machine_fail_and_are_recorded(tmp_path, monkeypatch):
    log = tmp_path / "network.log"
    monkeypatch.setenv("SINEBERT_NETWORK_LOG", str(log))
    with pytest.raises(socket.gaierror, match="name lookup blocked"):
        socket.getaddrinfo("huggingface.co", 443)
    assert log.read_text() == "lookup 'huggingface.co'\n"


@pytest.mark.slow
def test_scripts_on_local_files_contact_nothing_even_without_the_offline_variables(tmp_path, text_corpus):
    """Without HF_HUB_OFFLINE / HF_DATASETS_OFFLINE, as a user runs them: no lookup, no connection."""
    import os

    from tests.conftest import ROOT

    log = tmp_path / "network.log"
    env = {k: v for k, v in os.environ.items() if not k.endswith("_OFFLINE")} | {"SINEBERT_NETWORK_LOG": str(log)}
    runs = [["train_tokenizer.py", "--vocab_size", "300", "--output_dir", tmp_path / "tok"],
            ["pretrain.py", "--tokenizer_name", tmp_path / "tok", "--hidden_size", 32, "--num_hidden_layers", 1,
             "--num_attention_heads", 2, "--intermediate_size", 64, "--max_seq_length", 32, "--max_train_steps", 2,
             "--output_dir", tmp_path / "mlm"]]
    for script, *args in runs:
        command = [sys.executable, str(ROOT / "scripts" / script), "--train_file", str(text_corpus / "train.txt"),
                   *map(str, args)]
        result = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
        assert result.returncode == 0, result.stderr[-3000:]
    assert not log.exists(), log.read_text()
