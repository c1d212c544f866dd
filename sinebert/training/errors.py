"""User-facing failures: one clear sentence, no stack trace from deep inside a library."""

import errno
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

# Folders this process created for a run (its --output_dir); a run that fails with a UserError while one is still
# empty removes it, so bad input leaves nothing behind. Before that, what release_on_error registered runs (the
# output folder's lock).
_created_folders: list[Path] = []
_releases: list[Callable[[], object]] = []


def release_on_error(release: Callable[[], object]):
    _releases.append(release)


class UserError(Exception):
    """Bad input or a bad situation the user can fix; the message says what was wrong and what to do."""


class SharedUserError(UserError):
    """A UserError that every process of a multi-process run raises alike, from a decision the main process shared
    with them; only the main process prints it. (Raised by the main process alone, it would leave the others to fail
    in their next collective call with a communication backend's traceback.)"""


def one_line(error: BaseException, limit: int | None = None) -> str:
    """A library's error message on one line (its whitespace and newlines collapsed), at most `limit` characters if
    given, to quote inside a sentence."""
    return " ".join(str(error).split())[:limit]


def write_failure(error: BaseException) -> str | None:
    """Why a write failed, when `error` is one of the ways the writers of a run report a failed write, else None:
    an OSError (the metrics log, json, renames), torch.save's RuntimeError from its zip writer ("unexpected pos",
    "file write failed") and safetensors' SafetensorError, which carry the OS's reason only in their text."""
    text = str(error)
    if isinstance(error, OSError):
        return "the disk is full" if error.errno == errno.ENOSPC else f"the write failed ({text})"
    if type(error).__name__ == "SafetensorError" or (
        isinstance(error, RuntimeError) and ("inline_container" in text or "file write failed" in text)
    ):
        if "No space left" in text or "unexpected pos" in text:  # torch's zip writer says the latter when it is full
            return "the disk is full"
        return f"the write failed ({one_line(error, 160)})"
    return None


def write_staged(output: Path, name: str, write: Callable[[Path], object], last: str | None = None) -> str | None:
    """`write(staging)` into the hidden folder `output/.tmp-<name>`, then each file moved into `output` with an
    atomic rename (`last` after the others), so a killed or failed write never leaves a partly written file there.
    Returns None, or why the write failed (`write_failure`; the staging folder is removed), as a full disk fails it."""
    staging = output / f".tmp-{name}"
    shutil.rmtree(staging, ignore_errors=True)
    try:
        write(staging)
    except Exception as error:
        reason = write_failure(error)
        if reason is None:
            raise
        shutil.rmtree(staging, ignore_errors=True)
        return reason
    for file in sorted(staging.iterdir(), key=lambda file: file.name == last):
        os.replace(file, output / file.name)
    staging.rmdir()
    return None


def make_folder(path: Path):
    """`path.mkdir(parents=True, exist_ok=True)`, remembering the folders it creates (see run_cli)."""
    missing = [folder for folder in (path, *path.parents) if not folder.exists()]
    path.mkdir(parents=True, exist_ok=True)
    _created_folders.extend(reversed(missing))  # outermost first; removed innermost first


def _clean_up_after_error():
    """Release what release_on_error registered, then remove the created folders that are still empty."""
    for release in _releases:
        release()
    for folder in reversed(_created_folders):
        if folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()


def run_cli(main: Callable[[], object]):
    """Run a script's `main`, turning user errors into `error: <sentence>` and exit status 2.

    Set SINEBERT_DEBUG=1 to see the full traceback instead.
    """
    from .checkpoint import CheckpointError

    try:
        main()
    except (UserError, CheckpointError) as error:
        _clean_up_after_error()
        if os.environ.get("SINEBERT_DEBUG"):
            raise
        if not isinstance(error, SharedUserError) or os.environ.get("RANK", "0") == "0":
            print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
