"""Bad input to pretraining ends with one clear sentence naming the file, column or value, and writes nothing."""

import json

import pytest
import torch

from tests.conftest import load_script, user_error

pretrain = load_script("pretrain")
TINY = ["--hidden_size", 32, "--num_hidden_layers", 1, "--num_attention_heads", 2, "--intermediate_size", 64,
        "--max_seq_length", 32, "--per_device_train_batch_size", 4, "--max_train_steps", 1]


@pytest.fixture
def files(tmp_path, sentences):
    (tmp_path / "reviews.csv").write_text("id,review\n" + "".join(f'{i},"{s}"\n' for i, s in enumerate(sentences[:50])))
    ascii_only = [s for s in sentences if s.isascii()][:50]
    (tmp_path / "latin1.txt").write_bytes(("\n".join(ascii_only) + "\ncaf\u00e9 cr\u00e8me\n").encode("latin-1"))
    (tmp_path / "blank.txt").write_text("\n  \n\t\n\n")
    (tmp_path / "data.parquet").write_bytes(b"PAR1")
    (tmp_path / "one.txt").write_text(sentences[0] + "\n")
    (tmp_path / "numbers.jsonl").write_text('{"text": 5}\n{"text": {"a": 1}}\n')
    (tmp_path / "numbers_labels.jsonl").write_text('{"text": 3, "label": [1]}\n{"text": 4, "label": [0]}\n')
    (tmp_path / "blank_label.csv").write_text("sentence,label\ngood film,1\nbad film,\nok film,0\n")
    (tmp_path / "reviews.tsv").write_text("id\treview\n" + "".join(f"{i}\t{s}\n" for i, s in enumerate(sentences[:50])))
    return tmp_path


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--train_file", "reviews.csv"], "Found no text column among ['id', 'review']; name it with --text_column_name"),
        (["--train_file", "reviews.csv", "--text_column_name", "body"],
         "--text_column_name 'body' is not a column of the data; its columns are ['id', 'review']"),
        (["--train_file", "latin1.txt"], "latin1.txt line 51 is not valid utf-8"),
        (["--train_file", "blank.txt"], "The 'text' column is empty after dropping blank lines"),
        (["--train_file", "data.parquet"], "has the extension '.parquet'; use .txt, .csv, .tsv, .json or .jsonl"),
        (["--train_file", "reviews.csv", "--validation_file", "reviews.tsv"],
         "--train_file/--validation_file mixes .csv (comma-separated) and .tsv (tab-separated) files"),
        (["--train_file", "reviews.csv", "--text_column_name", "review", "--hidden_size", 31],
         "hidden_size=31 is not divisible by num_attention_heads=2"),
        (["--train_file", "reviews.csv", "--text_column_name", "review", "--mlm_probability", 1.5],
         "--mlm_probability must be in (0, 1), got 1.5"),
        (["--train_file", "one.txt"], "The training data has 1 row, too few to hold out 5% for validation"),
        (["--train_file", "numbers.jsonl"], "The 'text' column holds 5 (int), not text"),
        (["--train_file", "reviews.csv", "--text_column_name", "review", "--max_train_tokens", 512],
         "--max_train_tokens 512 and --max_train_steps 1 both say how long to train; pass only one of them"),
        (["--train_file", "reviews.csv", "--text_column_name", "review", "--max_train_tokens", 0],
         "--max_train_tokens must be at least 1, got 0"),
    ],
)
def test_bad_data_and_settings(files, tokenizer_dir, capsys, extra, message):
    extra = [str(files / e) if str(e).endswith((".csv", ".tsv", ".txt", ".parquet", ".jsonl")) else e for e in extra]
    argv = [*TINY, "--tokenizer_name", tokenizer_dir, *extra, "--output_dir", files / "out"]
    assert message in user_error(capsys, pretrain, argv)
    assert not (files / "out").exists()  # the folder the run created is gone again


@pytest.mark.parametrize("script", ["pretrain", "train_tokenizer", "finetune_classification"])
def test_hub_dataset_without_a_network_is_one_sentence_and_leaves_nothing(tmp_path, tokenizer_dir, capsys, script):
    """The suite runs offline (HF_DATASETS_OFFLINE), as a machine without a network does."""
    argv = ["--dataset_name", "wikitext", "--dataset_config_name", "wikitext-2-raw-v1", "--output_dir",
            tmp_path / "runs" / "out"]
    if script != "train_tokenizer":
        argv += ["--tokenizer_name", tokenizer_dir]
    message = user_error(capsys, load_script(script), argv)
    assert "--dataset_name wikitext (wikitext-2-raw-v1)" in message and "--train_file" in message, message
    assert not (tmp_path / "runs").exists()


def test_output_dir_that_is_a_file_is_one_sentence(files, tokenizer_dir, capsys):
    (files / "taken").write_text("not a folder")
    argv = [*TINY, "--tokenizer_name", tokenizer_dir, "--train_file", files / "latin1.txt", "--output_dir",
            files / "taken"]
    assert "--output_dir" in user_error(capsys, pretrain, argv) and (files / "taken").read_text() == "not a folder"


@pytest.mark.parametrize(("flag", "value", "message"), [
    ("--per_device_train_batch_size", 0, "--per_device_train_batch_size must be at least 1, got 0."),
    ("--per_device_train_batch_size", -1, "--per_device_train_batch_size must be at least 1, got -1."),
    ("--learning_rate", -1, "--learning_rate must be at least 0, got -1.0."),
    ("--logging_steps", 0, "--logging_steps must be at least 1, got 0."),
    ("--gradient_accumulation_steps", 0, "--gradient_accumulation_steps must be at least 1, got 0."),
    ("--num_train_epochs", 0, "--num_train_epochs must be more than 0, got 0.0."),
    ("--weight_decay", -0.1, "--weight_decay must be at least 0, got -0.1."),
    ("--warmup_ratio", 5, "--warmup_ratio must be at least 0 and at most 1, got 5.0."),
    ("--max_train_minutes", -1, "--max_train_minutes must be at least 0, got -1.0."),
    ("--max_seq_length", 0, "--max_seq_length must be at least 1, got 0."),
    ("--adam_beta2", 1, "--adam_beta2 must be at least 0 and below 1, got 1.0."),
])
def test_numbers_out_of_range_are_one_sentence_before_anything_is_written(files, tokenizer_dir, capsys, flag, value,
                                                                          message):
    argv = ["--train_file", files / "reviews.csv", "--text_column_name", "review", "--tokenizer_name", tokenizer_dir,
            "--output_dir", files / "out", flag, value]
    assert user_error(capsys, pretrain, argv) == f"error: {message}"
    assert not (files / "out").exists()


@pytest.mark.parametrize(("setting", "message"), [
    ("max_train_steps: -5", "max_train_steps=-5 is not valid (expected 0 or more steps, got -5)."),
    ("per_device_train_batch_size: [1, 2]", "per_device_train_batch_size=[1, 2] must be a single value"),
    ("learning_rate: fast", "learning_rate='fast' is not valid"),
    ("per_device_train_batch_size: 0", "--per_device_train_batch_size must be at least 1, got 0."),
])
def test_config_file_values_are_checked_as_the_command_line_checks_them(files, tokenizer_dir, capsys, setting,
                                                                         message):
    config = files / "run.yaml"
    config.write_text(f"train_file: [{files / 'reviews.csv'}]\ntext_column_name: review\n{setting}\n")
    argv = ["--config_file", config, "--tokenizer_name", tokenizer_dir, "--output_dir", files / "out"]
    assert message in user_error(capsys, pretrain, argv)
    assert not (files / "out").exists()


def test_other_encodings_are_read_with_encoding(files, tokenizer_dir):
    out = files / "out"
    pretrain.main([str(a) for a in [*TINY, "--tokenizer_name", tokenizer_dir, "--train_file", files / "latin1.txt",
                                    "--encoding", "latin-1", "--validation_split_percentage", 20, "--output_dir", out]])
    assert json.loads((out / "all_results.json").read_text())["train_steps"] == 1


def test_config_file_values_are_checked(files, tokenizer_dir, capsys):
    config = files / "run.json"
    config.write_text(json.dumps({"lr_scheduler_type": "exponential"}))
    with pytest.raises(SystemExit):
        pretrain.parse_args(["--config_file", str(config), "--output_dir", str(files / "out")])
    assert "lr_scheduler_type='exponential' is not one of" in capsys.readouterr().err


@pytest.mark.parametrize(("case", "message"), [
    ("missing tokenizer", "--tokenizer_name {folder} does not exist"),
    ("empty tokenizer folder", "--tokenizer_name {folder} holds no tokenizer"),
    ("bert checkpoint", "--model_name_or_path {folder} holds a bert model; these scripts train and fine-tune sinebert"),
    ("truncated weights", "Could not load a model from --model_name_or_path {folder}"),
])
def test_bad_model_and_tokenizer_folders_are_one_sentence_about_the_folder(files, tokenizer_dir, capsys, case, message):
    import shutil

    from transformers import BertConfig, BertForMaskedLM

    from sinebert import SineBertForMaskedLM
    from tests.conftest import tiny_config

    folder = files / "given"
    argv = [*TINY, "--train_file", files / "latin1.txt", "--encoding", "latin-1", "--output_dir", files / "out"]
    if case == "missing tokenizer":
        argv += ["--tokenizer_name", folder]
    elif case == "empty tokenizer folder":
        folder.mkdir()
        argv += ["--tokenizer_name", folder]
    else:
        shutil.copytree(tokenizer_dir, folder)
        if case == "bert checkpoint":
            BertForMaskedLM(BertConfig(vocab_size=600, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                       intermediate_size=37)).save_pretrained(folder)
        else:
            SineBertForMaskedLM(tiny_config(vocab_size=600)).save_pretrained(folder)
            weights = folder / "model.safetensors"
            weights.write_bytes(weights.read_bytes()[:100])
        argv = [*TINY[8:], "--train_file", files / "latin1.txt", "--encoding", "latin-1", "--output_dir",
                files / "out", "--model_name_or_path", folder]  # TINY without its model size
    assert message.format(folder=folder) in user_error(capsys, pretrain, argv)
    assert not (files / "out").exists()


@pytest.mark.parametrize(("file", "message"), [
    ("numbers_labels.jsonl", "Row 1 of {path} has 3 (int) in 'text', not text"),
    ("blank_label.csv", "Row 2 of {path} has no label; fill it in or remove the row."),
])
def test_classification_rows_of_the_wrong_kind_are_one_sentence(files, tokenizer_dir, capsys, file, message):
    argv = [*TINY[:8], "--train_file", files / file, "--validation_file", files / file, "--tokenizer_name",
            tokenizer_dir, "--max_train_steps", 1, "--output_dir", files / "out"]
    assert message.format(path=files / file) in user_error(capsys, load_script("finetune_classification"), argv)
    assert not (files / "out").exists()


def test_a_step_that_cannot_fit_the_machine_is_refused_before_training(tokenizer_dir, sentences, capsys, monkeypatch,
                                                                       tmp_path):
    """--max_seq_length 100000 over the 3,000 sentences makes one block of the whole corpus (about 80k tokens); on a
    machine of 16 MiB its activations cannot fit, whatever the kernels do."""
    (tmp_path / "corpus.txt").write_text("\n".join(sentences[:3000]) + "\n")
    monkeypatch.setattr("sinebert.training.loop.memory_bytes", lambda device: 16 * 2**20)
    argv = [*TINY[:8], "--max_seq_length", 100_000, "--train_file", tmp_path / "corpus.txt", "--validation_file",
            tmp_path / "corpus.txt", "--tokenizer_name", tokenizer_dir, "--output_dir", tmp_path / "out"]
    message = user_error(capsys, pretrain, argv)
    assert "--max_seq_length 100000 with --per_device_train_batch_size 32 puts" in message, message
    assert "more than the 16 MiB this machine has" in message and not (tmp_path / "out").exists()


def test_a_fine_tuning_step_that_cannot_fit_the_machine_is_refused_before_training(files, tokenizer_dir, capsys,
                                                                                   monkeypatch):
    """Batches of 4 rows padded to the longest review, on a machine of 64 KiB."""
    monkeypatch.setattr("sinebert.training.loop.memory_bytes", lambda device: 64 * 2**10)
    rows = "".join(json.dumps({"text": s, "label": i % 2}) + "\n" for i, s in enumerate(["a good film " * 40] * 8))
    (files / "long.jsonl").write_text(rows)
    argv = [*TINY[:8], "--train_file", files / "long.jsonl", "--validation_file", files / "long.jsonl",
            "--tokenizer_name", tokenizer_dir, "--per_device_train_batch_size", 4, "--output_dir", files / "out"]
    message = user_error(capsys, load_script("finetune_classification"), argv)
    assert "with --per_device_train_batch_size 4 puts" in message and "this machine has" in message, message
    assert not (files / "out").exists()


def test_eager_attention_counts_its_weights_in_the_memory_a_step_needs(monkeypatch):
    """At 8,192 tokens, 2 heads and 2 layers eager's (heads, seq, seq) weights take 512 MiB, the rest of the step 6
    MiB; the memory-linear kernels keep no weights."""
    from sinebert import SineBertConfig
    from sinebert.training.errors import UserError
    from sinebert.training.loop import check_step_memory

    monkeypatch.setattr("sinebert.training.loop.memory_bytes", lambda device: 256 * 2**20)
    config = SineBertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
    config._attn_implementation = "sdpa"
    check_step_memory(config, 1, 8192, "sdpa", torch.device("cpu"))
    config._attn_implementation = "eager"
    with pytest.raises(UserError, match="need at least 518 MiB, more than the 256 MiB"):
        check_step_memory(config, 1, 8192, "eager", torch.device("cpu"))
