"""--adversarial_epsilon (FGM): what one optimizer step of the Trainer adds to the gradient, and that the word
embeddings are left as they were."""

import pytest
import torch

from sinebert.training.loop import setup_accelerator
from tests.conftest import (
    classifier_step_setup,
    classifier_trainer,
    gradients_at_optimizer_step,
    load_script,
    user_error,
)

WORDS = "sinebert.embeddings.word_embeddings.weight"


def _gradients(model, batch) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    model(**batch).loss.backward()
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("epsilon", [0.0, 0.5])
def test_a_step_adds_the_gradient_at_the_embeddings_moved_up_their_gradient(tmp_path, epsilon):
    script = load_script("finetune_classification")
    args = script.parse_args(["--train_file", "unused.tsv", "--output_dir", str(tmp_path), "--max_grad_norm", "0",
                              "--adversarial_epsilon", str(epsilon)])
    accelerator = setup_accelerator(args)
    model, reference, rows, batch = classifier_step_setup()
    expected = _gradients(reference, batch)
    if epsilon:  # by hand: the loss again at words + epsilon * g / |g|, its gradient added
        with torch.no_grad():
            reference.get_input_embeddings().weight.add_(epsilon * expected[WORDS] / expected[WORDS].norm())
        expected = {name: g + _gradients(reference, batch)[name] for name, g in expected.items()}

    trainer = classifier_trainer(args, accelerator, model, rows)
    clean_words = model.get_input_embeddings().weight.detach().clone()
    seen = gradients_at_optimizer_step(trainer, model, batch)

    assert torch.equal(model.get_input_embeddings().weight, clean_words)  # moved only for the second pass
    assert seen.keys() == expected.keys()
    for name, gradient in expected.items():
        torch.testing.assert_close(seen[name], gradient, rtol=1e-4, atol=1e-6, msg=name)


def test_a_negative_epsilon_is_one_error_sentence(tmp_path, capsys, tokenizer_dir):
    train = tmp_path / "train.csv"
    train.write_text("sentence,label\n" + "good,positive\nbad,negative\n" * 10)
    line = user_error(capsys, load_script("finetune_classification"),
                      ["--train_file", train, "--tokenizer_name", tokenizer_dir, "--hidden_size", 32,
                       "--num_hidden_layers", 1, "--num_attention_heads", 2, "--intermediate_size", 64,
                       "--adversarial_epsilon", -0.5, "--output_dir", tmp_path / "out"])
    assert line.startswith("error: --adversarial_epsilon -0.5 is negative")
