"""Killed runs lose nothing: real SIGKILLs (of the whole job, of one rank, in the middle of a checkpoint), damaged
checkpoints, NaN losses and a full disk, each followed by the check that matters (exact resumption, a clear error,
the last good checkpoint intact)."""

import json
import os
import random
import shutil
import signal
import subprocess
import time

import pytest
import torch
from safetensors.torch import load_file

from sinebert.training.checkpoint import CheckpointManager
from tests.conftest import ROOT, accelerate_command

pytestmark = pytest.mark.slow

STEPS = 16


def command(processes: int, script: str = "scripts/pretrain.py") -> list[str]:
    return accelerate_command(script, processes, threads=2 if processes == 1 else 1)


@pytest.fixture(scope="module")
def run_args(tmp_path_factory, sentences, tokenizer_dir):
    corpus = tmp_path_factory.mktemp("corpus")
    (corpus / "train.txt").write_text("\n".join(sentences[:1500]) + "\n")
    (corpus / "valid.txt").write_text("\n".join(sentences[1500:1700]) + "\n")
    return [
        "--train_file", corpus / "train.txt", "--validation_file", corpus / "valid.txt", "--tokenizer_name",
        tokenizer_dir, "--hidden_size", 32, "--num_hidden_layers", 2, "--num_attention_heads", 2,
        "--intermediate_size", 64, "--max_seq_length", 32, "--per_device_train_batch_size", 8, "--max_train_steps",
        STEPS, "--logging_steps", 1, "--eval_steps", STEPS, "--checkpointing_steps", 2, "--checkpoints_total_limit",
        3, "--learning_rate", "1e-3", "--hidden_dropout_prob", "0.1",
    ]


def run(args, out, processes=1, fault=None, expect_ok=True, script="scripts/pretrain.py"):
    env = {**os.environ, "ACCELERATE_USE_CPU": "true"}
    cmd = command(processes, script)
    if fault:
        env["SINEBERT_FAULT"] = fault
        cmd = [*command(processes, "tests/fault_injection.py"), script]
    result = subprocess.run([*cmd, *map(str, args), "--output_dir", str(out)], capture_output=True, text=True,
                            timeout=600, env=env, cwd=ROOT)
    if expect_ok:
        assert result.returncode == 0, result.stderr[-4000:]
    return result


def error_line(result) -> str:
    """The script's one-sentence error. (accelerate launch adds its own report that the child failed.)"""
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, result.stderr[-3000:]
    return lines[0]


def losses(folder) -> dict[int, float]:
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows if "loss" in r}


def assert_same_run(folder, reference):
    assert losses(folder) == losses(reference)
    a, b = load_file(folder / "model.safetensors"), load_file(reference / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture(scope="module")
def reference(run_args, tmp_path_factory):
    """Uninterrupted runs with one and with two processes."""
    folders = {}
    for processes in (1, 2):
        folders[processes] = tmp_path_factory.mktemp(f"reference{processes}")
        run(run_args, folders[processes], processes)
    return folders


def resume(run_args, out, processes=1, *extra):
    return run([*run_args, "--resume_from_checkpoint", "latest", *extra], out, processes)


def test_whole_job_killed_at_a_random_step(run_args, reference, tmp_path):
    out = tmp_path / "run"
    kill_after = random.Random().randint(3, STEPS - 3)
    env = {**os.environ, "ACCELERATE_USE_CPU": "true"}
    job = subprocess.Popen([*command(2), *map(str, run_args), "--output_dir", str(out)], cwd=ROOT, env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 300
    while time.time() < deadline and job.poll() is None:
        if (out / "metrics.jsonl").exists() and max(losses(out), default=0) >= kill_after:
            break
        time.sleep(0.05)
    os.killpg(job.pid, signal.SIGKILL)
    job.wait()
    assert max(losses(out), default=0) < STEPS, f"the job finished before the kill after step {kill_after}"
    resume(run_args, out, 2)
    assert_same_run(out, reference[2])


def test_one_rank_killed(run_args, reference, tmp_path):
    out = tmp_path / "run"
    failed = run(run_args, out, 2, fault="kill_rank:1:7", expect_ok=False)
    assert failed.returncode != 0 and max(losses(out)) < STEPS
    resume(run_args, out, 2)
    assert_same_run(out, reference[2])


def test_kill_while_writing_a_checkpoint(run_args, reference, tmp_path):
    out = tmp_path / "run"
    failed = run(run_args, out, 1, fault="kill_in_save:3", expect_ok=False)  # the 3rd checkpoint is step 6
    assert failed.returncode != 0
    folders = sorted(p.name for p in (out / "checkpoints").iterdir())
    assert folders == [".tmp-step_00000006", "step_00000002", "step_00000004"]
    resumed = resume(run_args, out)
    assert "Resumed from" in resumed.stdout and "step_00000004 at step 4" in resumed.stdout
    assert_same_run(out, reference[1])
    assert not list((out / "checkpoints").glob(".tmp-*"))


@pytest.mark.parametrize("damage", ["truncate", "delete"])
def test_damaged_checkpoint_is_named_and_skipped_when_asked(run_args, reference, tmp_path, damage):
    out = tmp_path / "run"
    shutil.copytree(reference[1], out)
    newest = out / "checkpoints" / f"step_{STEPS:08d}"
    target = newest / "model.safetensors"
    if damage == "truncate":
        with target.open("r+b") as file:
            file.truncate(target.stat().st_size // 2)
    else:
        target.unlink()
    error = error_line(run([*run_args, "--resume_from_checkpoint", "latest"], out, expect_ok=False))
    assert str(target) in error and "--resume_fallback" in error
    assert ("truncated" if damage == "truncate" else "missing") in error
    recovered = resume(run_args, out, 1, "--resume_fallback")
    assert f"step_{STEPS - 2:08d} at step {STEPS - 2}" in recovered.stdout
    assert_same_run(out, reference[1])


def test_nan_loss_stops_with_the_last_good_checkpoint_kept(run_args, tmp_path):
    out = tmp_path / "run"
    error = error_line(run(run_args, out, 1, fault="nan_loss:5", expect_ok=False))
    assert error.startswith("error: The training loss became NaN/Inf at step 5")
    assert "the last good checkpoint is" in error and "step_00000004" in error
    manager = CheckpointManager(_FakeAccelerator(), out)
    manager.verify(manager.path_for(4))


def test_nan_loss_skip_drops_that_update(run_args, tmp_path):
    out = tmp_path / "run"
    run([*run_args, "--nonfinite_loss", "skip"], out, 1, fault="nan_loss:5")
    logged = losses(out)
    assert logged[5] != logged[5] and all(logged[s] == logged[s] for s in logged if s != 5)  # NaN only at step 5
    assert all(torch.isfinite(t).all() for t in load_file(out / "model.safetensors").values())


def test_disk_full_while_saving_keeps_the_previous_checkpoint(run_args, tmp_path):
    out = tmp_path / "run"
    error = error_line(run(run_args, out, 1, fault="disk_full:2", expect_ok=False))
    assert "because the disk is full" in error and "the previous checkpoint step_00000002 is intact" in error
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_00000002"]
    manager = CheckpointManager(_FakeAccelerator(), out)
    manager.verify(manager.path_for(2))


class _FakeAccelerator:
    """Enough of an Accelerator for CheckpointManager.verify."""

    is_main_process = True

    def print(self, *args):
        print(*args)
