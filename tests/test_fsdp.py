"""FSDP 2 on two CPU processes over gloo, launched with configs/accelerate/fsdp.yaml as a user launches it: the
parameters and optimizer state are sharded, the checkpoints are sharded and resume exactly, the training equals one
process's with the whole batch, as data parallelism's does (tests/test_pretrain.py; with AdamW and with Muon), and the
final folder is a plain one that loads anywhere."""

import hashlib
import json
import os
import pickle
import shutil
import subprocess

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForMaskedLM

import sinebert  # noqa: F401  (registers the Auto classes)
from sinebert.training.checkpoint import CheckpointError, CheckpointManager
from tests.conftest import ROOT, accelerate_command, launch_script, run_here
from tests.fixtures import corpus

TINY = ["--hidden_size", 64, "--num_hidden_layers", 2, "--num_attention_heads", 4, "--intermediate_size", 128,
        "--hidden_dropout_prob", 0, "--attention_probs_dropout_prob", 0, "--logging_steps", 1, "--learning_rate", 1e-3]
PRETRAIN = [*TINY, "--max_seq_length", 64, "--per_device_train_batch_size", 8, "--max_train_steps", 12,
            "--eval_steps", 12, "--checkpointing_steps", 6]
WHOLE_BATCH = ["--per_device_train_batch_size", 16]  # one process with the batch of PRETRAIN's two


def losses(folder) -> dict[int, float]:
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    return {row["step"]: row["loss"] for row in rows if "loss" in row}


@pytest.fixture(scope="module")
def pretrained(text_corpus, tokenizer_dir, tmp_path_factory):
    """The same 12 steps of pretraining under FSDP (two processes) and in one process with the whole batch (run here:
    what a launch would add is its imports)."""
    root = tmp_path_factory.mktemp("fsdp")
    data = ["--train_file", text_corpus / "train.txt", "--validation_file", text_corpus / "valid.txt",
            "--tokenizer_name", tokenizer_dir]
    sharded = launch_script("pretrain", *data, *PRETRAIN, "--output_dir", root / "fsdp", processes=2, config="fsdp.yaml")
    run_here("pretrain", *data, *PRETRAIN, *WHOLE_BATCH, "--output_dir", root / "one")
    return {"root": root, "data": data, "stdout": sharded.stdout + sharded.stderr}


def test_pretraining_is_sharded_and_trains_as_one_process_does(pretrained):
    fsdp, one = pretrained["root"] / "fsdp", pretrained["root"] / "one"
    assert "running 2 processes on the CPU (gloo), fully sharded (FSDP 2)" in pretrained["stdout"]
    checkpoint = fsdp / "checkpoints" / "step_00000006"
    for part in ("pytorch_model_fsdp_0", "optimizer_0"):
        shards = [checkpoint / part / f"__{rank}_0.distcp" for rank in (0, 1)]
        sizes = [shard.stat().st_size for shard in shards]
        # Each process wrote its own half (dimension 0 of every tensor is split between the two).
        assert all(0.4 < size / sum(sizes) < 0.6 for size in sizes), (part, sizes)
    assert not list(checkpoint.glob("*.safetensors"))  # no unsharded copy of the model in the checkpoint
    assert set(losses(fsdp)) == set(range(1, 13))
    for step, loss in losses(one).items():
        assert losses(fsdp)[step] == pytest.approx(loss, abs=1e-5)
    a, b = load_file(fsdp / "model.safetensors"), load_file(one / "model.safetensors")
    assert sorted(a) == sorted(b) and max((a[k] - b[k]).abs().max().item() for k in a) < 1e-5


def test_the_final_folder_of_a_sharded_run_is_a_plain_one(pretrained):
    fsdp = pretrained["root"] / "fsdp"
    assert (fsdp / "modeling_sinebert.py").is_file() and not list(fsdp.glob("_fsdp*.py"))
    assert json.loads((fsdp / "config.json").read_text())["architectures"] == ["SineBertForMaskedLM"]
    model = AutoModelForMaskedLM.from_pretrained(fsdp)
    weights = load_file(fsdp / "model.safetensors")
    assert all(torch.equal(model.state_dict()[name], tensor) for name, tensor in weights.items())


def test_a_sharded_checkpoint_resumes_exactly(pretrained, tmp_path):
    fsdp, stopped = pretrained["root"] / "fsdp", tmp_path / "stopped"
    (stopped / "checkpoints").mkdir(parents=True)
    shutil.copytree(fsdp / "checkpoints" / "step_00000006", stopped / "checkpoints" / "step_00000006")
    rows = (fsdp / "metrics.jsonl").read_text().splitlines()
    (stopped / "metrics.jsonl").write_text("".join(r + "\n" for r in rows if json.loads(r)["step"] <= 6))
    launch_script("pretrain", *pretrained["data"], *PRETRAIN, "--output_dir", stopped, "--resume_from_checkpoint",
                  "latest", processes=2, config="fsdp.yaml")
    assert losses(stopped) == losses(fsdp)
    a, b = load_file(fsdp / "model.safetensors"), load_file(stopped / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_muon_trains_sharded_as_in_one_process_and_resumes_exactly(pretrained, tmp_path):
    # Each process holds rows of a matrix; Muon's Newton-Schulz products on those DTensors gather what they need.
    muon = [*PRETRAIN, "--optim", "muon"]
    launch_script("pretrain", *pretrained["data"], *muon, "--output_dir", tmp_path / "fsdp", processes=2,
                  config="fsdp.yaml")
    run_here("pretrain", *pretrained["data"], *muon, *WHOLE_BATCH, "--output_dir", tmp_path / "one")
    fsdp, one = losses(tmp_path / "fsdp"), losses(tmp_path / "one")
    # Looser than AdamW's 1e-5: where the iterations run in bf16, the two reductions' last-bit differences in the
    # gradients can round some entries of the update apart by 2^-8 (up to 4e-5 in the loss, here).
    assert set(fsdp) == set(range(1, 13)) and fsdp == pytest.approx(one, abs=2e-4)
    stopped = tmp_path / "stopped"
    (stopped / "checkpoints").mkdir(parents=True)
    shutil.copytree(tmp_path / "fsdp" / "checkpoints" / "step_00000006", stopped / "checkpoints" / "step_00000006")
    launch_script("pretrain", *pretrained["data"], *muon, "--output_dir", stopped, "--resume_from_checkpoint", "latest",
                  processes=2, config="fsdp.yaml")
    assert {step: loss for step, loss in losses(stopped).items() if step > 6} == {
        step: loss for step, loss in fsdp.items() if step > 6}
    a, b = load_file(tmp_path / "fsdp" / "model.safetensors"), load_file(stopped / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)


class _Exploit:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


class _OneProcess:
    is_main_process, process_index = True, 0

    def print(self, *args):
        print(*args)


def test_a_planted_pickle_as_the_shards_index_is_refused_without_running(pretrained, tmp_path):
    """torch.distributed.checkpoint reads its `.metadata` index with pickle.load: a planted one (with a manifest
    rewritten to match) is refused before it does, and runs nothing."""
    root = tmp_path / "run"
    shutil.copytree(pretrained["root"] / "fsdp" / "checkpoints", root / "checkpoints")
    checkpoint, marker = root / "checkpoints" / "step_00000012", tmp_path / "ran"
    index = checkpoint / "pytorch_model_fsdp_0" / ".metadata"
    index.write_bytes(pickle.dumps({"state": _Exploit(marker)}))
    manifest = json.loads((checkpoint / "manifest.json").read_text())
    manifest["files"]["pytorch_model_fsdp_0/.metadata"] = {
        "size": index.stat().st_size, "sha256": hashlib.sha256(index.read_bytes()).hexdigest()}
    (checkpoint / "manifest.json").write_text(json.dumps(manifest))
    manager = CheckpointManager(_OneProcess(), root)
    with pytest.raises(CheckpointError, match="is not a sharded checkpoint's index .*posix.system is not part"):
        manager.resolve("latest")
    assert manager.resolve("latest", fallback=True) == manager.path_for(6)
    assert not marker.exists()


@pytest.fixture(scope="module")
def reviews(tmp_path_factory):
    folder = tmp_path_factory.mktemp("reviews")
    corpus.write_reviews_tsv(folder / "train.tsv", corpus.reviews(600, seed=1))
    corpus.write_reviews_tsv(folder / "dev.tsv", corpus.reviews(100, seed=2))
    return folder


def test_fine_tuning_keeps_the_best_weights_under_fsdp_as_one_process_does(reviews, tokenizer_dir, tmp_path):
    """The best evaluation's weights are gathered from the shards, kept, and given back to every shard at the end: as
    one process with the whole batch keeps them (data parallelism's two processes: tests/test_finetune_scripts.py)."""
    argv = ["--train_file", reviews / "train.tsv", "--validation_file", reviews / "dev.tsv", "--tokenizer_name",
            tokenizer_dir, *TINY, "--scale_embeddings", "--max_train_steps", 12, "--eval_steps", 3,
            "--load_best_model_at_end"]
    launch_script("finetune_classification", *argv, "--per_device_train_batch_size", 16, "--output_dir",
                  tmp_path / "fsdp", processes=2, config="fsdp.yaml")
    # FSDP cannot run the script's default FGM and leaves it off; the one process is told to.
    run_here("finetune_classification", *argv, "--per_device_train_batch_size", 32, "--adversarial_epsilon", 0,
             "--output_dir", tmp_path / "one")
    results = [json.loads((tmp_path / run / "all_results.json").read_text()) for run in ("fsdp", "one")]
    assert results[0]["best_step"] == results[1]["best_step"] < 12  # weights of an earlier step were given back
    assert results[0]["eval_accuracy"] == pytest.approx(results[1]["eval_accuracy"])
    predictions = [[json.loads(line) for line in (tmp_path / run / "eval_predictions.jsonl").read_text().splitlines()]
                   for run in ("fsdp", "one")]
    assert [row["prediction"] for row in predictions[0]] == [row["prediction"] for row in predictions[1]]
    assert [row["score"] for row in predictions[0]] == pytest.approx([row["score"] for row in predictions[1]], abs=1e-5)
    a, b = load_file(tmp_path / "fsdp" / "model.safetensors"), load_file(tmp_path / "one" / "model.safetensors")
    assert max((a[k] - b[k]).abs().max().item() for k in a) < 1e-5


@pytest.mark.parametrize(("processes", "extra", "message"), [
    (1, [], "The launch config asks for FSDP, which shards the model across processes, but this launch has one"),
    (2, ["--adversarial_epsilon", 0.25], "--adversarial_epsilon 0.25 moves the whole word-embedding matrix"),
])
def test_what_fsdp_cannot_do_here_is_one_sentence(reviews, tokenizer_dir, tmp_path, processes, extra, message):
    argv = ["--train_file", reviews / "train.tsv", "--validation_file", reviews / "dev.tsv", "--tokenizer_name",
            tokenizer_dir, *TINY, "--max_train_steps", 2, *extra, "--output_dir", tmp_path / "out"]
    command = accelerate_command(str(ROOT / "scripts" / "finetune_classification.py"), processes, config="fsdp.yaml")
    result = subprocess.run([*command, *map(str, argv)], capture_output=True, text=True, timeout=300, cwd=ROOT,
                            env={**os.environ, "ACCELERATE_USE_CPU": "true"})
    output = result.stdout + result.stderr
    assert result.returncode != 0 and f"error: {message}" in output
    assert "]: Traceback" not in output  # no worker's traceback ([rank0]: ...), only the launcher's summary
    assert not (tmp_path / "out").exists()
