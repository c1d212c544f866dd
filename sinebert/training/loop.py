"""The training machinery every script shares: Accelerator set-up, the optimizer's schedule, the step loop with exact
resumption, evaluation, logging and checkpoints.

Randomness is a function of the position in training, never of how the run got there: data order is seeded per
epoch, masking per example (in the collators) and dropout per micro-batch, so a resumed run replays exactly what
an uninterrupted one would have done.
"""

import gc
import json
import math
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import safetensors.torch
import torch
from accelerate import Accelerator
from accelerate.utils import DataLoaderConfiguration, DistributedDataParallelKwargs, broadcast_object_list, set_seed
from torch import nn
from tqdm.auto import tqdm
from transformers import get_scheduler

from ..layout_sinebert import TokenLoss
from .all_reduce import register_gradient_all_reduce
from .checkpoint import CheckpointManager
from .errors import SharedUserError, UserError, write_staged
from .hub import check_hub
from .lock import RunLock, take_folder
from .optimizer import build_optimizer, describe_optimizer
from .reporting import MetricsLog, plot_curves, write_json
from .sharding import (
    check_cpu_fsdp_launch, fsdp_requested, full_state_dict, is_sharded, load_full_state_dict, shard_on_cpu, unsharded_copy,
)


# The key of a batch that a streaming process repeats after its shard ran out, so that it takes part in the step's
# collectives: it counts no loss terms and no tokens. It keeps its labels: a masked-LM's last layer computes only the
# labelled rows, and with none its query projection would get no gradient, a different all-reduce from the others'.
REPEATED = "repeated_batch"
# The Trainer's DDP, as DistributedDataParallel's own arguments (the benchmarks and tests build it so). Each gradient is
# a view of its all-reduce bucket, instead of a tensor the bucket is copied back into after its all-reduce; and the
# first process's buffers are not sent to the others before every forward: they are tables computed alike in every
# process (the rotary and sinusoid tables) or kept equal by an all-reduce of their own (token dropping's loss table,
# `TokenLoss.update`). Two CPU processes of the cram's bf16 step: 2.3% faster with the first, 1.4% with the second,
# which left the whole script level within the noise but spares every step a collective (docs/SPEED.md).
DDP_OPTIONS = {"gradient_as_bucket_view": True, "forward_sync_buffers": False}


@dataclass
class Task:
    """What a script plugs into the loop.

    count: number of loss terms in a micro-batch (masked tokens, labelled tokens, examples); the loss is averaged
        over all terms of an optimizer step across micro-batches and processes, so accumulation and data
        parallelism give the same update as one large batch.
    evaluate: runs on every process with the prepared model and returns metrics named `eval_*`.
    trace: the fields `--trace_data` records of a batch (default: `input_ids`, the unpadded input ids).
    reshape: given a micro-batch and the optimizer step, the batch the model sees (pretraining's mixed lengths).
    load_best_model_at_end: keep the weights of the best evaluation and end the run with them (and their metrics).
    early_stopping_patience: end the run after this many evaluations in a row without a better main metric, once
        half of it is done.
    """

    count: Callable[[dict], int]
    evaluate: Callable[[nn.Module], dict] | None = None
    main_metric: str = "eval_loss"
    greater_is_better: bool = False
    early_stopping_patience: int | None = None
    plot_metrics: tuple[str, ...] = ()
    trace: Callable[[dict], dict[str, list]] | None = None
    reshape: Callable[[dict, int], dict] | None = None
    load_best_model_at_end: bool = False


@dataclass
class TrainerState:
    """Saved with every checkpoint as JSON: where training stands."""

    step: int = 0
    tokens: int = 0
    training_seconds: float = 0.0
    best_metric: float | None = None
    best_step: int | None = None
    evaluations_without_improvement: int = 0
    history: list[dict] = field(default_factory=list)
    settings: dict = field(default_factory=dict)  # RESUME_SETTINGS as the run was started


# The arguments whose change would make a resumed run another run than the one its checkpoint began: the optimizer,
# its schedule and the batches. A rerun that resumes must give the same (a changed one is refused, not ignored).
RESUME_SETTINGS = ("optim", "learning_rate", "muon_learning_rate", "embedding_learning_rate", "layerwise_lr_decay",
                   "weight_decay", "adam_beta1", "adam_beta2", "adam_epsilon", "max_grad_norm", "lr_scheduler_type",
                   "num_warmup_steps", "warmup_ratio", "per_device_train_batch_size", "gradient_accumulation_steps",
                   "mlm_probability", "adversarial_epsilon", "seed")


def check_trackers(args):
    """With --with_tracking: one sentence if --report_to names no tracker accelerate knows, one that is not installed,
    or 'all' where none is (accelerate would warn and log nowhere); else nothing."""
    if not getattr(args, "with_tracking", False):
        return
    from accelerate.tracking import get_available_trackers
    from accelerate.utils import LoggerType

    known = [tracker.value for tracker in LoggerType if tracker != LoggerType.ALL]
    installed = [tracker.value for tracker in get_available_trackers()]
    if args.report_to == "all":
        if not installed:
            raise UserError(f"--with_tracking logs to every installed tracker, and none of {', '.join(known)} is "
                            "installed; install one (pip install tensorboard), or leave out --with_tracking "
                            "(metrics.jsonl in the output folder has every logged row either way).")
        return
    if args.report_to not in known:
        raise UserError(f"--report_to {args.report_to} is not a tracker accelerate knows; pass one of "
                        f"{', '.join(known)}, or all.")
    if args.report_to not in installed:
        raise UserError(f"--report_to {args.report_to} needs the {args.report_to} package, which is not installed: "
                        f"pip install {args.report_to}, or leave out --with_tracking.")


def setup_accelerator(args) -> Accelerator:
    """Create the Accelerator first (as every script must), seed, and claim the output folder.

    Without a GPU (or other accelerator), processes started by `accelerate launch --multi_gpu` run on the CPU and
    talk over gloo; accelerate alone would start independent single-process runs there.
    """
    check_hub(args)  # before anything is written: an upload that cannot happen must not cost the training
    check_trackers(args)
    die_with_launcher()
    cpu = not torch.accelerator.is_available()
    check_launch(cpu)
    accelerator = Accelerator(
        cpu=cpu,
        mixed_precision=args.mixed_precision,
        log_with=args.report_to if args.with_tracking else None,
        project_dir=args.output_dir,
        dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True, data_seed=args.seed),
        kwargs_handlers=[
            DistributedDataParallelKwargs(gradient_as_bucket_view=DDP_OPTIONS["gradient_as_bucket_view"])
        ],
    )
    if cpu and fsdp_requested():
        shard_on_cpu(accelerator)
    if cpu:
        local = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
        accelerator.print(cpu_processes_line(accelerator.num_processes, is_sharded(accelerator), local,
                                             torch.get_num_threads(), usable_cores()))
    if cpu and accelerator.mixed_precision == "bf16" and not cpu_has_native_bf16():
        accelerator.print("Note: this CPU has no bf16 matrix instructions (AVX512-BF16 or AMX), so bf16 runs in "
                          "software, about 30x slower than fp32 on the machine where this was measured; "
                          "--mixed_precision no is faster here.")
    set_seed(args.seed)
    claim_output_dir(args, accelerator)
    return accelerator


def usable_cores() -> int:
    """The physical cores this process may run on: hyper-threads add no matrix throughput (as accelerate counts)."""
    import psutil

    allowed = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return min(allowed, psutil.cpu_count(logical=False) or allowed)


def cpu_processes_line(processes: int, sharded: bool, local: int, threads: int, cores: int) -> str:
    """What runs on the CPU, and how to use the cores it leaves idle: accelerate gives each process one thread unless
    told otherwise, except for a single `--cpu` process (configs/accelerate/cpu.yaml)."""
    each = f"{threads} thread{'s' if threads > 1 else ''}" + (" each" if processes > 1 else "")
    if processes > 1:
        line = f"No GPU found: running {processes} processes on the CPU (gloo)"
        line += f"{', fully sharded (FSDP 2)' if sharded else ''}, {each}."
    else:
        line = f"No GPU found: running on the CPU, {each}."
    if cores // local > threads:
        line += (f" That keeps {local * threads} of this machine's {cores} cores busy; to use them all, pass "
                 f"--num_cpu_threads_per_process {cores // local} to accelerate launch (or set OMP_NUM_THREADS).")
    return line


def die_with_launcher():
    """A worker of `accelerate launch` (torch elastic) is killed as soon as its launcher dies. Elastic starts every
    worker in a session of its own, so killing the launcher's process group (a kill -9 of the job, a closed terminal)
    would leave the workers training and writing into the output folder, beside the rerun that resumes it. Linux only
    (prctl's parent-death signal); elsewhere nothing changes."""
    if "TORCHELASTIC_RUN_ID" not in os.environ or not sys.platform.startswith("linux"):
        return
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    PR_SET_PDEATHSIG = 1
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() == 1:  # the launcher died before the signal was armed
        os.kill(os.getpid(), signal.SIGKILL)


# configs/accelerate/multi_node.yaml's main_process_ip until a user fills it in (an address could be a real one).
ADDRESS_PLACEHOLDER = "FIRST_MACHINE_ADDRESS"


def check_launch(cpu: bool):
    """One sentence, in every process alike, where the launch config cannot run as written here: FSDP on CPUs that
    cannot shard (`sharding.check_cpu_fsdp_launch`) or multi_node.yaml's placeholder address (the processes would
    wait for it for 15 minutes)."""
    if cpu and fsdp_requested():
        check_cpu_fsdp_launch()
    if os.environ.get("MASTER_ADDR") == ADDRESS_PLACEHOLDER:
        raise SharedUserError(
            f"The launch config's main_process_ip is still {ADDRESS_PLACEHOLDER}: set it to the first machine's "
            "address (reachable from the others on main_process_port), and machine_rank to each machine's number "
            "(--machine_rank on the command line)."
        )


def cpu_fields() -> dict[str, str]:
    """The first CPU's fields in /proc/cpuinfo (`vendor_id`, `model name`, `flags`, ...); Linux only, else none."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    fields = dict(line.split(":", 1) for line in info.splitlines()[:40] if ":" in line)
    return {key.strip(): value.strip() for key, value in fields.items()}


def _cpu_flags() -> tuple[str, set[str]]:
    """The CPU's vendor and instruction-set flags (`cpu_fields`)."""
    fields = cpu_fields()
    return fields.get("vendor_id", ""), set(fields.get("flags", "").split())


def cpu_has_native_bf16() -> bool:
    """Whether this CPU multiplies bf16 matrices in hardware (AVX512-BF16 or AMX); Linux only, else False."""
    return bool(_cpu_flags()[1] & {"avx512_bf16", "amx_bf16"})


def cpu_bf16_is_fast() -> tuple[bool, str]:
    """Whether bf16 autocast trains faster than float32 on this CPU, decided by what the CPU is (never by a timing,
    which a busy machine would flip), and why. Measured under bf16 autocast (`python benchmarks/speed.py`): an AMD
    EPYC with AVX512-BF16 multiplies 4.2 times as fast as in float32 and ran the cram's pretraining step 2.9 times
    as fast; an Intel Xeon with AVX512-BF16 but no AMX at half float32's pace; without bf16 instructions at a
    twentieth. AMX tiles (Intel Sapphire Rapids and later) are bf16's own matrix units."""
    vendor, flags = _cpu_flags()
    if "amx_bf16" in flags:
        return True, "this CPU has AMX bf16 matrix units"
    if "avx512_bf16" in flags and vendor == "AuthenticAMD":
        return True, "this AMD CPU has AVX512-BF16 (bf16 matrix products 4.2x float32's where measured)"
    if "avx512_bf16" in flags:
        return False, "AVX512-BF16 without AMX ran bf16 at half float32's pace where measured"
    return False, "this CPU has no bf16 matrix instructions"


def bf16_matmuls_are_fast(device: torch.device) -> tuple[bool, str]:
    """Whether `device` multiplies bf16 matrices at speed (a CPU by `cpu_bf16_is_fast`, a GPU with native bf16:
    Ampere on), and why."""
    if device.type == "cuda":
        native = torch.cuda.is_bf16_supported(including_emulation=False)
        return native, "this GPU " + ("multiplies bf16 natively" if native else "has no native bf16")
    if device.type == "cpu":
        return cpu_bf16_is_fast()
    return False, f"bf16 matrix speed on {device.type} is not known here"


def muon_iteration_dtype(device: torch.device) -> tuple[torch.dtype, str]:
    """The dtype of Muon's Newton-Schulz iterations on `device`: bf16 where it multiplies bf16 at speed
    (`bf16_matmuls_are_fast`), else float32; and why."""
    fast, why = bf16_matmuls_are_fast(device)
    return torch.bfloat16 if fast else torch.float32, why


def claim_output_dir(args, accelerator: Accelerator):
    """Take the output folder for this job: one job per folder (RunLock), and never over a different run unless
    --overwrite_output_dir; resuming continues the run there. The main process decides; every process learns its
    decision (and waits for the folder) and raises the same sentence."""
    problem = [_claim(args, Path(args.output_dir)) if accelerator.is_main_process else None]
    broadcast_object_list(problem)
    if problem[0]:
        raise SharedUserError(problem[0])


def _claim(args, output: Path) -> str | None:
    """On the main process: the sentence that refuses `output`, or None once it is this job's."""
    occupied = output.is_dir() and any(path.name != RunLock.NAME for path in output.iterdir())
    if occupied and not args.resume_from_checkpoint and not args.overwrite_output_dir:
        return (f"--output_dir {output} already holds files from another run; pass --overwrite_output_dir to replace "
                "it, --resume_from_checkpoint latest to continue it, or choose another folder.")
    refused = take_folder(output)
    if refused:
        return refused
    if occupied and not args.resume_from_checkpoint:  # --overwrite_output_dir, now that the folder is this job's
        for stale in ("checkpoints", "metrics.jsonl"):
            path = output / stale
            shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
    return None


def memory_bytes(device: torch.device) -> int:
    """All the memory of `device`: the GPU's, or this machine's RAM (a property of the machine, not of the moment)."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _size(count: int) -> str:
    return f"{count / 2**30:,.1f} GiB" if count >= 2**30 else f"{count / 2**20:,.0f} MiB"


def check_step_memory(config, rows: int, length: int, what: str, device: torch.device):
    """UserError before training when one step's activations cannot fit `device` at all, instead of a run that grows
    until the kernel's OOM killer ends it (and perhaps something else). A lower bound for `rows` sequences of
    `length` tokens: autograd keeps, per token and layer, at least the layer's input, its attention output and
    residual sums and the feed-forward activations, 4 x hidden + intermediate values, counted at 2 bytes (bf16) even
    in float32. Under "eager" each full-attention layer also keeps its (heads, length, length) weights; the other
    kernels' attention memory grows with the length only and is left out."""
    tokens = rows * length
    needed = tokens * config.num_hidden_layers * (4 * config.hidden_size + config.intermediate_size) * 2
    if (config._attn_implementation or "eager") == "eager":
        full_layers = config.layer_types.count("full_attention")
        needed += rows * config.num_attention_heads * length**2 * full_layers * 2
    available = memory_bytes(device)
    if needed > available:
        raise SharedUserError(
            f"{what} puts {tokens:,} tokens in each step, whose activations need at least {_size(needed)}, more than "
            f"the {_size(available)} this {'GPU' if device.type == 'cuda' else 'machine'} has; "
            "use a shorter length or a smaller batch (--gradient_accumulation_steps keeps the tokens per update)."
        )


def training_steps(args, batches_per_epoch: int | None) -> int:
    """Optimizer steps of the run: --max_train_steps (0: only evaluate and save the starting model), or epochs x
    batches per epoch / accumulation."""
    if args.max_train_steps is not None:
        return args.max_train_steps
    if batches_per_epoch is None:
        raise UserError("--streaming data has no length: pass --max_train_steps to say how long to train.")
    epochs = args.default_train_epochs if args.num_train_epochs is None else args.num_train_epochs
    return max(1, math.ceil(epochs * batches_per_epoch / args.gradient_accumulation_steps))


def _step_seed(seed: int, step: int, micro: int, rank: int) -> int:
    return (seed * 1_000_003 + step * 1009 + micro * 101 + rank) % (2**63 - 1)


class Trainer:
    """Runs the optimizer steps of one script, with evaluation, logging, checkpoints and exact resumption.

    `train_dataloader` is either a map-style DataLoader (sharded by accelerate) or, for streaming, an iterable
    already split by process (`streaming=True`), whose processes may run out of data at different times.
    """

    def __init__(self, args, accelerator: Accelerator, model: nn.Module, train_dataloader, task: Task,
                 streaming: bool = False, evaluate_first: bool = False):
        self.args, self.accelerator, self.task, self.streaming = args, accelerator, task, streaming
        if args.adversarial_epsilon < 0:
            raise UserError(f"--adversarial_epsilon {args.adversarial_epsilon} is negative: it is the length of a step "
                            "up the loss gradient; pass a positive value (0.25 in the SST-2 recipe), or 0 to disable.")
        if args.adversarial_epsilon and is_sharded(accelerator):
            raise SharedUserError(
                f"--adversarial_epsilon {args.adversarial_epsilon} moves the whole word-embedding matrix along its "
                "gradient, which FSDP splits across processes; launch with a data-parallel config "
                "(configs/accelerate/cpu_2proc.yaml or multi_gpu.yaml) or pass --adversarial_epsilon 0."
            )
        self.evaluate_first = evaluate_first
        if not streaming:  # sharded first: an epoch is this process's share of the batches
            train_dataloader = accelerator.prepare(train_dataloader)
        batches_per_epoch = None if streaming else len(train_dataloader)
        # A time budget without a length in steps or epochs trains until it is spent, the schedule laid over time.
        by_time = args.max_train_minutes and args.max_train_steps is None and args.num_train_epochs is None
        self.time_budget = args.max_train_minutes * 60 if by_time else None
        self.total_steps = sys.maxsize if self.time_budget else training_steps(args, batches_per_epoch)
        if args.gradient_checkpointing:
            model.activation_checkpointing_enable()
        # Which kernel runs each layer is said up front and kept in the results: nothing falls back silently.
        self.attention_kernels = None
        if hasattr(model, "attention_kernels"):  # for the dtype the layers will compute in, under autocast or not
            with accelerator.autocast():
                self.attention_kernels = model.attention_kernels()
        if self.attention_kernels:
            accelerator.print("attention: " + "; ".join(self.attention_kernels))
        # Data-parallel processes hold every parameter whole and can split Muon's work; FSDP's hold shards.
        replicas = 1 if is_sharded(accelerator) else accelerator.num_processes
        iteration_dtype, why = muon_iteration_dtype(accelerator.device)
        optimizer = build_optimizer(model, args, rank=accelerator.process_index, world_size=replicas,
                                    iteration_dtype=iteration_dtype)
        self.optimizer_description = describe_optimizer(optimizer, why)
        accelerator.print(f"optimizer: {self.optimizer_description}")
        self.state = TrainerState(settings={k: getattr(args, k) for k in RESUME_SETTINGS if hasattr(args, k)})
        scheduler = self._build_scheduler(optimizer)
        self.model, self.optimizer, self.scheduler = accelerator.prepare(model, optimizer, scheduler)
        # Under mixed precision accelerate wraps the model's forward in autocast and then copies every half-precision
        # output to fp32. Every forward here runs under accelerator.autocast() already and each head computes its
        # loss in fp32, so the copy (pretraining's logits: masked rows x vocabulary, each step) was pure cost, a fifth
        # of a bf16 step on 2 CPU cores (benchmarks/pretrain_throughput.py). Unwrapping so removes both wrappers.
        accelerator.unwrap_model(self.model, keep_fp32_wrapper=False)
        if isinstance(self.model, nn.parallel.DistributedDataParallel):  # (accelerate's DDP arguments lack this one)
            self.model.forward_sync_buffers = DDP_OPTIONS["forward_sync_buffers"]
        # CPU processes on one machine average their gradients through shared memory, not gloo's sockets.
        self.gradient_all_reduce = register_gradient_all_reduce(self.model)
        if self.gradient_all_reduce:
            accelerator.print(f"gradient all-reduce: {self.gradient_all_reduce}")
        self.train_dataloader = train_dataloader
        # Running statistics of the data the model keeps (token dropping's loss table), paused for a second look.
        self.running_statistics = [module for module in model.modules() if isinstance(module, TokenLoss)]
        if args.torch_compile:
            self.model = torch.compile(self.model)
        self.checkpoints = CheckpointManager(accelerator, args.output_dir, args.checkpoints_total_limit)
        self.output_dir = Path(args.output_dir)

    def _build_scheduler(self, optimizer):
        """Warmup then decay over the run's steps, or over its time budget (progress = training time / budget)."""
        args, processes = self.args, self.accelerator.num_processes
        if self.time_budget is None:
            warmup = args.num_warmup_steps if args.num_warmup_steps is not None else int(args.warmup_ratio * self.total_steps)
            # accelerate steps a prepared scheduler once per process per optimizer step, hence the factor.
            return get_scheduler(args.lr_scheduler_type, optimizer, num_warmup_steps=warmup * processes,
                                 num_training_steps=self.total_steps * processes)
        if args.num_warmup_steps is not None:
            raise UserError("With --max_train_minutes and no --max_train_steps or --num_train_epochs the warmup is a "
                            "share of the time: use --warmup_ratio instead of --num_warmup_steps.")
        # The same shape as the step schedule, read at the fraction of the budget spent (1000 points).
        shape = get_scheduler(args.lr_scheduler_type, torch.optim.SGD([torch.zeros(1)], lr=1.0),
                              num_warmup_steps=int(args.warmup_ratio * 1000), num_training_steps=1000).lr_lambdas[0]

        def by_time(_):
            return shape(min(1000, int(1000 * self.state.training_seconds / self.time_budget)))

        return torch.optim.lr_scheduler.LambdaLR(optimizer, by_time)

    # ----- the run -----

    def fit(self) -> dict:
        """Train to the last step (or the time budget, or early stopping); returns the final metrics."""
        args, accelerator = self.args, self.accelerator
        if args.resume_from_checkpoint:
            self._resume(args.resume_from_checkpoint)
        log = MetricsLog(self.output_dir / "metrics.jsonl", accelerator.is_main_process, self.state.step)
        if args.with_tracking:
            accelerator.init_trackers(self.output_dir.name, {k: v for k, v in vars(args).items() if _scalar(v)})
        progress = tqdm(
            total=None if self.time_budget else self.total_steps, initial=self.state.step, desc="training",
            disable=not accelerator.is_local_main_process, dynamic_ncols=True,
        )
        try:  # closing the bar ends its line, so an error sentence starts a line of its own
            stop_reason = self._train(log, progress)
        finally:
            progress.close()
        if stop_reason:
            planned = "" if self.time_budget else f" of {self.total_steps}"
            accelerator.print(f"Stopped after step {self.state.step}{planned}: {stop_reason}.")
        if not self.state.history or self.state.history[-1]["step"] != self.state.step:
            self._evaluate(log)
        if args.checkpointing_steps and self.checkpoints.path_for(self.state.step) not in self.checkpoints.complete():
            self.save_checkpoint()
        if self.task.load_best_model_at_end:
            self._restore_best()
        if args.with_tracking:
            accelerator.end_training()
        return self.summary(stop_reason)

    def _train(self, log: MetricsLog, progress: tqdm) -> str | None:
        """The optimizer steps, with logging, evaluation and checkpoints; returns why it stopped early, if it did."""
        args, accelerator = self.args, self.accelerator
        if self.evaluate_first and self.state.step == 0:
            self._evaluate(log)  # the starting point of the validation curve
        batches = self._micro_batches()
        window_loss, window_steps, window_tokens, window_start = 0.0, 0, 0, time.perf_counter()
        stop_reason = None
        self.model.train()
        while self.state.step < self.total_steps and stop_reason is None:
            step_start = time.perf_counter()
            micro_batches = [next(batches) for _ in range(args.gradient_accumulation_steps)]
            loss, tokens, stop, grad_norm = self._optimizer_step(micro_batches, step_start)
            self.state.step += 1
            self.state.tokens += tokens
            window_loss, window_steps, window_tokens = window_loss + loss, window_steps + 1, window_tokens + tokens
            progress.update(1)
            if self.state.step % args.logging_steps == 0 or self.state.step == self.total_steps:
                seconds = time.perf_counter() - window_start
                row = dict(
                    step=self.state.step, loss=window_loss / window_steps, learning_rate=self.scheduler.get_last_lr()[0],
                    tokens_per_second=window_tokens / max(seconds, 1e-9), tokens=self.state.tokens,
                )
                if grad_norm is not None:  # the last step's, before clipping, as Hugging Face's Trainer logs it
                    row["grad_norm"] = grad_norm.item()
                log.write(**row)
                if args.with_tracking:
                    accelerator.log(row, step=self.state.step)
                progress.set_postfix(loss=f"{row['loss']:.4f}", **self._time_left())
                window_loss, window_steps, window_tokens, window_start = 0.0, 0, 0, time.perf_counter()
            if stop:
                stop_reason = "time budget"
            elif self._evaluation_due():
                if self._evaluate(log):
                    stop_reason = "early stopping"
            if self._checkpoint_due():
                self.save_checkpoint()
        return stop_reason

    def summary(self, stop_reason: str | None) -> dict:
        final = self.state.history[-1] if self.state.history else {}
        if self.task.load_best_model_at_end and self.state.best_step is not None:
            final = next(row for row in self.state.history if row["step"] == self.state.best_step)
        return {
            **{k: v for k, v in final.items() if k != "step"},
            **({"best_step": self.state.best_step} if self.task.load_best_model_at_end else {}),
            "train_steps": self.state.step,
            "train_tokens": self.state.tokens,
            "train_seconds": round(self.state.training_seconds, 2),
            "train_tokens_per_second": self.state.tokens / max(self.state.training_seconds, 1e-9),
            "stopped_early": stop_reason,
            "attention_kernels": self.attention_kernels,
            "optimizer": self.optimizer_description,
            "gradient_all_reduce": self.gradient_all_reduce,
        }

    def _time_left(self) -> dict:
        """For the progress bar of a time-budgeted run (which has no step total): the training minutes left."""
        if not self.time_budget:
            return {}
        left = (self.time_budget - self.state.training_seconds) / 60
        return {"minutes_left": f"{max(left, 0.0):.1f}"}

    # ----- one optimizer step -----

    def _optimizer_step(self, micro_batches: list[dict],
                        step_start: float) -> tuple[float, int, bool, torch.Tensor | None]:
        """Forward/backward every micro-batch, then clip and step. Returns (mean loss, tokens, stop flag, gradient norm
        before clipping: None without --max_grad_norm or when the step was skipped)."""
        accelerator, model = self.accelerator, self.model
        repeated = [bool(batch.pop(REPEATED, False)) for batch in micro_batches]
        counts = [0 if again else self.task.count(batch) for batch, again in zip(micro_batches, repeated)]
        total = accelerator.reduce(torch.tensor(float(sum(counts)), device=accelerator.device), "sum").item()
        # The loss of each micro-batch is its sum over loss terms divided by the step's total; DDP averages
        # gradients over processes, hence the factor num_processes.
        scale = accelerator.num_processes / max(total, 1.0)
        loss_sum, tokens = 0.0, 0
        for micro, (batch, count, again) in enumerate(zip(micro_batches, counts, repeated)):
            torch.manual_seed(_step_seed(self.args.seed, self.state.step, micro, accelerator.process_index))
            last = micro == len(micro_batches) - 1
            if self.task.reshape:
                batch = self.task.reshape(batch, self.state.step)
            with nullcontext() if last else accelerator.no_sync(model), accelerator.autocast(), \
                    self._statistics_paused(again):
                loss = self._loss(model(**batch), count)
            accelerator.backward(loss * scale)
            if self.args.adversarial_epsilon:
                # DDP decides at the forward whether a backward all-reduces: on the last micro-batch both do, so the
                # embeddings move along the processes' mean gradient.
                with nullcontext() if last else accelerator.no_sync(model), accelerator.autocast(), \
                        self._statistics_paused(True):
                    self._adversarial_backward(batch, count, scale)
            loss_sum += loss.detach().float().item()
            if not again:
                mask = batch.get("attention_mask")
                tokens += int(mask.sum()) if mask is not None else batch["input_ids"].numel()
        self.state.training_seconds += time.perf_counter() - step_start
        over_time = (
            self.args.max_train_minutes is not None
            and self.state.training_seconds >= self.args.max_train_minutes * 60
            and accelerator.is_main_process
        )
        # One small all-reduce carries the loss, the NaN and time-out flags, the token count, and the main process's
        # clock (which the time-based schedule reads, so every process sees the same learning rate).
        clock = self.state.training_seconds if accelerator.is_main_process else 0.0
        flags = torch.tensor(
            [loss_sum, float(not math.isfinite(loss_sum)), float(over_time), float(tokens), clock],
            dtype=torch.float64, device=accelerator.device,
        )
        loss_sum, nonfinite, stop, tokens, clock = accelerator.reduce(flags, "sum").tolist()
        self.state.training_seconds = clock
        grad_norm = None
        if nonfinite:
            self._handle_nonfinite()
        else:
            if self.args.max_grad_norm:
                grad_norm = accelerator.clip_grad_norm_(model.parameters(), self.args.max_grad_norm)
            self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return (loss_sum / max(total, 1.0) if not nonfinite else float("nan")), int(tokens), bool(stop), grad_norm

    def _adversarial_backward(self, batch: dict, count: int, scale: float):
        """FGM (Miyato et al., 2017): the loss again with the word embeddings moved by --adversarial_epsilon along
        their gradient (normalised over the whole matrix), its gradient added to the clean one."""
        words = self.accelerator.unwrap_model(self.model).get_input_embeddings().weight
        # Every process runs this backward (DDP's all-reduce waits for all), with a zero step where it has none.
        gradient = words.grad if words.grad is not None else torch.zeros_like(words)
        clean = words.detach().clone()
        words.data.add_(gradient * (self.args.adversarial_epsilon / gradient.norm().clamp_min(1e-12)))
        self.accelerator.backward(self._loss(self.model(**batch), count) * scale)
        words.data.copy_(clean)  # exactly the clean weights again (w + d - d need not round back to w)

    def _statistics_paused(self, paused: bool) -> ExitStack:
        """Pauses the model's running statistics (token dropping's loss table) for a forward that sees data a second
        time: a repeated batch, or the adversarial pass over a perturbed one."""
        stack = ExitStack()
        for table in self.running_statistics if paused else ():
            stack.enter_context(table.paused())
        return stack

    @staticmethod
    def _loss(outputs, count: int) -> torch.Tensor:
        """The micro-batch's summed loss; a process with no real data this step still takes part, with zero."""
        return outputs.loss.float() * count if count else outputs.logits.float().sum() * 0.0

    def _handle_nonfinite(self):
        last = self.checkpoints.complete()
        kept = f"the last good checkpoint is {last[-1]}" if last else "no checkpoint was written yet"
        if self.args.nonfinite_loss == "skip":
            self.accelerator.print(f"Step {self.state.step + 1}: the loss is NaN/Inf; skipping this update.")
            return
        raise UserError(
            f"The training loss became NaN/Inf at step {self.state.step + 1}; {kept}. Lower --learning_rate, use "
            "--mixed_precision bf16 instead of fp16, or pass --nonfinite_loss skip to drop such batches."
        )

    # ----- data -----

    def _micro_batches(self) -> Iterator[dict]:
        """Micro-batches forever, epoch after epoch, starting where the restored state left off."""
        skip = self.state.step * self.args.gradient_accumulation_steps
        epoch = 0
        if not self.streaming:
            per_epoch = len(self.train_dataloader)
            epoch, skip = divmod(skip, per_epoch)
        trace = self._trace_file()
        while True:
            self._set_epoch(epoch)
            batches = self._epoch_batches(skip)
            skip = 0
            for batch in batches:
                if trace is not None:
                    trace.write(self._trace_row(epoch, batch))
                yield batch
            epoch += 1

    def _set_epoch(self, epoch: int):
        for target in (self.train_dataloader, getattr(self.train_dataloader, "collate_fn", None)):
            if hasattr(target, "set_epoch"):
                target.set_epoch(epoch)

    def _epoch_batches(self, skip: int) -> Iterator[dict]:
        if not self.streaming:
            loader = self.accelerator.skip_first_batches(self.train_dataloader, skip) if skip else self.train_dataloader
            yield from loader
            return
        # Streaming: each process reads its own shard; the epoch ends when every process has run out, and a
        # process that runs out first repeats its last batch, which counts no loss terms (REPEATED).
        iterator, last, seen = iter(self.train_dataloader), None, 0
        while True:
            batch = next(iterator, None)
            have = torch.tensor(float(batch is not None), device=self.accelerator.device)
            if self.accelerator.reduce(have, "sum").item() == 0:
                return
            if batch is None:
                if last is None:
                    raise UserError(
                        f"Process {self.accelerator.process_index} got no streaming data at all: the data has fewer "
                        "shards or lines than there are processes; use more data or fewer processes."
                    )
                batch = {**last, REPEATED: True}
            else:
                last = batch = {k: v.to(self.accelerator.device) for k, v in batch.items()}
            seen += 1
            if seen > skip:
                yield batch

    def _trace_row(self, epoch: int, batch: dict) -> str:
        fields = self.task.trace(batch) if self.task.trace else {"input_ids": unpadded_ids(batch, batch["input_ids"])}
        real = not batch.get(REPEATED)
        return json.dumps({"step": self.state.step, "epoch": epoch, "real": real, **fields}) + "\n"

    def _trace_file(self):
        if not self.args.trace_data:
            return None
        path = self.output_dir / f"data_trace_rank{self.accelerator.process_index}.jsonl"
        return open(path, "a", buffering=1)

    # ----- evaluation and checkpoints -----

    def _evaluation_due(self) -> bool:
        steps = self.args.eval_steps
        epoch_end = not self.streaming and self._at_epoch_end()
        return bool(self.task.evaluate) and ((steps and self.state.step % steps == 0) or epoch_end)

    def _at_epoch_end(self) -> bool:
        micro = self.state.step * self.args.gradient_accumulation_steps
        per_epoch = len(self.train_dataloader)
        return micro // per_epoch > (micro - self.args.gradient_accumulation_steps) // per_epoch

    def _checkpoint_due(self) -> bool:
        every = self.args.checkpointing_steps
        if every == "epoch":
            return not self.streaming and self._at_epoch_end()
        return bool(every) and self.state.step % every == 0

    def _evaluate(self, log: MetricsLog) -> bool:
        """Evaluate, log, track the best main metric; True when early stopping should end the run."""
        if not self.task.evaluate:
            return False
        metrics = self._run_evaluation()
        self.state.history.append({"step": self.state.step, **metrics})
        log.write(step=self.state.step, **metrics)
        if self.args.with_tracking:
            self.accelerator.log(metrics, step=self.state.step)
        shown = ", ".join(f"{k}={v:.4f}" for k, v in metrics.items() if isinstance(v, float))
        self.accelerator.print(f"step {self.state.step}: {shown}")
        value = metrics.get(self.task.main_metric)
        if value is None:
            return False
        best = self.state.best_metric
        better = best is None or (value > best if self.task.greater_is_better else value < best)
        if better:
            self.state.best_metric, self.state.evaluations_without_improvement = value, 0
            self.state.best_step = self.state.step
            if self.task.load_best_model_at_end:
                self._save_best()
            return False
        self.state.evaluations_without_improvement += 1
        patience = self.task.early_stopping_patience
        return patience is not None and self.state.evaluations_without_improvement >= patience and self._half_done()

    def _half_done(self) -> bool:
        """Early stopping waits for the second half of the run: in the first, a metric that has not moved is more
        often a model still on its plateau (held-out accuracy at the majority class for a hundred steps) than one
        that has converged."""
        if self.time_budget:
            return 2 * self.state.training_seconds >= self.time_budget
        return 2 * self.state.step >= self.total_steps

    def _run_evaluation(self) -> dict:
        """The task's evaluation in eval mode without gradients, then back to training mode."""
        self.model.eval()
        with torch.no_grad():
            metrics = self.task.evaluate(self.model)
        self.model.train()
        return metrics

    @property
    def best_weights(self) -> Path:
        return self.output_dir / "best_model.safetensors"

    def _save_best(self):
        """The weights of the best evaluation so far, replaced atomically (a crash leaves the previous best)."""
        sharded = is_sharded(self.accelerator)
        state = full_state_dict(self.accelerator, self.model) if sharded else None  # every process gathers
        if self.accelerator.is_main_process:
            partial = self.best_weights.with_suffix(".partial")
            if sharded:  # copies: safetensors writes no two names of one tensor, as tied weights are
                safetensors.torch.save_file({name: tensor.clone() for name, tensor in state.items()}, str(partial))
            else:
                safetensors.torch.save_model(self.unwrapped_model(), str(partial))
            os.replace(partial, self.best_weights)

    def _restore_best(self):
        """Give every process the best evaluation's weights (read by the main process, which wrote them) and
        evaluate once more, so that the predictions the script writes are the best model's."""
        self.accelerator.wait_for_everyone()
        if self.state.best_step is None:
            return
        model = self.unwrapped_model()
        if is_sharded(self.accelerator):
            main = self.accelerator.is_main_process
            load_full_state_dict(self.accelerator, model, safetensors.torch.load_file(self.best_weights) if main else {})
        else:
            if self.accelerator.is_main_process:
                safetensors.torch.load_model(model, str(self.best_weights))
            if self.accelerator.num_processes > 1:
                for tensor in model.state_dict().values():
                    torch.distributed.broadcast(tensor, src=0)
        self._run_evaluation()
        self.accelerator.print(f"Kept the weights of step {self.state.best_step}, the best {self.task.main_metric}.")

    def save_checkpoint(self):
        self.checkpoints.save(self.state.step, vars(self.state))

    def _resume(self, requested: str):
        path = self.checkpoints.resolve(requested, fallback=self.args.resume_fallback)
        restored = self.checkpoints.load(path)
        changed = {k: (v, self.state.settings[k]) for k, v in restored.get("settings", {}).items()
                   if k in self.state.settings and v != self.state.settings[k]}
        if changed:
            flags = ", ".join(f"--{k} {now} (the checkpoint's run: {then})" for k, (then, now) in changed.items())
            raise SharedUserError(
                f"Resuming {path} with other settings than its run was started with: {flags}. Resume with the run's "
                "own values (its args.json), or start a new run in another --output_dir to train with these."
            )
        self.state = TrainerState(**restored)
        self.accelerator.print(f"Resumed from {path} at step {self.state.step}.")

    # ----- the end -----

    def unwrapped_model(self) -> nn.Module:
        return self.accelerator.unwrap_model(self.model)

    def plot(self, title: str) -> Path | None:
        if not self.accelerator.is_main_process:
            return None
        return plot_curves(
            self.output_dir / "metrics.jsonl", self.output_dir / "training_curves.png", title, self.task.plot_metrics
        )


def save_final(accelerator: Accelerator, model: nn.Module, tokenizer, output_dir: str | Path, results: dict,
               prepare: Callable[[nn.Module], None] | None = None):
    """`save_pretrained` of the unwrapped model (safetensors) with its tokenizer and `all_results.json`; `prepare`
    changes the whole model in place before (under FSDP, the main process's gathered copy).

    Everything is written to a staging folder first and then moved in file by file with atomic renames, so a
    crash never leaves a half-written model file in `output_dir`.
    """
    accelerator.wait_for_everyone()
    if is_sharded(accelerator):  # every process holds a shard: they are gathered into the main process's copy
        state = full_state_dict(accelerator, model)
        model = unsharded_copy(model, state) if accelerator.is_main_process else model
    if accelerator.is_main_process:
        if prepare is not None:
            prepare(model)
        output = Path(output_dir)

        def write(staging: Path):
            model.save_pretrained(staging, safe_serialization=True)
            tokenizer.save_pretrained(staging)
            write_json(staging / "all_results.json", results)

        reason = write_staged(output, "final", write)
        if reason:
            raise UserError(
                f"Could not save the final model into {output} because {reason}; the checkpoints in "
                f"{output / 'checkpoints'} are intact. Free space, then rerun the same command with "
                "--resume_from_checkpoint latest: it saves the model again."
            )
    accelerator.wait_for_everyone()


def shutdown(accelerator: Accelerator, *objects):
    """Tear down so that multi-process CPU runs exit cleanly (an abort at exit was seen otherwise)."""
    del objects
    accelerator.free_memory()
    gc.collect()
    accelerator.wait_for_everyone()
    accelerator.end_training()
    RunLock.release()
    if os.environ.get("WORLD_SIZE") and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def unpadded_ids(batch: dict, ids: torch.Tensor) -> list[list[int]]:
    """Rows of `ids` `(batch, seq)` without their right padding."""
    mask = batch.get("attention_mask")
    rows = ids.tolist()
    return rows if mask is None else [row[: int(n)] for row, n in zip(rows, mask.sum(-1).tolist())]


def _scalar(value) -> bool:
    return isinstance(value, (int, float, str, bool)) or value is None
