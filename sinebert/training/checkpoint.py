"""Resumable checkpoints that a killed process or a full disk cannot corrupt.

A checkpoint is written into a hidden temporary folder, given a manifest (size and SHA-256 of every file), and
only then renamed to `checkpoints/step_<8-digit step>`; the rename is atomic, so a folder with that name is always
complete. Old checkpoints are removed only after a new one is in place.
"""

import hashlib
import json
import logging
import os
import pickle
import shutil
from pathlib import Path

from accelerate import Accelerator
from safetensors import SafetensorError
from accelerate.utils.constants import RNG_STATE_NAME

from .errors import one_line, write_failure
from .sharding import check_sharded_index

MANIFEST = "manifest.json"
TRAINER_STATE = "trainer_state.json"
PREFIX = "step_"


class _TiedWeightsWarning(logging.Filter):
    """Drops accelerate's warning that it left the tied decoder weight out of the checkpoint: loading the state
    ties it to the word embeddings again (resume is tested to be exact), so the warning would only alarm users."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Removed shared tensor" not in record.getMessage()


logging.getLogger("accelerate.utils.other").addFilter(_TiedWeightsWarning())


class CheckpointError(RuntimeError):
    """A checkpoint is missing, damaged, or could not be written."""


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for chunk in iter(lambda: file.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _fsync_dir(path: Path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _manifest_files(path: Path) -> dict:
    """{file name: {"size", "sha256"}} from checkpoint `path`'s manifest; CheckpointError for a missing or malformed
    one (not JSON, not the layout this module writes, a field renamed or of the wrong type)."""
    manifest_file = path / MANIFEST
    if not manifest_file.is_file():
        raise CheckpointError(f"{manifest_file} is missing, so checkpoint {path} is incomplete or not ours.")
    try:
        files = json.loads(manifest_file.read_text())["files"]
        valid = isinstance(files, dict) and files and all(
            isinstance(entry, dict) and isinstance(entry.get("size"), int) and isinstance(entry.get("sha256"), str)
            for entry in files.values()
        )
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as error:
        valid, reason = False, f"{type(error).__name__}: {error}"
    else:
        reason = "it does not give every file's size and checksum"
    if not valid:
        raise CheckpointError(f"{manifest_file} is damaged ({reason}); checkpoint {path} cannot be trusted.")
    return files


class CheckpointManager:
    """Saves, lists, verifies and loads the checkpoints under `output_dir/checkpoints`."""

    def __init__(self, accelerator: Accelerator, output_dir: str | Path, total_limit: int | None = 2):
        self.accelerator = accelerator
        self.root = Path(output_dir) / "checkpoints"
        self.total_limit = total_limit

    def path_for(self, step: int) -> Path:
        return self.root / f"{PREFIX}{step:08d}"

    def complete(self) -> list[Path]:
        """Finished checkpoints, oldest first (temporary folders of interrupted saves are never listed)."""
        if not self.root.is_dir():
            return []
        return sorted(p for p in self.root.iterdir() if p.is_dir() and p.name.startswith(PREFIX))

    def save(self, step: int, trainer_state: dict) -> Path:
        """Write the accelerator state (model, optimizer, scheduler, RNG) and `trainer_state` for `step`."""
        accelerator = self.accelerator
        final = self.path_for(step)
        temporary = self.root / f".tmp-{final.name}"
        if accelerator.is_main_process:
            shutil.rmtree(temporary, ignore_errors=True)
            temporary.mkdir(parents=True)
        accelerator.wait_for_everyone()
        try:
            accelerator.save_state(str(temporary), safe_serialization=True)
            accelerator.wait_for_everyone()
            if accelerator.is_main_process:
                (temporary / TRAINER_STATE).write_text(json.dumps(trainer_state, indent=1))
                # Files in subfolders too: under FSDP each process writes its shards into pytorch_model_fsdp_0/ and
                # optimizer_0/ (torch.distributed.checkpoint's layout).
                files = sorted(p for p in temporary.rglob("*") if p.is_file())
                manifest = {
                    p.relative_to(temporary).as_posix(): {"size": p.stat().st_size, "sha256": _sha256(p)}
                    for p in files
                }
                (temporary / MANIFEST).write_text(json.dumps({"step": step, "files": manifest}, indent=1))
                for file in [*files, temporary / MANIFEST]:
                    with file.open("rb") as handle:
                        os.fsync(handle.fileno())
                for folder in {file.parent for file in files}:
                    _fsync_dir(folder)
                if final.exists():  # a stale checkpoint of the same step from an earlier run of this folder
                    shutil.rmtree(final)
                os.replace(temporary, final)
                _fsync_dir(self.root)
        except (OSError, RuntimeError, SafetensorError) as error:
            reason = write_failure(error)
            if reason is None:
                raise
            if accelerator.is_main_process:
                shutil.rmtree(temporary, ignore_errors=True)
            previous = [p.name for p in self.complete() if p != final]
            kept = f"the previous checkpoint {previous[-1]} is intact" if previous else "no earlier checkpoint exists"
            raise CheckpointError(
                f"Could not write checkpoint {final} because {reason}; {kept}. Free space or choose another "
                "--output_dir, then resume with --resume_from_checkpoint latest."
            ) from error
        accelerator.wait_for_everyone()
        self._prune()
        return final

    def _prune(self):
        if self.accelerator.is_main_process and self.total_limit:
            for old in self.complete()[: -self.total_limit]:
                shutil.rmtree(old, ignore_errors=True)
        self.accelerator.wait_for_everyone()

    def verify(self, path: Path):
        """Raise CheckpointError naming the first missing, truncated or altered file of checkpoint `path`, or the
        part of it that cannot be loaded (this process's random state, which accelerate would skip without a word,
        leaving the resumed run on fresh random numbers)."""
        for name, expected in _manifest_files(path).items():
            file = path / name
            if not file.is_file():
                raise CheckpointError(f"{file} is missing from checkpoint {path}.")
            if file.stat().st_size != expected["size"]:
                raise CheckpointError(
                    f"{file} has {file.stat().st_size} bytes but was written with {expected['size']}: it is truncated "
                    "or damaged."
                )
            if _sha256(file) != expected["sha256"]:
                raise CheckpointError(f"{file} does not match the checksum it was written with: it is damaged.")
        self._check_random_state(path)
        problem = check_sharded_index(path)
        if problem:
            raise CheckpointError(
                f"{problem}; it was refused because unpickling other objects can run code, so checkpoint {path} "
                "cannot be trusted. Resume from a checkpoint this project wrote."
            )

    def _check_random_state(self, path: Path):
        from accelerate.utils import load  # torch.load with weights_only=True and numpy's types allowed

        file = path / f"{RNG_STATE_NAME}_{self.accelerator.process_index}.pkl"
        try:
            states = load(file)
            missing = {"random_state", "numpy_random_seed", "torch_manual_seed"} - set(states)
        except pickle.UnpicklingError:
            raise CheckpointError(
                f"{file} holds pickled objects other than tensors; it was refused because unpickling such objects can "
                f"run code, so checkpoint {path} cannot resume exactly. Resume from a checkpoint this project wrote."
            ) from None
        except Exception as error:  # any other failure to read it: missing, not a mapping
            reason = one_line(error, 160)
            raise CheckpointError(
                f"{file} cannot be loaded ({type(error).__name__}: {reason}), so checkpoint {path} would not resume "
                "exactly; it is damaged."
            ) from None
        if missing:
            raise CheckpointError(f"{file} lacks {sorted(missing)}, so checkpoint {path} would not resume exactly.")

    def resolve(self, requested: str, fallback: bool = False) -> Path:
        """The checkpoint folder to resume from: a path, or 'latest'. Damaged ones raise CheckpointError, or with
        `fallback` are skipped in favour of the newest intact one before them."""
        if requested == "latest":
            candidates = self.complete()
            if not candidates:
                raise CheckpointError(
                    f"--resume_from_checkpoint latest found no checkpoint in {self.root}; start without it, or point "
                    "it at a checkpoint folder."
                )
        else:
            path = Path(requested)
            if not path.is_dir():
                raise CheckpointError(f"--resume_from_checkpoint {requested} is not a folder.")
            candidates = [p for p in self.complete() if p.resolve() < path.resolve()] + [path]
        errors = []
        for candidate in reversed(candidates):
            try:
                self.verify(candidate)
                return candidate
            except CheckpointError as error:
                if not fallback:
                    raise CheckpointError(
                        f"{error} Resume from an earlier checkpoint, or pass --resume_fallback to use the newest "
                        "intact one."
                    ) from None
                errors.append(str(error))
                self.accelerator.print(f"Skipping damaged checkpoint: {error}")
        raise CheckpointError("No intact checkpoint to resume from: " + " ".join(errors))

    def load(self, path: Path) -> dict:
        """Restore the accelerator state from `path`; returns its trainer state.

        Optimizer, scheduler and RNG files are read with `torch.load(weights_only=True)` (accelerate's default),
        which refuses anything but tensors and plain containers: a crafted pickle cannot run code here.
        """
        try:
            self.accelerator.load_state(str(path))
        except pickle.UnpicklingError as error:
            raise CheckpointError(
                f"Checkpoint {path} holds a file with pickled objects other than tensors "
                f"({str(error).splitlines()[0][:160]}); it was refused because unpickling such objects can run code. "
                "Resume from a checkpoint this project wrote."
            ) from None
        except RuntimeError as error:
            if "size mismatch" not in str(error):
                raise
            first = next((line.strip() for line in str(error).splitlines() if "size mismatch" in line), "")
            raise CheckpointError(
                f"Checkpoint {path} was written by a model of another size ({first[:160]}); resume with the model "
                "flags it was written with (its run's args.json), or start a new run in another --output_dir."
            ) from None
        except ValueError as error:
            if "parameter group" not in str(error):
                raise
            raise CheckpointError(
                f"Checkpoint {path} was written with other optimizer parameter groups than this run's ({error}); "
                "resume with the settings it was written with (its --optim, --embedding_learning_rate given or not, "
                "the same model), or start a new run."
            ) from None
        return json.loads((path / TRAINER_STATE).read_text())
