"""scripts/pretrain.py end to end on real sentences (tests/fixtures) with a tiny model: through `accelerate launch`
where the launch matters (the served result, two processes), in the test's process where only the run does (resume,
references of one process)."""

import collections
import json
import os
import shutil
import subprocess

import pytest
import torch
from safetensors.torch import load_file
from huggingface_hub import ModelCard
from transformers import AutoConfig, AutoModelForMaskedLM, AutoTokenizer, pipeline

import sinebert  # noqa: F401
from sinebert.training.all_reduce import SHARED_MEMORY, x86_linux
from sinebert.training.loop import bf16_matmuls_are_fast
from tests.conftest import (ROOT, THREADS, accelerate_command, check_model_card, launch_script, load_script,
                            run_here, user_error)

pytestmark = pytest.mark.slow

TINY = ["--hidden_size", "64", "--num_hidden_layers", "2", "--num_attention_heads", "4", "--intermediate_size", "128",
        "--max_seq_length", "64", "--logging_steps", "1", "--learning_rate", "1e-3", "--warmup_ratio", "0.1"]
NO_DROPOUT = ["--hidden_dropout_prob", "0", "--attention_probs_dropout_prob", "0"]


def launch(*args, processes: int = 1, timeout: int = 600):
    """The pretraining script on 1 or 2 CPU processes (one process gets this worker's share of the cores)."""
    threads = THREADS if processes == 1 else 1
    return launch_script("pretrain", *args, processes=processes, threads=threads, timeout=timeout)


def rows(folder):
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]


def train_losses(folder) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in rows(folder) if "loss" in r}


def data(text_corpus, tokenizer_dir):
    return ["--train_file", text_corpus / "train.txt", "--validation_file", text_corpus / "valid.txt",
            "--tokenizer_name", tokenizer_dir]


def test_one_process_learns_and_the_result_serves(text_corpus, tokenizer_dir, tmp_path):
    out = tmp_path / "run"
    launch(*data(text_corpus, tokenizer_dir), *TINY, "--per_device_train_batch_size", 16, "--max_train_steps", 60,
           "--eval_steps", 30, "--output_dir", out)
    evals = [r for r in rows(out) if "eval_loss" in r]
    assert [r["step"] for r in evals] == [0, 30, 60]
    # From the uniform guess (ln 600 = 6.4) a tiny model quickly learns at least word frequencies.
    assert evals[-1]["eval_loss"] < evals[0]["eval_loss"] - 0.5
    assert evals[-1]["eval_accuracy"] > evals[0]["eval_accuracy"]
    results = json.loads((out / "all_results.json").read_text())
    assert results["train_steps"] == 60 and results["train_tokens_per_second"] > 0
    logged = [r for r in rows(out) if "loss" in r]
    assert len(logged) == 60 and all(r["grad_norm"] > 0 for r in logged)  # the gradient's norm before clipping
    for name in ("README.md", "training_curves.png", "model.safetensors", "tokenizer.json"):
        assert (out / name).is_file(), name
    check_model_card(out, results)
    assert {"perplexity", "eval_accuracy"} <= {r.metric_name for r in ModelCard.load(out / "README.md").data.eval_results}
    model = AutoModelForMaskedLM.from_pretrained(out)
    assert type(model).__name__ == "SineBertForMaskedLM" and model.config.sparse_prediction
    assert AutoConfig.from_pretrained(out).classifier_pooling == "mean"  # what a classifier built from it reads
    predictions = pipeline("fill-mask", model=str(out))("the movie is [MASK] .")
    assert len(predictions) == 5 and predictions[0]["score"] > predictions[-1]["score"]


def test_two_processes_match_one_process_with_twice_the_batch(text_corpus, tokenizer_dir, tmp_path):
    # A token budget counts the tokens of every process, and rounds up to whole steps: 12 steps of 16 blocks of 64.
    common = [*data(text_corpus, tokenizer_dir), *TINY, *NO_DROPOUT, "--max_train_tokens", 12 * 16 * 64 - 100,
              "--eval_steps", 12]
    run_here("pretrain", *common, "--per_device_train_batch_size", 16, "--output_dir", tmp_path / "one")
    launch(*common, "--per_device_train_batch_size", 8, "--output_dir", tmp_path / "two", processes=2)
    for name in ("one", "two"):
        results = json.loads((tmp_path / name / "all_results.json").read_text())
        assert (results["train_steps"], results["train_tokens"]) == (12, 12 * 16 * 64), name
    # The two processes averaged their gradients through shared memory where it runs, and the results say so.
    shm = x86_linux() and os.access(SHARED_MEMORY, os.W_OK) and shutil.disk_usage(SHARED_MEMORY).free > 32 << 20
    assert results["gradient_all_reduce"].startswith("shared memory (2 processes" if shm else "gloo (")
    one, two = train_losses(tmp_path / "one"), train_losses(tmp_path / "two")
    assert sorted(one) == sorted(two) == list(range(1, 13))
    # The two runs see the same examples with the same masks (masks are seeded per example) and normalise the
    # loss over all masked tokens of the step, so they differ only by float summation order (~1e-6).
    for step in one:
        assert two[step] == pytest.approx(one[step], abs=1e-4)
    a, b = load_file(tmp_path / "one" / "model.safetensors"), load_file(tmp_path / "two" / "model.safetensors")
    assert max((a[k] - b[k]).abs().max().item() for k in a) < 1e-4


def test_resume_continues_exactly(text_corpus, tokenizer_dir, tmp_path, capsys):
    # With token dropping by loss, whose running loss per token id and random draw of ties must resume exactly too;
    # 80 blocks make 10 steps an epoch, so the resumed run (from step 16) goes on into a third epoch's order and masks.
    common = [*data(text_corpus, tokenizer_dir), *TINY, "--max_train_samples", 80,
              "--per_device_train_batch_size", 8, "--max_train_steps", 24,
              "--eval_steps", 12, "--checkpointing_steps", 8, "--checkpoints_total_limit", 3,
              "--token_dropping_layers", 0, -1, "--token_dropping_policy", "loss"]
    run_here("pretrain", *common, "--output_dir", tmp_path / "full")
    assert [p.name for p in sorted((tmp_path / "full" / "checkpoints").iterdir())] == [
        "step_00000008", "step_00000016", "step_00000024"]
    # A run stopped right after its step-16 checkpoint: its folder holds that checkpoint and the log up to there.
    stopped = tmp_path / "stopped"
    (stopped / "checkpoints").mkdir(parents=True)
    shutil.copytree(tmp_path / "full" / "checkpoints" / "step_00000016", stopped / "checkpoints" / "step_00000016")
    (stopped / "metrics.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in rows(tmp_path / "full") if r["step"] <= 16) + '{"step": 17, "loss": 9}\n'
    )
    run_here("pretrain", *common, "--output_dir", stopped, "--resume_from_checkpoint", "latest")
    assert train_losses(stopped) == train_losses(tmp_path / "full")  # the stale step-17 row was replaced
    a, b = load_file(tmp_path / "full" / "model.safetensors"), load_file(stopped / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)
    # Resuming with another optimizer layout is one sentence, not torch's error from inside load_state_dict.
    argv = [*common, "--output_dir", stopped, "--resume_from_checkpoint", "latest", "--embedding_learning_rate", 1e-3]
    message = user_error(capsys, load_script("pretrain"), argv)
    assert "was written with other optimizer parameter groups than this run's" in message


def test_muon_learns_and_resumes_exactly_with_two_processes(text_corpus, tokenizer_dir, tmp_path, capsys):
    common = [*data(text_corpus, tokenizer_dir), *TINY, "--optim", "muon", "--per_device_train_batch_size", 8,
              "--max_train_steps", 16, "--eval_steps", 16, "--checkpointing_steps", 8]
    launch(*common, "--output_dir", tmp_path / "full", processes=2)
    evals = [r for r in rows(tmp_path / "full") if "eval_loss" in r]
    assert evals[-1]["eval_loss"] < evals[0]["eval_loss"] - 0.2 and evals[-1]["eval_accuracy"] > 0.02
    bf16, why = bf16_matmuls_are_fast(torch.device("cpu"))  # the iterations' dtype follows the hardware, and says so
    ran = json.loads((tmp_path / "full" / "all_results.json").read_text())["optimizer"]
    assert ran == (f"Muon on 9 matrices (Newton-Schulz iterations in {'bfloat16' if bf16 else 'float32'}, split among "
                   f"2 processes, fused weights by head and projection: {why}), AdamW on the rest")
    stopped = tmp_path / "stopped"
    (stopped / "checkpoints").mkdir(parents=True)
    shutil.copytree(tmp_path / "full" / "checkpoints" / "step_00000008", stopped / "checkpoints" / "step_00000008")
    launch(*common, "--output_dir", stopped, "--resume_from_checkpoint", "latest", processes=2)
    full = train_losses(tmp_path / "full")
    assert {step: loss for step, loss in train_losses(stopped).items() if step > 8} == {
        step: loss for step, loss in full.items() if step > 8}
    a, b = load_file(tmp_path / "full" / "model.safetensors"), load_file(stopped / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)
    # A Muon checkpoint resumed under AdamW is one sentence naming --optim.
    argv = [*common, "--output_dir", stopped, "--resume_from_checkpoint", "latest", "--optim", "adamw"]
    message = user_error(capsys, load_script("pretrain"), argv)
    assert "was written with other optimizer parameter groups than this run's" in message and "--optim" in message


def traced(folder, rank: int = 0) -> list[dict]:
    """The rows --trace_data wrote for process `rank`, one per micro-batch."""
    return [json.loads(line) for line in (folder / f"data_trace_rank{rank}.jsonl").read_text().splitlines()]


def consumed_tokens(folder) -> collections.Counter:
    """The tokens of the first epoch's blocks, counted."""
    counter = collections.Counter()
    for row in traced(folder):
        if row["epoch"] == 0:
            for block in row["input_ids"]:
                counter.update(block)
    return counter


def test_streaming_reads_every_line_once_per_epoch(text_corpus, tokenizer_dir, tmp_path):
    """The packed stream holds every token of the file once an epoch. (Several processes split the packed blocks:
    the next test checks that each block goes to one of them.)"""
    out, train = tmp_path / "stream", tmp_path / "train.txt"
    # 600 lines of ~27 tokens = ~250 blocks of 64: 20 steps of 16 blocks cover the first epoch and part of the next.
    train.write_text("".join((text_corpus / "train.txt").read_text().splitlines(keepends=True)[:600]))
    run_here("pretrain", "--train_file", train, "--validation_file", text_corpus / "valid.txt", "--tokenizer_name",
             tokenizer_dir, *TINY, "--streaming", "--trace_data", "--per_device_train_batch_size", 16,
             "--max_train_steps", 20, "--eval_steps", 20, "--output_dir", out)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    expected = collections.Counter()
    for line in train.read_text().splitlines():
        expected.update(tokenizer(line, add_special_tokens=False)["input_ids"])
    consumed = consumed_tokens(out)
    for special in (tokenizer.cls_token_id, tokenizer.sep_token_id):
        consumed.pop(special)
    assert consumed == expected


def test_streaming_shards_that_run_out_unevenly_end_the_epoch_together_without_training_twice(
        text_corpus, tokenizer_dir, tmp_path):
    out = tmp_path / "uneven"
    # 33 blocks dealt out in turn: 17 (3 batches of up to 8) on process 0, 16 (2 batches) on process 1, which takes
    # part in the third step with its last batch again, counting no loss terms.
    launch(*data(text_corpus, tokenizer_dir), *TINY, "--streaming", "--trace_data", "--max_train_samples", 33,
           "--per_device_train_batch_size", 8, "--max_train_steps", 4, "--eval_steps", 4, "--output_dir", out,
           processes=2)
    traces = {rank: traced(out, rank) for rank in (0, 1)}
    assert [(r["epoch"], r["real"]) for r in traces[0]] == [(0, True)] * 3 + [(1, True)]
    assert [(r["epoch"], r["real"]) for r in traces[1]] == [(0, True)] * 2 + [(0, False), (1, True)]
    assert traces[1][2]["input_ids"] == traces[1][1]["input_ids"]
    trained = [tuple(block) for rank in (0, 1) for r in traces[rank] if r["epoch"] == 0 and r["real"]
               for block in r["input_ids"]]
    assert len(trained) == 33 == len(set(trained))


def test_each_epoch_draws_a_new_order_and_new_masks(text_corpus, tokenizer_dir, tmp_path):
    """Dynamic masking (RoBERTa): the loop gives the sampler and the collator each epoch's number."""
    out = tmp_path / "epochs"
    # 48 blocks in batches of 16: 3 steps an epoch, 6 steps two epochs.
    run_here("pretrain", *data(text_corpus, tokenizer_dir), *TINY, "--max_train_samples", 48, "--trace_data",
             "--per_device_train_batch_size", 16, "--max_train_steps", 6, "--eval_steps", 6, "--output_dir", out)
    epochs = collections.defaultdict(list)  # epoch -> [(block, masked positions)] in training order
    for row in traced(out):
        epochs[row["epoch"]] += zip(map(tuple, row["input_ids"]), map(tuple, row["masked"]))
    first, second = epochs[0], epochs[1]
    assert len(first) == len(second) == 48 and sorted(b for b, _ in first) == sorted(b for b, _ in second)
    assert [b for b, _ in first] != [b for b, _ in second]
    masks = dict(first)
    assert sum(masks[block] != masked for block, masked in second) > 40  # ~9 of 64 tokens masked: rarely the same


def test_config_file_supplies_arguments_and_rejects_unknown_keys(text_corpus, tokenizer_dir, tmp_path, capsys):
    pretrain = load_script("pretrain")
    config = tmp_path / "run.yaml"
    config.write_text(
        f"train_file: [{text_corpus / 'train.txt'}]\nvalidation_file: [{text_corpus / 'valid.txt'}]\n"
        f"tokenizer_name: {tokenizer_dir}\nhidden_size: 32\nnum_hidden_layers: 1\nnum_attention_heads: 2\n"
        "intermediate_size: 64\nmax_seq_length: 32\nmax_train_steps: 3\nper_device_train_batch_size: 4\n"
        "max_eval_samples: 8\nlogging_steps: 1\n"
    )
    out = tmp_path / "from_yaml"
    pretrain.main(["--config_file", str(config), "--output_dir", str(out), "--max_train_steps", "2"])
    assert json.loads((out / "all_results.json").read_text())["train_steps"] == 2  # the command line wins
    assert json.loads((out / "config.json").read_text())["hidden_size"] == 32
    config.write_text(config.read_text() + "hiden_size: 64\n")
    with pytest.raises(SystemExit):
        pretrain.parse_args(["--config_file", str(config), "--output_dir", str(tmp_path / "x")])
    message = capsys.readouterr().err
    assert "unknown keys ['hiden_size']" in message and "hidden_size" in message


@pytest.mark.parametrize(("name", "content", "shown"), [
    ("missing.yaml", None, "missing.yaml does not exist; give the path of a YAML or JSON file"),
    ("broken.yaml", "hidden_size: [64\n", "broken.yaml is not valid YAML: "),
    ("broken.json", "{hidden_size: 64", "broken.json is not valid JSON: "),
    ("list.yaml", "- hidden_size\n- 64\n", "list.yaml must hold a mapping of argument names to values, got list"),
])
def test_a_bad_config_file_is_one_sentence_and_exit_status_2(tmp_path, capsys, name, content, shown):
    if content is not None:
        (tmp_path / name).write_text(content)
    argv = ["--config_file", tmp_path / name, "--train_file", tmp_path / "t.txt", "--output_dir", tmp_path / "out"]
    line = user_error(capsys, load_script("pretrain"), argv)
    assert shown in line and not (tmp_path / "out").exists()


def test_refuses_to_overwrite_another_run_and_checks_the_tokenizer(text_corpus, tokenizer_dir, tmp_path, capsys):
    pretrain = load_script("pretrain")
    out = tmp_path / "busy"
    out.mkdir()
    (out / "notes.txt").write_text("someone else's run")
    argv = [*data(text_corpus, tokenizer_dir), *TINY, "--max_train_steps", 1, "--output_dir", out]
    assert "already holds files from another run" in user_error(capsys, pretrain, argv)
    assert (out / "notes.txt").read_text() == "someone else's run"
    small = tmp_path / "small.json"
    small.write_text(json.dumps({"vocab_size": 100, "hidden_size": 32, "num_hidden_layers": 1,
                                 "num_attention_heads": 2, "intermediate_size": 64}))
    argv = [*data(text_corpus, tokenizer_dir), "--config_name", small, "--max_train_steps", 1,
            "--output_dir", tmp_path / "new"]
    assert "The tokenizer has 600 tokens but the model's vocab_size is 100" in user_error(capsys, pretrain, argv)
    argv = [*data(text_corpus, tokenizer_dir), *TINY, "--letter_case", "--output_dir", tmp_path / "cased"]
    assert "Pretraining cannot give the model letter case" in user_error(capsys, pretrain, argv)


def test_two_processes_refuse_a_busy_output_dir_with_one_sentence_and_no_traceback_of_the_second(
    text_corpus, tokenizer_dir, tmp_path
):
    out = tmp_path / "busy"
    out.mkdir()
    (out / "notes.txt").write_text("someone else's run")
    command = accelerate_command(str(ROOT / "scripts" / "pretrain.py"), processes=2)
    argv = [*data(text_corpus, tokenizer_dir), *TINY, "--max_train_steps", 1, "--output_dir", out]
    result = subprocess.run([*command, *map(str, argv)], capture_output=True, text=True, timeout=300,
                            env={**os.environ, "ACCELERATE_USE_CPU": "true"}, cwd=ROOT)
    assert result.returncode != 0
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "already holds files from another run" in errors[0]
    assert "[rank1]" not in result.stderr and "Connection closed" not in result.stderr  # the second stops alike
    assert (out / "notes.txt").read_text() == "someone else's run"


def test_time_budget_sets_the_length_and_the_schedule(text_corpus, tokenizer_dir, tmp_path):
    out = tmp_path / "budget"
    run_here("pretrain",
        *data(text_corpus, tokenizer_dir), *TINY, "--per_device_train_batch_size", 8, "--max_train_minutes", 0.1,
        "--warmup_ratio", 0.2, "--lr_scheduler_type", "linear", "--logging_steps", 1, "--output_dir", out)
    results = json.loads((out / "all_results.json").read_text())
    assert results["stopped_early"] == "time budget" and 6 <= results["train_seconds"] < 30
    rates = [r["learning_rate"] for r in rows(out) if "learning_rate" in r]
    peak = rates.index(max(rates))
    # Warmup over the first 20% of the time, then a linear decay towards zero at the end of the budget.
    assert 0 < peak < len(rates) - 1 and rates[-1] < 0.5 * max(rates)
    assert all(a >= b for a, b in zip(rates[peak:], rates[peak + 1 :]))


def test_token_dropping_flags_set_the_config_and_bad_values_are_one_sentence(text_corpus, tokenizer_dir, tmp_path,
                                                                          capsys):
    common = [*data(text_corpus, tokenizer_dir), *TINY, *NO_DROPOUT, "--per_device_train_batch_size", 4,
              "--max_train_steps", 2, "--max_eval_samples", 8]
    out = tmp_path / "dropping"
    run_here("pretrain",
        *common, "--token_dropping_layers", 0, -1, "--token_dropping_keep", 0.3, "--token_dropping_policy", "loss",
        "--output_dir", out)
    config = json.loads((out / "config.json").read_text())
    assert (config["token_dropping_layers"], config["token_dropping_keep"]) == ([0, -1], 0.3)
    assert config["token_dropping_policy"] == "loss"
    running = load_file(out / "model.safetensors")["token_loss.running"]  # saved with the weights
    assert 0 < int(running.isfinite().sum()) < len(running)  # the ids predicted in the two steps, the rest +inf
    for flag, value in (("--token_dropping_keep", 0.3), ("--token_dropping_policy", "loss")):
        message = user_error(capsys, load_script("pretrain"), [*common, flag, value, "--output_dir", tmp_path / "bad"])
        assert f"{flag} {value} needs --token_dropping_layers" in message
    message = user_error(capsys, load_script("pretrain"), [
        *common, "--token_dropping_layers", 1, 2, "--output_dir", tmp_path / "bad"])
    assert "token_dropping_layers must be [first, stop]" in message and "[1, 2]" in message
    message = user_error(capsys, load_script("pretrain"), [
        *common[:-2], "--model_name_or_path", out, "--token_dropping_keep", 2, "--output_dir", tmp_path / "bad"])
    assert "Invalid model configuration over" in message and "token_dropping_keep must be in (0, 1], got 2.0" in message


def test_attention_layout_and_dropout_flags_and_the_kernels_are_reported(text_corpus, tokenizer_dir, tmp_path):
    out = tmp_path / "local"
    run_here("pretrain",
        *data(text_corpus, tokenizer_dir), *TINY, *NO_DROPOUT, "--per_device_train_batch_size", 4,
        "--max_train_steps", 2, "--max_eval_samples", 8, "--sliding_window", 4, "--global_attn_every_n_layers", 2,
        "--global_attention_positions", 0, "--mlp_type", "glu", "--no_bias", "--output_dir", out)
    kernels = json.loads((out / "all_results.json").read_text())["attention_kernels"]
    assert kernels == ["full_attention via sdpa",
                       "sliding_attention(window=4, global=[0]) via local_blocked (full attention up to 5 tokens, "
                       "sdpa up to 384)"]
    config = json.loads((out / "config.json").read_text())
    assert config["sliding_window"] == 4 and config["global_attention_positions"] == [0]
    assert config["mlp_type"] == "glu" and "FFN 128 (GLU)" in (out / "README.md").read_text()
    assert config["bias"] is False

    # --sliding_window 0 takes a checkpoint pretrained with a window back to full attention; dropout flags apply
    # over a checkpoint too.
    full = tmp_path / "full"
    run_here("pretrain",
        *data(text_corpus, tokenizer_dir), "--model_name_or_path", out, "--per_device_train_batch_size", 4,
        "--max_train_steps", 1, "--max_eval_samples", 8, "--sliding_window", 0, "--hidden_dropout_prob", 0.2,
        "--output_dir", full)
    assert json.loads((full / "all_results.json").read_text())["attention_kernels"] == ["full_attention via sdpa"] * 2
    config = json.loads((full / "config.json").read_text())
    assert config["sliding_window"] is None and config["global_attention_positions"] is None
    assert config["hidden_dropout_prob"] == 0.2 and config["attention_probs_dropout_prob"] == 0.0


def test_cut_blocks_keeps_every_token_mask_and_label():
    from sinebert.training.mlm import cut_blocks

    ids = torch.arange(1, 13).reshape(2, 6)
    mask = torch.tensor([[1] * 6, [1, 1, 0, 0, 0, 0]])
    labels = torch.where((ids % 3 == 0) & (mask == 1), ids, -100)
    cut = cut_blocks({"input_ids": ids * mask, "attention_mask": mask, "labels": labels}, 4, pad_token_id=0)
    # Row 0 -> [1..4], [5, 6, pad, pad]; row 1 -> [7, 8, pad, pad]; its all-padding second piece is dropped.
    assert cut["input_ids"].tolist() == [[1, 2, 3, 4], [5, 6, 0, 0], [7, 8, 0, 0]]
    assert cut["attention_mask"].tolist() == [[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 0, 0]]
    assert cut["labels"].tolist() == [[-100, -100, 3, -100], [-100, 6, -100, -100], [-100, -100, -100, -100]]


def test_mixed_lengths_pick_short_steps_by_seed_and_step_only():
    from sinebert.training.mlm import MixedLengths

    mix = MixedLengths(16, probability=0.9, seed=3, pad_token_id=0)
    picks = [mix.is_short(step) for step in range(2000)]
    assert picks == [MixedLengths(16, 0.9, 3, 0).is_short(step) for step in range(2000)]  # what a resumed run sees
    assert 0.87 < sum(picks) / len(picks) < 0.93
    assert not any(MixedLengths(16, 0.0, 3, 0).is_short(s) for s in range(100))
    assert all(MixedLengths(16, 1.0, 3, 0).is_short(s) for s in range(100))


def test_mixed_lengths_train_on_short_and_long_blocks(text_corpus, tokenizer_dir, tmp_path, monkeypatch, capsys):
    from sinebert import SineBertForMaskedLM
    from sinebert.training.mlm import MixedLengths

    seen, forward = [], SineBertForMaskedLM.forward

    def recording(self, input_ids=None, **kwargs):
        if self.training:
            seen.append(input_ids.shape[1])
        return forward(self, input_ids=input_ids, **kwargs)

    monkeypatch.setattr(SineBertForMaskedLM, "forward", recording)
    pretrain, steps = load_script("pretrain"), 12
    base = [*data(text_corpus, tokenizer_dir), *TINY, "--per_device_train_batch_size", 4, "--max_train_steps", steps,
            "--max_eval_samples", 8, "--seed", 5]
    pretrain.main([str(a) for a in [*base, "--short_seq_length", 16, "--short_seq_probability", 0.5,
                                    "--output_dir", tmp_path / "mixed"]])
    mix = MixedLengths(16, 0.5, seed=5, pad_token_id=0)
    assert seen == [16 if mix.is_short(step) else 64 for step in range(steps)] and len(set(seen)) == 2
    pretrain.main([str(a) for a in [*base, "--output_dir", tmp_path / "plain"]])
    results = [json.loads((tmp_path / run / "all_results.json").read_text()) for run in ("mixed", "plain")]
    assert results[0]["train_tokens"] == results[1]["train_tokens"]  # the same text each step, in shorter pieces
    bad = [*base, "--short_seq_length", 64, "--output_dir", tmp_path / "bad"]
    expected = "--short_seq_length must be between 1 and --max_seq_length - 1 (63), got 64"
    assert expected in user_error(capsys, pretrain, bad)
