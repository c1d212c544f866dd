"""One job per output folder: an exclusive lock that the kernel releases with the process."""

import os
import sys
import time
from pathlib import Path

from .errors import make_folder, release_on_error


class RunLock:
    """An exclusive lock on `output_dir/.sinebert.lock`, held by the main process for the whole run. The kernel
    releases it when the process ends, however it ends, so a killed run never leaves a stale lock; the file names
    the holder for the sentence a second job gets."""

    NAME = ".sinebert.lock"
    _held = None  # the open file: the lock lives as long as it does

    @classmethod
    def take(cls, output: Path) -> str | None:
        """None once this process holds the lock, else who holds it (host, pid, since when)."""
        import fcntl
        import socket

        file = (output / cls.NAME).open("a+", encoding="utf-8")
        try:
            fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            file.seek(0)
            holder = file.read().strip() or "its holder wrote no name"
            file.close()
            return holder
        file.truncate(0)
        file.write(f"host {socket.gethostname()}, pid {os.getpid()}, since {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        file.flush()
        cls._held = file
        release_on_error(cls.release)
        return None

    @classmethod
    def release(cls):
        """Give the lock up and remove its file (at the end of the run, or when it fails on bad input)."""
        if cls._held is not None:
            Path(cls._held.name).unlink(missing_ok=True)
            cls._held.close()
            cls._held = None


def take_folder(output: Path) -> str | None:
    """Create `output` if need be (a run that then fails removes it again) and lock it for this process: None once it
    is this job's, else the sentence that refuses it."""
    try:
        import fcntl  # noqa: F401
    except ModuleNotFoundError:  # Windows: before anything is written, rather than a traceback from RunLock.take
        return (f"--output_dir {output} cannot be locked for this job: the lock is fcntl's flock, which this system "
                f"({sys.platform}) lacks; run sinebert's scripts on Linux or macOS, or under WSL 2 on Windows.")
    try:
        make_folder(output)
    except OSError:
        pass
    if not (output.is_dir() and os.access(output, os.W_OK | os.X_OK)):
        return (f"--output_dir {output} cannot be created or written (a file has that name, or its filesystem is "
                "read-only or not yours); choose a folder you can write.")
    holder = RunLock.take(output)
    if holder:
        return (f"--output_dir {output} is in use by another job ({holder}); wait for it to end or stop it, or "
                "choose another folder.")
    return None
