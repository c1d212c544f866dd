"""What the three fine-tuning scripts (classification, NER, extractive QA) share around the training loop: their
common arguments, padding, data loaders, evaluation in dataset order across processes, and the final save.

A task module (classification.py, ner.py, qa.py) turns its data into rows of token ids and provides an
`Evaluation`; the script wires them into `Trainer` and ends with `finish`.
"""

import argparse
import json
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from accelerate import Accelerator
from torch import nn

from .arguments import (
    ArgumentParser,
    add_data_arguments,
    add_example_script_arguments,
    add_model_arguments,
    add_training_arguments,
)
from .errors import UserError
from .hub import add_hub_arguments, push_folder
from .loop import Task, Trainer, check_step_memory, save_final, training_steps
from .models import add_size_arguments, load_pretrained, size_line
from .reporting import write_model_card
from .sharding import is_sharded

MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids", "case_ids")


def finetune_parser(description: str, *, script: str, max_length: int, batch_size: int,
                    adversarial_epsilon: float = 0.0) -> argparse.ArgumentParser:
    """The arguments every fine-tuning script takes: data, model, size, training (the learning rate, the length of
    the run and a nonzero `adversarial_epsilon` left open for `fit_schedule`), fine-tuning, the hub, and the flags of
    Hugging Face's `run_<script>_no_trainer.py` (glue, ner or qa); the script adds its task's own group."""
    parser = ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_example_script_arguments(parser, script)
    add_hub_arguments(parser)
    add_data_arguments(parser)
    add_model_arguments(parser)
    add_size_arguments(parser)
    add_training_arguments(parser, learning_rate=None, batch_size=batch_size, epochs=None,
                           adversarial_epsilon=adversarial_epsilon)
    group = parser.add_argument_group("fine-tuning")
    group.add_argument(
        "--max_length", "--max_seq_length", dest="max_length", type=int, default=max_length,
        help="Tokens per input, special tokens included; longer inputs are truncated (QA: split into windows).",
    )
    group.add_argument(
        "--early_stopping_patience", type=int,
        help="End training after this many evaluations in a row without improvement of the main metric, once half "
             f"the run is done; 0 never stops early (default: {PATIENCE} when the run's length is chosen from the "
             "data, else 0).",
    )
    group.add_argument(
        "--load_best_model_at_end", action="store_true", default=None,
        help="End with the weights of the evaluation with the best main metric (and report its metrics); the default "
             "when the run's length is chosen from the data.",
    )
    group.add_argument("--no_load_best_model_at_end", dest="load_best_model_at_end", action="store_false",
                       help="End with the weights of the last step.")
    group.add_argument(
        "--group_by_length", action="store_true",
        help="Batch training examples of similar length together (the batches in a random order), so that little of "
             "each batch is padding. Off by default, as in Hugging Face's Trainer: with a loss averaged over the "
             "tokens of a batch (NER) it gives the tokens of short examples more weight.",
    )
    group.add_argument("--no_group_by_length", dest="group_by_length", action="store_false",
                       help="Draw every training batch at random (the default; overrides a config file).")
    group.add_argument(
        "--ignore_mismatched_sizes", action="store_true",
        help="Start from a checkpoint whose task head has another number of labels (that head is re-initialised).",
    )
    return parser


# The schedule of a run whose command line leaves it open, from the number of training rows N (measured in
# docs/QUALITY.md, "Fine-tuning with only the files"). The peak learning rate falls as 1/sqrt(N): 5e-4 up to 1,000
# rows, 2.2e-4 at 5,000, never below 1e-4 (from 25,000 rows on; SST-2's cram recipe uses 1e-4 on its 67k). The run
# lasts about STEP_TARGET optimizer steps, between 1 and MAX_EPOCHS epochs (a 1,000-row set: 20 epochs of 30 steps,
# where three epochs, 90 steps, gave 4 points less on SST-2). It is evaluated about EVALUATIONS times, stops after
# PATIENCE evaluations without a better main metric (in its second half), and ends with the best evaluation's weights.
LEARNING_RATE_AT_1K, LOWEST_LEARNING_RATE = 5e-4, 1e-4
STEP_TARGET, MAX_EPOCHS, EVALUATIONS, PATIENCE = 1000, 20, 10, 3
# Classification trains each batch also with its word embeddings moved this far up their loss gradient (FGM): it
# gained on SST-2 at 1k, 5k and 67k sentences and on five of six sets the recipe was never tuned on (QUALITY.md).
CLASSIFICATION_FGM = 0.25


def learning_rate_for(rows: int) -> float:
    return min(LEARNING_RATE_AT_1K, max(LOWEST_LEARNING_RATE, LEARNING_RATE_AT_1K * math.sqrt(1000 / rows)))


def fit_schedule(args, accelerator: Accelerator, rows: int):
    """Fill in the parts of the schedule the command line (or config file) left open, from the number of training
    rows, and say what was chosen. The learning rate is chosen whenever --learning_rate is not given; the length,
    evaluation cadence, early stopping and best weights only when none of --max_train_steps, --num_train_epochs and
    --max_train_minutes is (a length the user gives is trained in full). The script's FGM is taken when
    --adversarial_epsilon is not given, except under FSDP, which cannot run it."""
    chosen = []
    if args.learning_rate is None:
        args.learning_rate = float(f"{learning_rate_for(rows):.1e}")
        chosen.append(f"learning rate {args.learning_rate:g}")
    if args.adversarial_epsilon is None:
        sharded = is_sharded(accelerator)
        args.adversarial_epsilon = 0.0 if sharded else args.default_adversarial_epsilon
        chosen.append(f"adversarial word embeddings {args.adversarial_epsilon:g}"
                      + (" (FGM is off under FSDP)" if sharded else ""))
    if (args.max_train_steps, args.num_train_epochs, args.max_train_minutes) == (None, None, None):
        batches = math.ceil(rows / (args.per_device_train_batch_size * accelerator.num_processes))
        steps_per_epoch = batches / args.gradient_accumulation_steps
        args.num_train_epochs = round(min(MAX_EPOCHS, max(1.0, STEP_TARGET / steps_per_epoch)), 1)
        steps = training_steps(args, batches)
        chosen.append(f"{args.num_train_epochs:g} epochs ({steps:,} steps)")
        if args.eval_steps is None:
            args.eval_steps = max(1, math.ceil(steps / EVALUATIONS))
            chosen.append(f"evaluation every {args.eval_steps:,} steps and at each epoch's end")
        if args.early_stopping_patience is None:
            args.early_stopping_patience = PATIENCE
            chosen.append(f"early stopping after {PATIENCE} evaluations without improvement")
        if args.load_best_model_at_end is None:
            args.load_best_model_at_end = True
            chosen.append("the best evaluation's weights kept")
    if chosen:
        accelerator.print(f"Schedule for {rows:,} training rows: {'; '.join(chosen)}.")


def load_model(auto_class, args, tokenizer, **config_values) -> nn.Module:
    """`load_pretrained` with --ignore_mismatched_sizes passed on when starting from a checkpoint."""
    if args.model_name_or_path and args.ignore_mismatched_sizes:
        config_values["ignore_mismatched_sizes"] = True
    try:
        return load_pretrained(auto_class, args, tokenizer, **config_values)
    except RuntimeError as error:
        if "ignore_mismatched_sizes" not in str(error):
            raise
        raise UserError(
            f"The task head of --model_name_or_path {args.model_name_or_path} has another size than this data needs "
            f"({config_values.get('num_labels', 'its')} labels); pass --ignore_mismatched_sizes to start that head "
            "afresh."
        ) from None


class PaddingCollator:
    """Batches rows of Python lists: pads the token-aligned fields to the longest row (with the pad id, 0 for the
    masks, -100 for token labels) and stacks every other field (scalar labels, multi-hot rows, indices)."""

    def __init__(self, pad_token_id: int, token_labels: bool = False):
        self.pads = {"input_ids": pad_token_id, "attention_mask": 0, "token_type_ids": 0, "case_ids": 0}
        if token_labels:
            self.pads["labels"] = -100

    def __call__(self, rows: list[dict]) -> dict[str, torch.Tensor]:
        batch = {}
        for key in rows[0]:
            values = [row[key] for row in rows]
            if key in self.pads:
                padded = torch.full((len(values), max(map(len, values))), self.pads[key], dtype=torch.long)
                for i, value in enumerate(values):
                    padded[i, : len(value)] = torch.tensor(value, dtype=torch.long)
                batch[key] = padded  # (batch, longest row)
            else:
                batch[key] = torch.tensor(values)
        return batch


class LengthGroupedSampler(torch.utils.data.Sampler):
    """Indices in batches of similar length, like Hugging Face Trainer's `group_by_length`, but with the batches
    themselves in a random order rather than longest first within each group.

    Each epoch shuffles the examples, sorts every group of `group_batches` x `batch_size` of them by length, cuts the
    group into batches, and shuffles the batches of the whole epoch. Batches stay random samples of the data (up to
    their length) while padding falls from 62% of the tokens to 2% on SST-2 (31% to 1% on squad_train). The order
    depends only on the seed and the epoch (`set_epoch`), so a resumed run sees the same batches.
    """

    def __init__(self, lengths: list[int], batch_size: int, seed: int, group_batches: int = 50):
        self.lengths, self.batch_size, self.seed, self.group_batches = lengths, batch_size, seed, group_batches
        self.epoch = 0

    def set_epoch(self, epoch: int):
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.lengths)

    def __iter__(self) -> Iterator[int]:
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        shuffled = torch.randperm(len(self.lengths), generator=generator).tolist()
        group = self.group_batches * self.batch_size
        batches = []
        for start in range(0, len(shuffled), group):
            members = sorted(shuffled[start:start + group], key=self.lengths.__getitem__, reverse=True)
            batches += [members[i:i + self.batch_size] for i in range(0, len(members), self.batch_size)]
        # A short batch (the end of the last group) stays last so that every other one fills a whole global batch.
        full = [batch for batch in batches if len(batch) == self.batch_size]
        short = [batch for batch in batches if len(batch) < self.batch_size]
        order = torch.randperm(len(full), generator=generator).tolist()
        for batch in [full[i] for i in order] + short:
            yield from batch


def make_dataloaders(args, accelerator: Accelerator, config, train_rows: list[dict], eval_rows: list[dict],
                     collator: PaddingCollator):
    """The training loader (prepared later by `Trainer`) and the prepared evaluation loader, once a step of the
    longest rows is known to fit the machine.

    Evaluation rows carry `example_index`, their position, so that predictions come back in dataset order.
    """
    if not train_rows:
        raise UserError("There is no training example left to train on; check the training data and its columns.")
    if not eval_rows:
        raise UserError("There is no evaluation example; give --validation_file or a larger training set.")
    longest = max(len(row["input_ids"]) for row in train_rows)
    check_step_memory(config, min(args.per_device_train_batch_size, len(train_rows)), longest,
                      f"--max_length {args.max_length} with --per_device_train_batch_size "
                      f"{args.per_device_train_batch_size}", accelerator.device)
    if args.group_by_length:
        # accelerate deals the per-process batches out in turn: one global batch is `processes` consecutive ones.
        global_batch = args.per_device_train_batch_size * accelerator.num_processes
        lengths = [len(row["input_ids"]) for row in train_rows]
        order = {"sampler": LengthGroupedSampler(lengths, global_batch, args.seed)}
    else:
        order = {"shuffle": True, "generator": torch.Generator().manual_seed(args.seed)}
    train = torch.utils.data.DataLoader(
        train_rows, batch_size=args.per_device_train_batch_size, collate_fn=collator, **order
    )
    indexed = [{**row, "example_index": i} for i, row in enumerate(eval_rows)]
    evaluation = torch.utils.data.DataLoader(
        indexed, batch_size=args.per_device_eval_batch_size or args.per_device_train_batch_size, collate_fn=collator
    )
    return train, accelerator.prepare(evaluation)


def predict_in_order(model: nn.Module, dataloader, accelerator: Accelerator,
                     outputs: Callable[[dict, object], dict[str, torch.Tensor]]) -> list[dict[str, torch.Tensor]]:
    """Run `model` over a prepared evaluation loader and return, per evaluation row and in dataset order, the
    tensors `outputs(batch, model_output)` computes (each `(batch, ...)`).

    Every process gets all rows. Rows are gathered from all processes (padded along dim 1 to a common length, so a
    row may end in padding) and the copies accelerate adds to even out the last batch are dropped.
    """
    rows = {}
    for batch in dataloader:
        index = batch.pop("example_index")
        with accelerator.autocast():
            output = model(**{k: v for k, v in batch.items() if k in MODEL_INPUTS})
        values = {
            name: accelerator.pad_across_processes(value, dim=1) if value.dim() > 1 else value
            for name, value in outputs(batch, output).items()
        }
        index, values = accelerator.gather_for_metrics((index, values))
        for row, position in enumerate(index.tolist()):
            rows[position] = {name: value[row].cpu() for name, value in values.items()}
    return [rows[i] for i in range(len(rows))]


class Evaluation(ABC):
    """`Task.evaluate` for a fine-tuning script: predicts the evaluation rows, scores them, and keeps the
    predictions of the latest evaluation for the final save.

    Subclasses set `main_metric`, `greater_is_better`, `plot_metrics` and implement `outputs` (what to gather of a
    batch), `score` (predictions and metrics from the gathered rows) and `write` (the predictions file).
    """

    main_metric: str = "eval_loss"
    greater_is_better: bool = False
    plot_metrics: tuple[str, ...] = ()

    def __init__(self, dataloader, accelerator: Accelerator):
        self.dataloader, self.accelerator = dataloader, accelerator
        self.predictions = None

    def __call__(self, model: nn.Module) -> dict:
        rows = predict_in_order(model, self.dataloader, self.accelerator, self.outputs)
        self.predictions, metrics = self.score(rows)
        return {f"eval_{name}": value for name, value in metrics.items()}

    def task(self, args, count: Callable[[dict], int]) -> Task:
        return Task(
            count=count, evaluate=self, main_metric=self.main_metric, greater_is_better=self.greater_is_better,
            early_stopping_patience=args.early_stopping_patience or None, plot_metrics=self.plot_metrics,
            load_best_model_at_end=bool(args.load_best_model_at_end),
        )

    @abstractmethod
    def outputs(self, batch: dict, output) -> dict[str, torch.Tensor]:
        """The tensors `(batch, ...)` to gather of a batch and the model's output."""

    @abstractmethod
    def score(self, rows: list[dict[str, torch.Tensor]]) -> tuple[list, dict]:
        """(predictions, metrics without the `eval_` prefix) from the gathered rows in dataset order."""

    @abstractmethod
    def write(self, output_dir: Path):
        """Write the latest predictions into `output_dir`."""

    def served(self, model: nn.Module):
        """Make the trained `model` (in place) the one to save and serve; by default it is already."""


def finish(args, accelerator: Accelerator, trainer: Trainer, tokenizer, evaluation: Evaluation, results: dict,
           card: dict) -> nn.Module:
    """The end of every fine-tuning run: curves, `save_pretrained` with the tokenizer and `all_results.json`, the
    predictions of the final model, a model card (`card`: the arguments of `write_model_card`) and args.json.
    Returns the unwrapped model."""
    if evaluation.predictions is None:  # a run resumed at its last step evaluates nothing during `fit`
        trainer.model.eval()
        with torch.no_grad():
            evaluation(trainer.model)
    trainer.plot(card["title"])
    model = trainer.unwrapped_model()
    save_final(accelerator, model, tokenizer, args.output_dir, results, prepare=evaluation.served)
    if accelerator.is_main_process:
        trainer.best_weights.unlink(missing_ok=True)  # kept until now so that a resumed run could restore them
        evaluation.write(Path(args.output_dir))
        details = {**training_details(args, accelerator, model, results), **card.get("details", {})}
        write_model_card(Path(args.output_dir), args, **{**card, "details": details}, results=results)
        push_folder(args, Path(args.output_dir))
    accelerator.wait_for_everyone()
    return model


def training_details(args, accelerator: Accelerator, model: nn.Module, results: dict) -> dict:
    """The model-card lines every fine-tuning run shares."""
    config = model.config
    start = args.model_name_or_path or "scratch (no pretraining)"
    return {
        "data": args.dataset_name or ", ".join(Path(f).name for f in args.train_file or []),
        "started from": start,
        "size": size_line(config),
        "steps": f"{results['train_steps']} of batch {args.per_device_train_batch_size} x "
                 f"{accelerator.num_processes} processes x {args.gradient_accumulation_steps} accumulation",
        "max length": args.max_length,
        "learning rate": f"{args.learning_rate} ({args.lr_scheduler_type} schedule)",
        "mixed precision": accelerator.mixed_precision,
    }


def write_jsonl(path: Path, rows: list[dict]):
    with Path(path).open("w", encoding="utf-8") as file:
        for row in rows:
            file.write(json.dumps(row, ensure_ascii=False) + "\n")
