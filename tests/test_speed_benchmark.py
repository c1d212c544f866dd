"""benchmarks/speed.py: inference rows at any batch size, timed in pieces the models take turns on, and the flags
that only those rows read refused elsewhere."""

import importlib.util
import subprocess
import sys

import torch

from tests.conftest import ROOT


def load_benchmark():
    spec = importlib.util.spec_from_file_location("benchmark_speed", ROOT / "benchmarks" / "speed.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_inference_batches_hold_as_many_sentences_as_asked_and_the_table_says_so(sentences):
    speed = load_benchmark()
    texts = sentences[:7]
    one_by_one = speed.inference_batches(texts, batch_size=1)
    assert [len(batch["input_ids"]) for batch in one_by_one] == [1] * 7
    assert all(batch["attention_mask"].all() for batch in one_by_one)  # nothing to pad in a batch of one
    assert [len(batch["input_ids"]) for batch in speed.inference_batches(texts, batch_size=3)] == [3, 3, 1]
    row = {"precision": "fp32", "pooling": "mean", "batch_size": 1, "sinebert_vs_fastest_peer": 0.98,
           "fastest_peer": "bert", **{f"{name}_tokens_per_second": 1000.0 for name in
                                      ("sinebert", "bert", "bert_eager", "modernbert", "modernbert_eager")}}
    assert "| fp32, sinebert pooling mean, batches of 1 |" in speed.inference_table([row])[2]
    assert "batches of" not in speed.inference_table([dict(row, batch_size=32)])[2]  # the default says nothing


def test_serving_flags_without_inference_only_are_refused_in_one_sentence():
    for flags, message in ((["--batch_size", "1"], "--batch_size goes with --inference_only."),
                           (["--compiled", "--bf16_weights"], "--compiled, --bf16_weights go with --inference_only."),
                           (["--inference_only", "--batch_size", "0"], "--batch_size must be at least 1, got 0.")):
        result = subprocess.run([sys.executable, "benchmarks/speed.py", *flags], cwd=ROOT, capture_output=True,
                                text=True, timeout=300)
        assert result.returncode == 2 and message in result.stderr, result.stderr[-1000:]
        assert "Traceback" not in result.stderr


def test_inference_passes_are_timed_in_pieces_with_the_models_taking_turns(monkeypatch):
    """Drift of the host within a pass must fall on every model alike: the models alternate every PASS_PIECE
    batches, not every pass."""
    speed = load_benchmark()
    calls = []

    class Recorder(torch.nn.Module):
        def __init__(self, name):
            super().__init__()
            self.name = name

        def forward(self, input_ids, **kwargs):
            calls.append(self.name)

    monkeypatch.setattr(speed, "models", lambda size, task, pooling="mean", bert_attention="sdpa":
                        (Recorder("sinebert"), Recorder(f"bert_{bert_attention}")))
    monkeypatch.setattr(speed, "modernbert", lambda size, task, attention="sdpa": Recorder(f"modernbert_{attention}"))
    monkeypatch.setattr(speed, "PASS_PIECE", 2)
    batches = [{"input_ids": torch.ones(1, 3, dtype=torch.long), "attention_mask": torch.ones(1, 3)}] * 5
    result = speed.inference_throughput("fp32", batches, repeats=1)
    turn = ["sinebert", "bert_sdpa", "bert_eager", "modernbert_sdpa", "modernbert_eager"]
    pieces = [name for name in turn for _ in range(2)]  # each model runs a piece of 2 batches, then the next
    assert calls[:10] == pieces and calls[10:20] == pieces and calls[20:25] == turn  # pieces of 2, 2 and 1
    assert len(calls) == 2 * 5 * 5 and result["batch_size"] == 1 and result["real_tokens"] == 15
