"""benchmarks/plateau.py: its task can only be solved from the context, and its table says what happened."""

import importlib.util
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def load_benchmark():
    spec = importlib.util.spec_from_file_location("benchmark_plateau", ROOT / "benchmarks" / "plateau.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_masked_token_is_the_other_half_of_its_pair():
    plateau = load_benchmark()
    input_ids, labels = plateau.pair_batch(torch.Generator().manual_seed(3))
    masked = input_ids == plateau.MASK_ID
    assert masked.any() and torch.equal(labels != -100, masked)
    pairs = labels.view(plateau.BATCH, -1, 2)
    inputs = input_ids.view(plateau.BATCH, -1, 2)
    # Where one half is masked and the other is not, the label is the visible half.
    one_masked = (inputs == plateau.MASK_ID).sum(-1) == 1
    visible = torch.where(inputs[..., 0] == plateau.MASK_ID, inputs[..., 1], inputs[..., 0])
    label = torch.where(inputs[..., 0] == plateau.MASK_ID, pairs[..., 0], pairs[..., 1])
    assert one_masked.any() and torch.equal(visible[one_masked], label[one_masked])


def test_a_model_that_never_breaks_out_is_reported_with_its_last_loss():
    plateau = load_benchmark()
    result = plateau.steps_to_break_out(plateau.MODELS["sinebert, full attention"], steps=50, seed=0)
    assert result["break_out_step"] is None and result["curve"][-1][0] == 50
    report = {"rows": {"m": [result]}, "steps": 50, "seeds": [0], "threshold": 2.0, "date": "d", "torch": "t"}
    assert f"not in 50 steps (loss {result['curve'][-1][1]})" in plateau.markdown(report)
