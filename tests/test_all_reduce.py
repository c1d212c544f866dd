"""The gradient all-reduce through shared memory (sinebert/training/all_reduce.py): DDP's gradients as gloo averages
them, and gloo kept, with the reason said, wherever the processes cannot share the buffer."""

import copy
import errno
import os
import threading
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file

from sinebert import SineBertForMaskedLM
from sinebert.training.all_reduce import (SharedMemoryAllReduce, header_bytes, register_gradient_all_reduce,
                                          shared_memory_all_reduce, x86_linux)
from sinebert.training.loop import DDP_OPTIONS, setup_accelerator
from tests.conftest import load_script, tiny_config


def _start(rank: int, world_size: int, folder: str):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{folder}/store", rank=rank, world_size=world_size)


def _gradients(rank: int, world_size: int, folder: str, data_bytes: int):
    """Process `rank`: three backward passes of a small network under DDP, once with gloo's all-reduce and once with
    the shared-memory one and the Trainer's DDP options, the gradients views of the buckets (small buckets, and a data
    area smaller than a bucket so that buckets go in many pieces); saves both models' gradients, whether the second's
    are views, and what each process saw of the buffer's file."""
    _start(rank, world_size, folder)
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(30, 200), torch.nn.GELU(), torch.nn.Linear(200, 70))
    gloo = torch.nn.parallel.DistributedDataParallel(net, bucket_cap_mb=0.02)
    shared = torch.nn.parallel.DistributedDataParallel(copy.deepcopy(net), bucket_cap_mb=0.02, **DDP_OPTIONS)
    hook, why = shared_memory_all_reduce(rank, world_size, folder=f"{folder}/shm", data_bytes=data_bytes)
    shared.register_comm_hook(None, hook.all_reduce)
    dist.barrier()  # the first process removes the file once all have mapped it, maybe after the others return
    left = os.listdir(f"{folder}/shm")
    for step in range(3):
        inputs = torch.randn(4, 30, generator=torch.Generator().manual_seed(10 * step + rank))
        for model in (gloo, shared):
            model.zero_grad()
            model(inputs).square().sum().backward()
    result = {f"{name}.{i}": p.grad for name, model in (("gloo", gloo), ("shared", shared))
              for i, p in enumerate(model.parameters())}
    views = all(p.grad._base is not None for p in shared.parameters())
    save_file({**result, "files_left": torch.tensor(len(left)), "views": torch.tensor(views)}, f"{folder}/rank{rank}")
    dist.destroy_process_group()


@pytest.mark.skipif(not x86_linux(), reason="the shared-memory all-reduce runs on x86-64 Linux only")
@pytest.mark.parametrize("world_size", [2, 3])
def test_shared_memory_averages_gradients_as_gloo_does_and_leaves_no_file(tmp_path, world_size):
    (tmp_path / "shm").mkdir()
    data_bytes = 2 * world_size * 4096  # pieces of 4 KiB: 1,024 floats, against buckets of about 5,000
    torch.multiprocessing.spawn(_gradients, args=(world_size, str(tmp_path), data_bytes), nprocs=world_size)
    ranks = [load_file(tmp_path / f"rank{rank}") for rank in range(world_size)]
    names = [key.removeprefix("gloo.") for key in ranks[0] if key.startswith("gloo.")]
    for rank in ranks:
        assert rank["files_left"] == 0  # removed as soon as every process had mapped it
        assert rank["views"]  # the hook averaged in place the buckets that the gradients are views of
        for name in names:
            # Every process ends with the same mean; with two it is gloo's bit for bit (a / 2 + b / 2 either way),
            # with three the same sum added in another order.
            assert torch.equal(rank[f"shared.{name}"], ranks[0][f"shared.{name}"])
            if world_size == 2:
                assert torch.equal(rank[f"shared.{name}"], rank[f"gloo.{name}"]), name
            else:
                torch.testing.assert_close(rank[f"shared.{name}"], rank[f"gloo.{name}"], rtol=1e-5, atol=1e-6)


def _fallback(rank: int, world_size: int, folder: str, fault: str):
    """Process `rank` sets up the shared-memory all-reduce with `fault` injected, then saves what it got."""
    _start(rank, world_size, folder)
    shm = f"{folder}/shm"
    if fault == "not one machine" and rank == 1:  # this process sees its own /dev/shm, as on another host
        real = os.open
        os.open = lambda path, *a: real(path.replace("/shm/", "/elsewhere/"), *a)
        os.mkdir(f"{folder}/elsewhere")
    if fault == "no folder":
        shm = f"{folder}/missing"
    if fault == "full":
        def full(*_):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        os.posix_fallocate = full
    hook, why = shared_memory_all_reduce(rank, world_size, folder=shm)
    dist.barrier()
    with open(f"{folder}/why{rank}", "w") as report:
        report.write(f"{hook is None}|{why}|{len(os.listdir(f'{folder}/shm'))}")
    dist.destroy_process_group()


@pytest.mark.skipif(not x86_linux(), reason="the shared-memory all-reduce runs on x86-64 Linux only")
@pytest.mark.parametrize("fault, reason", [
    ("not one machine", "not every process could map the first one's file in"),
    ("no folder", "no file could be created in"),
    ("full", "could not hold 16 MiB (No space left on device)"),
])
def test_every_process_keeps_gloo_and_says_why_where_the_buffer_cannot_be_shared(tmp_path, fault, reason):
    (tmp_path / "shm").mkdir()
    torch.multiprocessing.spawn(_fallback, args=(2, str(tmp_path), fault), nprocs=2)
    for rank in range(2):
        none, why, files = (tmp_path / f"why{rank}").read_text().split("|")
        assert none == "True" and reason in why, (rank, why)
        assert files == "0"  # nothing left in the folder
    if fault == "not one machine":  # nor on the other "machine"
        assert not any((tmp_path / "elsewhere").iterdir())


def test_a_process_that_never_arrives_is_named_after_the_timeout():
    buffer = torch.zeros(header_bytes(2) + 2 * 2 * 64, dtype=torch.uint8)
    hook = SharedMemoryAllReduce(buffer, rank=0, world_size=2, timeout=timedelta(seconds=0.2))
    raised = []

    def wait():
        try:
            hook._barrier()
        except RuntimeError as error:
            raised.append(str(error))

    waiting = threading.Thread(target=wait, daemon=True)
    waiting.start()
    waiting.join(timeout=30)
    assert not waiting.is_alive(), "the barrier waited past its timeout"
    assert raised and "for process 1 at the gradient all-reduce" in raised[0]


def test_a_model_not_under_ddp_has_no_all_reduce_to_report():
    assert register_gradient_all_reduce(torch.nn.Linear(2, 2)) is None


def test_the_trainer_keeps_gradients_as_views_of_ddp_buckets(tmp_path):
    args = load_script("finetune_classification").parse_args(["--train_file", "unused.tsv", "--output_dir",
                                                               str(tmp_path)])
    assert setup_accelerator(args).ddp_handler.to_kwargs() == {"gradient_as_bucket_view": True}


def _buffers_after_steps(rank: int, world_size: int, folder: str):
    """Process `rank`: three steps of a small masked-LM with token dropping by loss under DDP with the Trainer's
    options, each process on batches of its own; saves its buffers."""
    _start(rank, world_size, folder)
    torch.manual_seed(0)
    config = tiny_config(num_hidden_layers=3, sparse_prediction=True, token_dropping_layers=[1, 2],
                         token_dropping_policy="loss", position_embedding_type="rotary")
    model = torch.nn.parallel.DistributedDataParallel(SineBertForMaskedLM(config).train(), **DDP_OPTIONS)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    generator = torch.Generator().manual_seed(rank)
    for _ in range(3):
        ids = torch.randint(5, config.vocab_size, (4, 16), generator=generator)
        labels = torch.where(torch.rand(4, 16, generator=generator) < 0.3, ids, -100)
        model(input_ids=ids, labels=labels).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    save_file({name: b.contiguous() for name, b in model.module.named_buffers()}, f"{folder}/rank{rank}")
    # The loss table's all-reduces run inside the forward. Without a barrier after them, gloo's worker thread can
    # still be releasing one when the model's last reference goes, and the process group's destructor then joins that
    # thread while holding the GIL the release waits for: this file hung so in each of two runs, and in none of three
    # with the barrier. The Trainer meets the other processes again after every forward, and before it ends.
    dist.barrier()
    dist.destroy_process_group()


def test_buffers_stay_equal_across_processes_without_ddp_sending_them(tmp_path):
    # What forward_sync_buffers=False rests on: no buffer of the model drifts apart between processes that train on
    # different batches, token dropping's loss table included (it sums every process's losses itself).
    torch.multiprocessing.spawn(_buffers_after_steps, args=(2, str(tmp_path)), nprocs=2)
    first, second = load_file(tmp_path / "rank0"), load_file(tmp_path / "rank1")
    assert "token_loss.running" in first and first.keys() == second.keys()
    assert first["token_loss.running"].isfinite().sum() > 10  # the table learnt from both processes' ids
    for name in first:
        assert torch.equal(first[name], second[name]), name
