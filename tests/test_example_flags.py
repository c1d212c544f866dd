"""The flags of Hugging Face's run_mlm / run_glue / run_ner / run_qa no_trainer examples: each works with its Hugging
Face meaning or is one sentence saying why not; --push_to_hub uploads at the end and fails before training when it
could not; an unknown flag is one line, not argparse's whole usage."""

import subprocess
import sys

import pytest

from tests.conftest import ROOT, load_script, user_error

SCRIPTS = {name: load_script(name) for name in ("pretrain", "finetune_classification", "finetune_ner", "finetune_qa")}
TINY = ["--hidden_size", 32, "--num_hidden_layers", 1, "--num_attention_heads", 2, "--intermediate_size", 64,
        "--max_seq_length", 32, "--per_device_train_batch_size", 4, "--max_train_steps", 2]


@pytest.mark.parametrize(("script", "flags", "message"), [
    ("pretrain", ["--line_by_line"], "--line_by_line: pretraining packs lines into full blocks"),
    ("pretrain", ["--use_slow_tokenizer"], "--use_slow_tokenizer: sinebert needs a fast tokenizer"),
    ("pretrain", ["--model_type", "bert"], "--model_type bert: these scripts train sinebert"),
    ("finetune_classification", ["--pad_to_max_length"], "--pad_to_max_length: sinebert removes padding"),
    ("finetune_ner", ["--use_slow_tokenizer"], "--use_slow_tokenizer"),
    ("finetune_qa", ["--do_predict"], "--do_predict / --test_file: score another file"),
    ("finetune_qa", ["--test_file", "test.json"], "--test_file: score another file"),
    ("finetune_qa", ["--null_score_diff_threshold", 1.5], "--null_score_diff_threshold: with --version_2_with_negative"),
    ("pretrain", ["--push_to_hub"], "--push_to_hub needs --hub_model_id"),
])
def test_example_flags_that_cannot_work_are_one_sentence(tmp_path, capsys, script, flags, message):
    argv = ["--train_file", tmp_path / "x.txt", "--output_dir", tmp_path / "out", *flags]
    assert message in user_error(capsys, SCRIPTS[script], argv)
    assert not (tmp_path / "out").exists()


def test_tracking_that_would_log_nowhere_is_one_sentence(tmp_path, capsys, monkeypatch):
    """accelerate only warns when --report_to names a tracker it cannot start, and the run logs to none."""
    import argparse

    import accelerate.tracking
    from accelerate.utils import LoggerType

    from sinebert.training.loop import check_trackers

    monkeypatch.setattr(accelerate.tracking, "get_available_trackers", lambda: [])
    for flags, message in ((["--report_to", "tensorbord"], "--report_to tensorbord is not a tracker accelerate knows"),
                           (["--report_to", "tensorboard"], "needs the tensorboard package, which is not installed"),
                           ([], "--with_tracking logs to every installed tracker, and none of aim, tensorboard")):
        argv = ["--train_file", tmp_path / "x.txt", "--output_dir", tmp_path / "out", "--with_tracking", *flags]
        assert message in user_error(capsys, SCRIPTS["finetune_ner"], argv)
        assert not (tmp_path / "out").exists()
    monkeypatch.setattr(accelerate.tracking, "get_available_trackers", lambda: [LoggerType.TENSORBOARD])
    for report_to in ("tensorboard", "all"):
        check_trackers(argparse.Namespace(with_tracking=True, report_to=report_to))  # no error


def test_example_flags_that_work_keep_their_hugging_face_meaning():
    pretrain = SCRIPTS["pretrain"].parse_args(["--output_dir", "o", "--model_type", "sinebert", "--overwrite_cache",
                                               "--pad_to_max_length", "--low_cpu_mem_usage"])
    assert pretrain.overwrite_cache and pretrain.model_type == "sinebert"
    ner = SCRIPTS["finetune_ner"].parse_args(["--output_dir", "o", "--task_name", "pos", "--return_entity_level_metrics"])
    assert ner.label_column_name == "pos_tags"  # run_ner's --task_name picks the tag column
    assert SCRIPTS["finetune_ner"].parse_args(["--output_dir", "o"]).label_column_name is None
    glue = SCRIPTS["finetune_classification"].parse_args(["--output_dir", "o", "--task_name", "sst2"])
    assert glue.task_name == "sst2"


def test_push_to_hub_without_the_hub_fails_before_training(tmp_path, tokenizer_dir, text_corpus, capsys):
    """The suite runs with HF_HUB_OFFLINE=1, as a machine that cannot reach the hub."""
    argv = [*TINY, "--train_file", text_corpus / "train.txt", "--tokenizer_name", tokenizer_dir, "--push_to_hub",
            "--hub_model_id", "someone/model", "--output_dir", tmp_path / "out"]
    assert "--push_to_hub cannot upload while HF_HUB_OFFLINE is set" in user_error(capsys, SCRIPTS["pretrain"], argv)
    assert not (tmp_path / "out").exists()


class FakeHub:
    """huggingface_hub.HfApi's calls that --push_to_hub makes, recorded instead of sent."""

    calls: list = []

    def __init__(self, token=None):
        self.token = token

    def whoami(self):
        FakeHub.calls.append(("whoami", self.token))
        return {"name": "someone"}

    def create_repo(self, repo_id, exist_ok=False):
        FakeHub.calls.append(("create_repo", repo_id, exist_ok))

    def upload_folder(self, repo_id, folder_path, ignore_patterns, commit_message):
        FakeHub.calls.append(("upload_folder", repo_id, folder_path, sorted(__import__("os").listdir(folder_path)),
                              ignore_patterns))


def test_push_to_hub_uploads_the_final_folder(tmp_path, tokenizer_dir, text_corpus, monkeypatch):
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub, "HfApi", FakeHub)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    FakeHub.calls = []
    out = tmp_path / "out"
    SCRIPTS["pretrain"].main([str(a) for a in [
        *TINY, "--train_file", text_corpus / "train.txt", "--tokenizer_name", tokenizer_dir, "--push_to_hub",
        "--hub_model_id", "someone/model", "--hub_token", "hf_x", "--checkpointing_steps", 1, "--output_dir", out]])
    assert FakeHub.calls[0] == ("whoami", "hf_x")
    assert FakeHub.calls[1] == ("create_repo", "someone/model", True)
    name, repo, folder, files, ignored = FakeHub.calls[2]
    assert (name, repo, folder) == ("upload_folder", "someone/model", str(out))
    assert {"model.safetensors", "config.json", "README.md", "args.json"} <= set(files) and "checkpoints/**" in ignored


def test_an_unknown_flag_is_one_line():
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "pretrain.py"), "--output_dir", "o", "--fancy", "1"],
                            capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert result.returncode == 2 and result.stderr.strip().count("\n") == 0, result.stderr
    assert "unrecognized arguments: --fancy 1" in result.stderr


def test_the_one_process_command_ends_with_the_sentence(tmp_path):
    """The README's one-process command (python scripts/X.py, no launcher to add its own traceback)."""
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "pretrain.py"), "--train_file",
                             str(tmp_path / "missing.txt"), "--output_dir", str(tmp_path / "out")],
                            capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith("error: Give a tokenizer with --tokenizer_name"), result.stderr[-2000:]
    assert "Traceback" not in result.stderr
