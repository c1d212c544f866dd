"""Untrusted files run no code: pickle weights are refused unless asked for, and a crafted pickle inside a
checkpoint is rejected instead of executed."""

import hashlib
import json
import os
import pickle

import pytest
import torch

from sinebert import SineBertForMaskedLM
from tests.conftest import load_script, tiny_config, user_error

pretrain = load_script("pretrain")


class Exploit:
    """Unpickling this runs a shell command: what a malicious checkpoint would contain."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.fixture
def corpus(tmp_path, sentences):
    (tmp_path / "train.txt").write_text("\n".join(sentences[:300]) + "\n")
    return ["--train_file", tmp_path / "train.txt", "--validation_split_percentage", 10, "--max_seq_length", 32,
            "--per_device_train_batch_size", 4, "--logging_steps", 1]


def test_pickle_weights_are_refused_unless_allowed(tmp_path, capsys, corpus, tokenizer_dir):
    folder = tmp_path / "pickled"
    model = SineBertForMaskedLM(tiny_config(vocab_size=600))
    model.config.save_pretrained(folder)
    torch.save(model.state_dict(), folder / "pytorch_model.bin")
    argv = [*corpus, "--model_name_or_path", folder, "--tokenizer_name", tokenizer_dir, "--max_train_steps", 1]
    message = user_error(capsys, pretrain, [*argv, "--output_dir", tmp_path / "a"])
    assert "holds only pickle weights" in message and "--allow_pickle_weights" in message
    pretrain.main([str(a) for a in [*argv, "--output_dir", tmp_path / "b", "--allow_pickle_weights"]])
    assert (tmp_path / "b" / "model.safetensors").is_file()


def test_crafted_pickle_in_a_checkpoint_is_not_executed(tmp_path, capsys, corpus, tokenizer_dir):
    out = tmp_path / "run"
    argv = [*corpus, "--tokenizer_name", tokenizer_dir, "--hidden_size", 32, "--num_hidden_layers", 1,
            "--num_attention_heads", 2, "--intermediate_size", 64, "--max_train_steps", 2, "--checkpointing_steps", 1,
            "--output_dir", out]
    pretrain.main([str(a) for a in argv])
    checkpoint = out / "checkpoints" / "step_00000002"
    marker = tmp_path / "exploited"
    for name in ("optimizer.bin", "random_states_0.pkl"):
        (checkpoint / name).write_bytes(pickle.dumps({"state": Exploit(marker)}))
    # Forge the manifest too, as an attacker who publishes a checkpoint would.
    manifest = json.loads((checkpoint / "manifest.json").read_text())
    for name, entry in manifest["files"].items():
        data = (checkpoint / name).read_bytes()
        entry.update(size=len(data), sha256=hashlib.sha256(data).hexdigest())
    (checkpoint / "manifest.json").write_text(json.dumps(manifest))
    message = user_error(capsys, pretrain, [*argv, "--resume_from_checkpoint", "latest"])
    assert "pickled objects other than tensors" in message and "refused" in message
    assert not marker.exists()


def test_saved_runs_hold_no_pickled_weights(tmp_path, corpus, tokenizer_dir):
    out = tmp_path / "run"
    pretrain.main([str(a) for a in [*corpus, "--tokenizer_name", tokenizer_dir, "--hidden_size", 32,
                                    "--num_hidden_layers", 1, "--num_attention_heads", 2, "--intermediate_size", 64,
                                    "--max_train_steps", 1, "--checkpointing_steps", 1, "--output_dir", out]])
    assert (out / "model.safetensors").is_file()
    assert not [p for p in out.iterdir() if p.suffix in (".bin", ".pkl", ".pt", ".pth")]
    checkpoint = out / "checkpoints" / "step_00000001"
    assert (checkpoint / "model.safetensors").is_file() and not (checkpoint / "pytorch_model.bin").exists()
    # Optimizer, scheduler and RNG state are plain tensors and containers: weights_only loading accepts them.
    for name in ("optimizer.bin", "scheduler.bin"):
        torch.load(checkpoint / name, weights_only=True)
