"""The fine-tuning schedule chosen from the data when the command line leaves it open (finetune.fit_schedule): the
learning rate from the number of training rows, a run of about STEP_TARGET steps, early stopping and the best
weights, classification's FGM; and nothing chosen over what the user gave."""

import json
from types import SimpleNamespace

import pytest
from accelerate.utils import DistributedType

from sinebert.training import finetune
from sinebert.training.finetune import fit_schedule, learning_rate_for
from tests.conftest import load_script, run_here
from tests.fixtures import corpus


def parse(*argv, script="finetune_classification"):
    return load_script(script).parse_args(["--output_dir", "unused", *map(str, argv)])


def accelerator(processes: int = 1, distributed_type=DistributedType.NO):
    printed = []
    return SimpleNamespace(num_processes=processes, distributed_type=distributed_type, print=printed.append,
                           printed=printed)


def test_the_learning_rate_falls_as_one_over_the_square_root_of_the_rows():
    assert learning_rate_for(300) == learning_rate_for(1000) == pytest.approx(5e-4)
    assert learning_rate_for(4000) == pytest.approx(2.5e-4)
    assert learning_rate_for(16_000) == pytest.approx(1.25e-4)
    assert learning_rate_for(25_000) == learning_rate_for(10**6) == pytest.approx(1e-4)  # the floor


def test_an_open_command_line_gets_a_length_a_cadence_patience_and_the_best_weights():
    args, machine = parse(), accelerator()
    fit_schedule(args, machine, rows=4750)  # 149 batches of 32 an epoch
    assert args.learning_rate == pytest.approx(2.3e-4)
    assert args.num_train_epochs == pytest.approx(6.7)  # 1,000 steps / 149 a pass
    assert args.eval_steps == 100  # ten evaluations over the 999 steps
    assert args.early_stopping_patience == finetune.PATIENCE and args.load_best_model_at_end is True
    (line,) = machine.printed
    assert line.startswith("Schedule for 4,750 training rows: learning rate 0.00023; adversarial word embeddings "
                           "0.25; 6.7 epochs (999 steps)")


def test_small_sets_get_at_most_twenty_epochs_and_large_ones_at_least_one():
    small, large = parse(), parse()
    fit_schedule(small, accelerator(), rows=200)
    fit_schedule(large, accelerator(), rows=500_000)
    assert (small.num_train_epochs, large.num_train_epochs) == (finetune.MAX_EPOCHS, 1.0)


def test_processes_and_accumulation_count_in_the_steps_of_an_epoch():
    args = parse("--gradient_accumulation_steps", 2)
    fit_schedule(args, accelerator(processes=2), rows=64_000)  # 1,000 batches a process, 500 steps an epoch
    assert args.num_train_epochs == 2.0 and args.eval_steps == 100


def test_what_the_user_gives_is_kept_and_a_given_length_is_trained_in_full():
    args = parse("--learning_rate", 3e-5, "--eval_steps", 7, "--early_stopping_patience", 0,
                 "--no_load_best_model_at_end")
    fit_schedule(args, accelerator(), rows=1000)
    assert (args.learning_rate, args.eval_steps, args.early_stopping_patience, args.load_best_model_at_end) == (
        3e-5, 7, 0, False)
    for length in (["--num_train_epochs", 2], ["--max_train_steps", 50], ["--max_train_minutes", 5]):
        args, machine = parse(*length), accelerator()
        fit_schedule(args, machine, rows=1000)
        assert args.learning_rate == pytest.approx(5e-4)  # still chosen: it was not given
        assert (args.eval_steps, args.early_stopping_patience, args.load_best_model_at_end) == (None, None, None)
        assert machine.printed == [
            "Schedule for 1,000 training rows: learning rate 0.0005; adversarial word embeddings 0.25."]


def test_a_config_file_counts_as_given(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("learning_rate: 2.0e-4\nnum_train_epochs: 3\nadversarial_epsilon: 0.5\n")
    args, machine = parse("--config_file", config), accelerator()
    fit_schedule(args, machine, rows=1000)
    assert (args.learning_rate, args.num_train_epochs, args.early_stopping_patience) == (2e-4, 3, None)
    assert args.adversarial_epsilon == 0.5 and machine.printed == []


def test_classification_takes_fgm_unless_told_or_sharded_and_the_other_tasks_do_not():
    def chosen(*argv, script="finetune_classification", distributed_type=DistributedType.NO):
        args = parse("--num_train_epochs", 1, *argv, script=script)
        machine = accelerator(distributed_type=distributed_type)
        fit_schedule(args, machine, rows=1000)
        return args.adversarial_epsilon, machine.printed[0]

    assert chosen() == (finetune.CLASSIFICATION_FGM, "Schedule for 1,000 training rows: learning rate 0.0005; "
                        "adversarial word embeddings 0.25.")
    assert chosen("--adversarial_epsilon", 0)[0] == 0.0
    epsilon, line = chosen(distributed_type=DistributedType.FSDP)  # FSDP refuses FGM; an open default is not FGM
    assert epsilon == 0.0 and line.endswith("adversarial word embeddings 0 (FGM is off under FSDP).")
    for script in ("finetune_ner", "finetune_qa"):
        assert chosen(script=script) == (0.0, "Schedule for 1,000 training rows: learning rate 0.0005.")


@pytest.mark.slow
def test_a_run_given_only_its_files_stops_early_and_ends_with_its_best_weights(tmp_path, capsys):
    from sinebert.training.tokenizer import train_wordpiece

    train = corpus.reviews(800, seed=3)
    corpus.write_reviews_tsv(tmp_path / "train.tsv", train)
    train_wordpiece([text for text, _ in train], vocab_size=800, min_frequency=2).save_pretrained(tmp_path / "tok")
    out = tmp_path / "run"
    run_here("finetune_classification", "--train_file", tmp_path / "train.tsv", "--tokenizer_name", tmp_path / "tok",
             "--hidden_size", 32, "--num_hidden_layers", 1, "--num_attention_heads", 2, "--intermediate_size", 64,
             "--scale_embeddings", "--adversarial_epsilon", 0, "--output_dir", out, threads=1)
    # Without FGM: at this width a step of 0.25 is a fifth of the norm of a batch's word vectors (at hidden 256,
    # 2%) and holds the model at chance past the run's first half, where early stopping ends it.
    assert "Schedule for 760 training rows: learning rate 0.0005; 20 epochs (480 steps)" in capsys.readouterr().out
    results = json.loads((out / "all_results.json").read_text())
    history = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    evaluations = {row["step"]: row["eval_accuracy"] for row in history if "eval_accuracy" in row}
    best = max(evaluations, key=lambda step: (evaluations[step], -step))
    # The reviews are separable: the held-out accuracy peaks before 480 steps, then stops improving; early stopping
    # waits for the second half of the run (the first hundred steps sit at chance, which it would have taken for
    # convergence).
    assert results["stopped_early"] == "early stopping" and 240 <= results["train_steps"] < 480
    assert results["best_step"] == best and results["eval_accuracy"] == evaluations[best] >= 0.9
    # It stops at the first evaluation of the second half that is the PATIENCE-th in a row without a better accuracy.
    later = sorted(step for step in evaluations if step > best)
    assert results["train_steps"] == min(step for n, step in enumerate(later, 1) if n >= finetune.PATIENCE
                                         and 2 * step >= 480)
