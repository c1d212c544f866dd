"""The Trainer under --mixed_precision bf16: its steps compute under autocast, and the prepared model hands back its
outputs as computed, without accelerate's fp32 copy of every half-precision output (the logits, each step)."""

import pytest
import torch
from accelerate.state import AcceleratorState

from sinebert.training.loop import setup_accelerator
from tests.conftest import classifier_step_setup, classifier_trainer, gradients_at_optimizer_step, load_script


@pytest.fixture
def bf16_state():
    """accelerate keeps one precision per process: set bf16 for this test alone."""
    AcceleratorState._reset_state()
    yield
    AcceleratorState._reset_state()


def test_a_bf16_step_runs_under_autocast_and_its_outputs_are_not_copied_to_fp32(tmp_path, bf16_state):
    script = load_script("finetune_classification")
    args = script.parse_args(["--train_file", "unused.tsv", "--output_dir", str(tmp_path), "--max_grad_norm", "0",
                              "--mixed_precision", "bf16", "--adversarial_epsilon", "0"])
    accelerator = setup_accelerator(args)
    model, reference, rows, batch = classifier_step_setup()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = reference(**batch)
    out.loss.backward()
    expected_logits = out.logits
    expected = {name: p.grad for name, p in reference.named_parameters() if p.grad is not None}

    trainer = classifier_trainer(args, accelerator, model, rows)
    with accelerator.autocast():
        logits = trainer.model(**batch).logits
    assert logits.dtype == torch.bfloat16 and torch.equal(logits, expected_logits)
    seen = gradients_at_optimizer_step(trainer, model, batch)
    assert seen.keys() == expected.keys()
    for name, gradient in expected.items():  # bf16 gradients: an fp32 step would differ far beyond this
        torch.testing.assert_close(seen[name], gradient, rtol=1e-5, atol=1e-7, msg=name)
