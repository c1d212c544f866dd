"""Killed runs lose nothing: real SIGKILLs (of the whole job, of one rank, in the middle of a checkpoint), damaged
checkpoints, NaN losses and a full disk, each followed by the check that matters (exact resumption, a clear error,
the last good checkpoint intact)."""

import contextlib
import hashlib
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

from sinebert.training.checkpoint import CheckpointError, CheckpointManager
from tests import fault_injection
from tests.conftest import (ROOT, THREADS, accelerate_command, load_script, run_here, torch_threads,
                            user_error)

pytestmark = pytest.mark.slow

STEPS = 16


def command(processes: int, script: str = "scripts/pretrain.py") -> list[str]:
    return accelerate_command(script, processes, threads=THREADS if processes == 1 else 1)


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


def run(args, out, processes=1, fault=None, expect_ok=True):
    """The pretraining script launched on `processes` processes, with `fault` injected."""
    env = {**os.environ, "ACCELERATE_USE_CPU": "true"}
    cmd = command(processes, "scripts/pretrain.py")
    if fault:
        env["SINEBERT_FAULT"] = fault
        cmd = [*command(processes, "tests/fault_injection.py"), "scripts/pretrain.py"]
    result = subprocess.run([*cmd, *map(str, args), "--output_dir", str(out)], capture_output=True, text=True,
                            timeout=600, env=env, cwd=ROOT)
    if expect_ok:
        assert result.returncode == 0, result.stderr[-4000:]
    return result


@contextlib.contextmanager
def here(fault=None):
    """The pretraining script, to run in this process on as many threads as `run` launches one process on, with `fault`
    injected for the block. For what needs no process of its own: refusals, the faults the loop itself handles (a NaN
    loss, a full disk) and resumes. (A launch spends most of its 15 s importing torch and transformers.)"""
    with pytest.MonkeyPatch.context() as patch, torch_threads(THREADS):
        if fault:
            fault_injection.inject(fault, patch.setattr)  # put back when the block ends
        yield load_script("pretrain")


def error_here(capsys, args, out, fault=None) -> str:
    """The one sentence (exit status 2) with which the script, run here, refuses to start or stops."""
    with here(fault) as script:
        return user_error(capsys, script, [*args, "--output_dir", out])


def losses(folder) -> dict[int, float]:
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows if "loss" in r}


def assert_same_run(folder, reference):
    assert losses(folder) == losses(reference)
    a, b = load_file(folder / "model.safetensors"), load_file(reference / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture(scope="module")
def reference(run_args, tmp_path_factory):
    """Uninterrupted runs: one process (run here) and two processes (launched)."""
    folders = {1: tmp_path_factory.mktemp("reference1"), 2: tmp_path_factory.mktemp("reference2")}
    run_here("pretrain", *run_args, "--output_dir", folders[1])
    run(run_args, folders[2], 2)
    return folders


def resume(run_args, out, processes):
    return run([*run_args, "--resume_from_checkpoint", "latest"], out, processes)


def resume_here(capsys, run_args, out, *extra) -> str:
    """Resume `out` in this process; returns what the run printed."""
    capsys.readouterr()
    run_here("pretrain", *run_args, "--resume_from_checkpoint", "latest", *extra, "--output_dir", out)
    return capsys.readouterr().out


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
    # Elastic runs each worker in a session of its own, out of reach of the killpg: they must die with the launcher.
    deadline = time.time() + 10
    while workers_of(out) and time.time() < deadline:
        time.sleep(0.2)
    assert not workers_of(out), "workers outlived their launcher"
    assert lock_released(out)
    assert max(losses(out), default=0) < STEPS, f"the job finished before the kill after step {kill_after}"
    resume(run_args, out, 2)
    assert_same_run(out, reference[2])


def test_a_second_job_on_a_running_folder_is_refused_and_a_killed_job_leaves_no_lock(run_args, tmp_path, capsys):
    from sinebert.training.loop import RunLock

    out = tmp_path / "run"
    env = {**os.environ, "ACCELERATE_USE_CPU": "true"}
    long_run = [*run_args, "--max_train_steps", 100_000, "--checkpointing_steps", 100_000]
    job = subprocess.Popen([*command(1), *map(str, long_run), "--output_dir", str(out)], cwd=ROOT, env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    lock = out / RunLock.NAME
    deadline = time.time() + 120
    while not (lock.exists() and lock.read_text()) and time.time() < deadline:
        time.sleep(0.1)
    try:
        holder = lock.read_text().strip()
        # What the README says to do after a kill, done while the first job still runs: refused, nothing touched.
        message = user_error(capsys, load_script("pretrain"), [*run_args, "--resume_from_checkpoint", "latest",
                                                               "--output_dir", out])
        assert f"is in use by another job ({holder})" in message and holder.startswith("host "), message
        assert job.poll() is None and lock.read_text().strip() == holder
    finally:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait()
    assert lock_released(out)  # no stale lock


def lock_released(out) -> bool:
    """Whether the output folder's lock can be taken within 10 s: a killed process gives up its files (and the kernel
    its lock) a moment after it is gone from the process list."""
    from sinebert.training.loop import RunLock

    deadline = time.time() + 10
    while RunLock.take(out) is not None:
        if time.time() > deadline:
            return False
        time.sleep(0.2)
    RunLock.release()
    return True


def workers_of(out) -> list[int]:
    """The processes whose command line names the output folder `out`."""
    import psutil

    found = []
    for process in psutil.process_iter(["pid", "cmdline"]):
        if str(out) in (process.info["cmdline"] or []) and process.info["pid"] != os.getpid():
            found.append(process.info["pid"])
    return found


def test_one_rank_killed(run_args, reference, tmp_path):
    out = tmp_path / "run"
    failed = run(run_args, out, 2, fault="kill_rank:1:7", expect_ok=False)
    assert failed.returncode != 0 and max(losses(out)) < STEPS
    resume(run_args, out, 2)
    assert_same_run(out, reference[2])


def test_kill_while_writing_a_checkpoint(run_args, reference, tmp_path, capsys):
    out = tmp_path / "run"
    failed = run(run_args, out, 1, fault="kill_in_save:3", expect_ok=False)  # the 3rd checkpoint is step 6
    assert failed.returncode != 0
    folders = sorted(p.name for p in (out / "checkpoints").iterdir())
    assert folders == [".tmp-step_00000006", "step_00000002", "step_00000004"]
    printed = resume_here(capsys, run_args, out)
    assert "Resumed from" in printed and "step_00000004 at step 4" in printed
    assert_same_run(out, reference[1])
    assert not list((out / "checkpoints").glob(".tmp-*"))


class CodeRunner:
    """Unpickling this runs a shell command: what a crafted random-state file would hold."""

    def __reduce__(self):
        return (os.system, ("true",))


def damage_checkpoint(newest, damage: str) -> tuple[str, str]:
    """Damage checkpoint folder `newest` in one of the ways below; returns (what the error names, how it says it)."""
    target, manifest_file = newest / "model.safetensors", newest / "manifest.json"
    manifest = json.loads(manifest_file.read_text())
    if damage == "truncate":
        with target.open("r+b") as file:
            file.truncate(target.stat().st_size // 2)
        return str(target), "truncated"
    if damage == "delete":
        target.unlink()
        return str(target), "missing"
    if damage in ("manifest []", "manifest entry {}", "manifest flipped bit"):
        first = next(iter(manifest["files"]))
        if damage == "manifest []":
            manifest["files"] = []
        elif damage == "manifest entry {}":
            manifest["files"][first] = {}
        else:
            manifest["files"][first]["sizd"] = manifest["files"][first].pop("size")
        manifest_file.write_text(json.dumps(manifest))
        return str(manifest_file), "is damaged"
    # A random-state file that runs code when unpickled, with a manifest that vouches for it: accelerate would skip
    # it without a word and resume on fresh random numbers.
    import pickle

    rng = newest / "random_states_0.pkl"
    rng.write_bytes(pickle.dumps({"random_state": CodeRunner()}))
    manifest["files"][rng.name] = {"size": rng.stat().st_size, "sha256": hashlib.sha256(rng.read_bytes()).hexdigest()}
    manifest_file.write_text(json.dumps(manifest))
    return str(rng), "was refused because unpickling such objects can run code"


DAMAGES = ["truncate", "delete", "manifest []", "manifest entry {}", "manifest flipped bit", "random state"]


@pytest.mark.parametrize("damage", DAMAGES)
def test_every_damage_is_named_and_the_fallback_takes_the_intact_checkpoint_before_it(reference, tmp_path, damage):
    out = tmp_path / "run"
    shutil.copytree(reference[1], out)
    named, said = damage_checkpoint(out / "checkpoints" / f"step_{STEPS:08d}", damage)
    manager = CheckpointManager(_FakeAccelerator(), out)
    with pytest.raises(CheckpointError) as error:
        manager.resolve("latest")
    assert named in str(error.value) and said in str(error.value) and "--resume_fallback" in str(error.value)
    assert manager.resolve("latest", fallback=True) == manager.path_for(STEPS - 2)


@pytest.mark.parametrize("damage", ["truncate", "random state"])
def test_damaged_checkpoint_is_named_and_skipped_when_asked(run_args, reference, tmp_path, damage, capsys):
    """End to end, for a damaged file and for the part accelerate would skip: the run's own sentence, then
    --resume_fallback resumes exactly."""
    out = tmp_path / "run"
    shutil.copytree(reference[1], out)
    named, said = damage_checkpoint(out / "checkpoints" / f"step_{STEPS:08d}", damage)
    error = error_here(capsys, [*run_args, "--resume_from_checkpoint", "latest"], out)
    assert named in error and said in error and "--resume_fallback" in error, error
    assert f"step_{STEPS - 2:08d} at step {STEPS - 2}" in resume_here(capsys, run_args, out, "--resume_fallback")
    assert_same_run(out, reference[1])


def test_resuming_with_another_model_size_is_one_sentence(run_args, reference, tmp_path, capsys):
    out = tmp_path / "run"
    shutil.copytree(reference[1], out)
    error = error_here(capsys, [*run_args, "--hidden_size", 64, "--resume_from_checkpoint", "latest"], out)
    assert "was written by a model of another size" in error and "args.json" in error


def test_resuming_with_another_learning_rate_is_refused_not_ignored(run_args, reference, tmp_path, capsys):
    out = tmp_path / "run"
    shutil.copytree(reference[1], out)
    error = error_here(capsys, [*run_args, "--learning_rate", "5e-4", "--resume_from_checkpoint", "latest"], out)
    assert "--learning_rate 0.0005 (the checkpoint's run: 0.001)" in error, error


def test_nan_loss_stops_with_the_last_good_checkpoint_kept(run_args, tmp_path, capsys):
    out = tmp_path / "run"
    error = error_here(capsys, run_args, out, "nan_loss:5")
    assert error.startswith("error: The training loss became NaN/Inf at step 5")
    assert "the last good checkpoint is" in error and "step_00000004" in error
    manager = CheckpointManager(_FakeAccelerator(), out)
    manager.verify(manager.path_for(4))


def test_nan_loss_skip_drops_that_update(run_args, tmp_path):
    out = tmp_path / "run"
    with here("nan_loss:5") as script:
        script.main([str(a) for a in [*run_args, "--nonfinite_loss", "skip", "--output_dir", out]])
    logged = losses(out)
    assert logged[5] != logged[5] and all(logged[s] == logged[s] for s in logged if s != 5)  # NaN only at step 5
    assert all(torch.isfinite(t).all() for t in load_file(out / "model.safetensors").values())


def test_each_writer_s_full_disk_is_recognised():
    """What each writer of a run raises on a full disk (tests/fault_injection.py words them as the libraries do)."""
    from tests.fault_injection import _full

    from sinebert.training.errors import write_failure

    for writer in ("os", "torch", "safetensors"):
        assert write_failure(_full(writer, "/tmp")) == "the disk is full", writer
    assert write_failure(ValueError("not a write")) is None


def test_disk_full_while_saving_keeps_the_previous_checkpoint(run_args, tmp_path, capsys):
    """torch.save of the optimizer fails on a full disk in its own words (not an OSError): one sentence."""
    out = tmp_path / "run"
    error = error_here(capsys, run_args, out, "disk_full:2:torch")
    assert "because the disk is full" in error and "the previous checkpoint step_00000002 is intact" in error
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_00000002"]
    manager = CheckpointManager(_FakeAccelerator(), out)
    manager.verify(manager.path_for(2))


@pytest.mark.parametrize(("fault", "said"), [("disk_full_final", "Could not save the final model"),
                                             ("disk_full_log:5", "Could not append to")])
def test_disk_full_in_the_final_save_or_the_log_is_one_sentence_and_resumes_exactly(run_args, reference, tmp_path,
                                                                                    fault, said, capsys):
    out = tmp_path / "run"
    error = error_here(capsys, run_args, out, fault)
    assert said in error and "because the disk is full" in error and "--resume_from_checkpoint latest" in error
    assert not (out / ".tmp-final").exists()
    resume_here(capsys, run_args, out)
    assert_same_run(out, reference[1])


class _FakeAccelerator:
    """Enough of an Accelerator for CheckpointManager.verify."""

    is_main_process = True
    process_index = 0

    def print(self, *args):
        print(*args)
