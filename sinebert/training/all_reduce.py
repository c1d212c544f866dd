"""The gradient all-reduce of data-parallel processes on the CPUs of one machine, through shared memory.

DDP on CPUs averages gradients over gloo, which sends them through the kernel's loopback sockets: for the cram's
model (7.3 M parameters, 29 MB of fp32 gradients) 24-33 ms a step on an Intel Xeon of 2 cores, where a bf16 step of
two processes takes about 250 ms, and gloo's threads take that time from the cores the processes compute on. Processes
on one machine can instead map the same memory: each copies its gradients in, sums its share of every process's
copies, and reads the whole sum back, 9-11 ms for the same gradients (docs/SPEED.md). The result is gloo's bit for bit
with two processes (each sums a / 2 + b / 2 in rank order); with more, every process gets the same sum, added in rank
order.

It runs where the processes can prove they share memory: CPU processes over gloo on x86-64 Linux (whose memory
ordering lets a flag written after the data publish the data), every one of which finds, in a file that the first
created in /dev/shm, the random bytes the first wrote there. Anywhere else gloo averages as before, and the log and
the results say which one runs.
"""

import mmap
import os
import platform
import secrets
import tempfile
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn

SHARED_MEMORY = "/dev/shm"
# The buffer's data area, whatever the number of processes: two sets of one slot per process, each slot a piece of a
# gradient bucket. 16 MiB fits a container's default /dev/shm of 64 MiB four times over; with two processes a piece is
# 4 MiB, which summed 7.3 M floats fastest of 1, 4 and 16 MiB (9.1 ms against 10.8 and 10.1).
DATA_BYTES = 16 << 20
LINE = 64  # one cache line per process's flag, so that flags written by different cores never share a line
NONCE = 16
# A barrier spins for this many looks (about 0.2 ms), then sleeps this long between looks. Spinning for a thousand
# looks (about 5 ms) made two processes 3-7% slower than gloo when a third job shared the 2 cores (docs/SPEED.md).
SPIN_LOOKS = 50
SLEEP = 0.0001
# How long a process waits for the others at one step of the reduction before it says they are gone: gloo's own
# default for a collective.
TIMEOUT = timedelta(minutes=30)


class SharedMemoryAllReduce:
    """Averages DDP's gradient buckets through `buffer`, a uint8 tensor every process has mapped from the same file:
    `all_reduce` is the communication hook (`model.register_comm_hook(None, this.all_reduce)`).

    Layout of `buffer`: a flag per process (an int64 at the start of its own cache line: how many barriers it has
    reached), a line holding the 16 random bytes that proved the mapping shared, then the data area. Each bucket goes
    through in pieces of at most `piece_bytes`; a piece takes two barriers (all copied in; all shares summed) and
    alternates between the area's two sets, so that a process copying in the next piece never overwrites one still
    being read.
    """

    def __init__(self, buffer: torch.Tensor, rank: int, world_size: int, timeout: timedelta = TIMEOUT):
        self.rank, self.world_size, self.timeout = rank, world_size, timeout.total_seconds()
        self.flags = buffer[: world_size * LINE].view(torch.int64)[:: LINE // 8]  # (world_size,)
        self.data = buffer[header_bytes(world_size) :]
        self.piece_bytes = (self.data.numel() // (2 * world_size)) // LINE * LINE
        self.barriers = 0
        self.set = 0

    def all_reduce(self, state, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        gradients = bucket.buffer()  # (n,) the bucket's gradients, flat
        per_piece = self.piece_bytes // gradients.element_size()
        for start in range(0, gradients.numel(), per_piece):
            self._reduce(gradients[start : start + per_piece])
        done = torch.futures.Future()
        done.set_result(gradients)
        return done

    def _reduce(self, piece: torch.Tensor):
        """Replaces `piece` (m,) by the mean of every process's `piece`."""
        m = piece.numel()
        area = self.data[self.set * self.world_size * self.piece_bytes :][: self.world_size * self.piece_bytes]
        slots = area.view(piece.dtype).view(self.world_size, -1)[:, :m]  # (world_size, m): one row per process
        # Each divides its own before the sum, as DDP's own hook does; here on the way in, not in a pass of its own.
        torch.div(piece, self.world_size, out=slots[self.rank])
        self._barrier()
        share = slice(self.rank * m // self.world_size, (self.rank + 1) * m // self.world_size)
        total = slots[0, share]
        for other in range(1, self.world_size):
            total.add_(slots[other, share])
        self._barrier()
        piece.copy_(slots[0])
        self.set ^= 1

    def _barrier(self):
        """Returns once every process has reached as many barriers as this one. Spins (yielding the core) for the
        first SPIN_LOOKS looks, then sleeps between looks, so that a wait on a shared core leaves it to the others."""
        self.barriers += 1
        self.flags[self.rank] = self.barriers
        looks, since = 0, None
        while int(self.flags.min()) < self.barriers:
            looks += 1
            if looks < SPIN_LOOKS:
                os.sched_yield()
                continue
            since = since or time.monotonic()
            if time.monotonic() - since > self.timeout:
                late = [str(r) for r, flag in enumerate(self.flags.tolist()) if flag < self.barriers]
                raise RuntimeError(
                    f"Process {self.rank} waited {self.timeout:.0f} seconds for process{'es' * (len(late) > 1)} "
                    f"{', '.join(late)} at the gradient all-reduce through shared memory; it most likely died: see "
                    "its output above.")
            time.sleep(SLEEP)


def x86_linux() -> bool:
    """Where the shared-memory all-reduce runs: x86-64 stores become visible to other cores in program order, so a
    flag written after the data publishes the data; /dev/shm is Linux's."""
    return platform.system() == "Linux" and platform.machine().lower() in ("x86_64", "amd64")


def header_bytes(world_size: int) -> int:
    """The flags' lines and the random bytes' line before the data area."""
    return (world_size + 1) * LINE


def shared_memory_all_reduce(rank: int, world_size: int, folder: str = SHARED_MEMORY,
                             data_bytes: int = DATA_BYTES) -> tuple[SharedMemoryAllReduce | None, str]:
    """The hook for this process, or None and why not. Collective: every process of the default (gloo) group calls
    it. The first creates the buffer's file in `folder` (its pages allocated up front, so that a full /dev/shm says so
    here rather than killing a process with SIGBUS mid-step) and writes random bytes into it; every process maps the
    file and checks the bytes; the file is removed once all have mapped it, so nothing is left behind however the
    run ends."""
    if not x86_linux():
        return None, f"shared memory needs x86-64 Linux, this is {platform.system()} on {platform.machine()}"
    size, at = header_bytes(world_size) + data_bytes, world_size * LINE
    message = b""
    if rank == 0:  # b"\1" + the random bytes + the file's path, or b"\0" + why there is no file
        nonce = secrets.token_bytes(NONCE)
        path, why = _create(folder, size, at, nonce)
        message = b"\1" + nonce + os.fsencode(path) if path else b"\0" + why.encode()
    message = _broadcast_bytes(message, rank)
    if message[:1] == b"\0":
        return None, message[1:].decode()
    nonce, path = message[1 : 1 + NONCE], os.fsdecode(message[1 + NONCE :])
    try:
        buffer = _map(path, size)
        mapped = bytes(buffer[at : at + NONCE].tolist()) == nonce
    except (OSError, ValueError):  # no such file here, or a shorter one
        mapped = False
    everyone = torch.tensor([int(mapped)])
    dist.all_reduce(everyone, op=dist.ReduceOp.MIN)
    if rank == 0:
        os.unlink(path)
    if not everyone.item():
        return None, f"not every process could map the first one's file in {folder} (not one machine?)"
    return SharedMemoryAllReduce(buffer, rank, world_size), "shared memory"


def _create(folder: str, size: int, at: int, nonce: bytes) -> tuple[str, str]:
    """A new file of `size` bytes in `folder`, zeros (the flags start at 0) but for `nonce` at offset `at`: its path,
    or "" and why not."""
    try:
        descriptor, path = tempfile.mkstemp(prefix="sinebert-all-reduce-", dir=folder)
    except OSError as error:
        return "", f"no file could be created in {folder} ({error.strerror})"
    try:
        os.posix_fallocate(descriptor, 0, size)
        os.pwrite(descriptor, nonce, at)
    except OSError as error:
        os.unlink(path)
        return "", f"{folder} could not hold {size >> 20} MiB ({error.strerror})"
    finally:
        os.close(descriptor)
    return path, ""


def _map(path: str, size: int) -> torch.Tensor:
    """The first `size` bytes of the existing file `path`, mapped shared, as a uint8 tensor (which keeps the mapping
    alive). Not `torch.from_file`, which would create a missing file: on another machine, a stray one."""
    descriptor = os.open(path, os.O_RDWR)
    try:
        return torch.frombuffer(mmap.mmap(descriptor, size, mmap.MAP_SHARED), dtype=torch.uint8)
    finally:
        os.close(descriptor)


def _broadcast_bytes(payload: bytes, rank: int, longest: int = 4096) -> bytes:
    """`payload` of process 0, to every process (a tensor of bytes: nothing is unpickled)."""
    message = torch.zeros(longest, dtype=torch.uint8)
    if rank == 0:
        message[: len(payload)] = torch.tensor(list(payload), dtype=torch.uint8)
    length = torch.tensor([len(payload)])
    dist.broadcast(length, 0)
    dist.broadcast(message, 0)
    return bytes(message[: int(length)].tolist())


def register_gradient_all_reduce(model: nn.Module) -> str | None:
    """Gives a DDP-wrapped CPU model the shared-memory all-reduce where it can run. Returns what averages the
    gradients, for the log and the results: "shared memory", "gloo" and why not shared memory, another backend's name
    (GPUs: "nccl"), or None for a model not under DDP (one process, or FSDP's shards)."""
    if not isinstance(model, nn.parallel.DistributedDataParallel):
        return None
    if dist.get_backend() != "gloo":
        return dist.get_backend()
    hook, why = shared_memory_all_reduce(dist.get_rank(), dist.get_world_size())
    if hook is None:
        return f"gloo ({why})"
    model.register_comm_hook(None, hook.all_reduce)
    return f"shared memory ({dist.get_world_size()} processes on this machine)"
