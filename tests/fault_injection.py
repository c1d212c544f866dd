"""Run a training script with one injected fault, chosen by the SINEBERT_FAULT environment variable:

    kill_rank:<rank>:<step>     SIGKILL process <rank> right after optimizer step <step>
    kill_in_save:<n>            SIGKILL the main process in the middle of writing its n-th checkpoint
    disk_full:<n>:<writer>      the n-th checkpoint write fails as <writer> fails on a full disk: os (an OSError),
                                torch (torch.save of the optimizer) or safetensors (the model weights)
    disk_full_final             the final save_pretrained fails as safetensors does on a full disk
    disk_full_log:<step>        appending the metrics of optimizer step <step> fails with "No space left on device"
    nan_loss:<step>             the training loss of optimizer step <step> is NaN

Usage (also as the script of `accelerate launch`): python tests/fault_injection.py scripts/pretrain.py ARGS...
The faults are injected by wrapping sinebert's own functions; the script itself is unchanged. A test that runs the
script in the test's process calls `inject` with its monkeypatch's setattr, which puts every wrapper back after.
"""

import errno
import os
import runpy
import signal
import sys

import torch
from transformers import PreTrainedModel

from sinebert.training import checkpoint, loop, reporting


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


def kill_rank(rank: str, step: str, install=setattr):
    original = loop.Trainer._optimizer_step

    def step_then_die(self, *args):
        result = original(self, *args)
        if _rank() == int(rank) and self.state.step + 1 == int(step):
            os.kill(os.getpid(), signal.SIGKILL)
        return result

    install(loop.Trainer, "_optimizer_step", step_then_die)


def _on_nth_save(n: str, action, install):
    """Wrap Accelerator.save_state as the checkpoint manager calls it: `action(folder)` on the n-th call."""
    calls = {"count": 0}

    def wrap(accelerator):
        original = accelerator.save_state

        def save_state(folder, **kwargs):
            calls["count"] += 1
            result = original(folder, **kwargs)
            if calls["count"] == int(n) and accelerator.is_main_process:
                action(folder)
            return result

        accelerator.save_state = save_state

    manager_init = checkpoint.CheckpointManager.__init__

    def init(self, accelerator, *args, **kwargs):
        manager_init(self, accelerator, *args, **kwargs)
        wrap(accelerator)

    install(checkpoint.CheckpointManager, "__init__", init)


def kill_in_save(n: str, install=setattr):
    def die(folder):
        # Leave a half-written file behind, as a process killed mid-write does.
        with open(os.path.join(folder, "model.safetensors"), "r+b") as file:
            file.truncate(100)
        os.kill(os.getpid(), signal.SIGKILL)

    _on_nth_save(n, die, install)


# What each writer raises when the disk fills up (seen on a 3 MB tmpfs), its text as the libraries word it.
def _full(writer: str, folder: str) -> Exception:
    if writer == "torch":
        return RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 8910336 vs 8910224")
    if writer == "safetensors":
        from safetensors import SafetensorError

        return SafetensorError('Error while serializing: I/O error: No space left on device (os error 28)')
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), os.path.join(folder, "optimizer.bin"))


def disk_full(n: str, writer: str = "os", install=setattr):
    def fail(folder):
        raise _full(writer, folder)

    _on_nth_save(n, fail, install)


def disk_full_final(install=setattr):
    def fail(self, folder, *args, **kwargs):
        os.makedirs(folder, exist_ok=True)
        open(os.path.join(folder, "model.safetensors"), "wb").close()  # a partial file, as a real failure leaves
        raise _full("safetensors", folder)

    install(PreTrainedModel, "save_pretrained", fail)


def disk_full_log(step: str, install=setattr):
    from pathlib import Path

    original = reporting.MetricsLog.write

    def write(self, **row):
        if row.get("step") != int(step):
            return original(self, **row)

        def full(path, *args, **kwargs):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

        saved, Path.open = Path.open, full  # for this one call: the log's append finds the disk full
        try:
            return original(self, **row)
        finally:
            Path.open = saved

    install(reporting.MetricsLog, "write", write)


def nan_loss(step: str, install=setattr):
    original = loop.Trainer._optimizer_step

    def poisoned(self, *args):
        if self.state.step + 1 == int(step):
            real_forward = self.model.forward

            def forward(*args, **kwargs):
                outputs = real_forward(*args, **kwargs)
                outputs.loss = outputs.loss * torch.tensor(float("nan"))
                return outputs

            self.model.forward = forward
            try:
                return original(self, *args)
            finally:
                self.model.forward = real_forward
        return original(self, *args)

    install(loop.Trainer, "_optimizer_step", poisoned)


FAULTS = {"kill_rank": kill_rank, "kill_in_save": kill_in_save, "disk_full": disk_full, "nan_loss": nan_loss,
          "disk_full_final": disk_full_final, "disk_full_log": disk_full_log}


def inject(fault: str, install=setattr):
    """Install `fault`, written as SINEBERT_FAULT takes it (`nan_loss:5`), each wrapper with `install(owner, name,
    wrapper)`."""
    name, *params = fault.split(":")
    FAULTS[name](*params, install=install)


if __name__ == "__main__":
    inject(os.environ["SINEBERT_FAULT"])
    script, *arguments = sys.argv[1:]
    sys.argv = [script, *arguments]
    runpy.run_path(script, run_name="__main__")
