"""Command-line arguments shared by the scripts, named as in Hugging Face's `*_no_trainer.py` examples.

Any argument can also come from a YAML or JSON file given with `--config_file`; values on the command line win.
"""

import argparse
import json
from pathlib import Path

import yaml

from .errors import UserError, one_line
from .optimizer import MUON_LEARNING_RATE_RATIO, OPTIMIZERS

SCHEDULERS = ("linear", "cosine", "cosine_with_restarts", "polynomial", "constant", "constant_with_warmup")


class ArgumentParser(argparse.ArgumentParser):
    """argparse, with one sentence for a bad command line where argparse prints the whole usage (60 lines here)."""

    def error(self, message: str):
        self.exit(2, f"error: {message}; `{self.prog} --help` lists the arguments.\n")


SCORE_ANOTHER_FILE = ("score another file by fine-tuning with --validation_file set to it, or run the saved folder "
                      "with --max_train_steps 0 and --validation_file (it evaluates and saves).")
# Flags of Hugging Face's run_mlm / run_glue / run_ner / run_qa no_trainer examples that sinebert's scripts take but
# cannot honour, and the sentence each gets (a flag that works is an ordinary argument of the script).
REFUSED_EXAMPLE_FLAGS = {
    "use_slow_tokenizer": "--use_slow_tokenizer: sinebert needs a fast tokenizer (offsets and word ids come from it); "
                          "drop the flag.",
    "line_by_line": "--line_by_line: pretraining packs lines into full blocks of --max_seq_length tokens (no "
                    "padding, the same tokens per step); drop the flag, and mark document ends with blank lines.",
    "pad_to_max_length": "--pad_to_max_length: sinebert removes padding before its layers, so padding every batch "
                         "to --max_length would only cost time; drop the flag.",
    "do_predict": f"--do_predict / --test_file: {SCORE_ANOTHER_FILE}",
    "test_file": f"--test_file: {SCORE_ANOTHER_FILE}",
    "max_predict_samples": "--max_predict_samples: there is no prediction stage; --max_eval_samples limits the "
                           "--validation_file questions that are scored.",
    "null_score_diff_threshold": "--null_score_diff_threshold: with --version_2_with_negative the empty answer "
                                 "competes with the spans by probability, without a threshold; drop the flag.",
}


def _steps_or_epoch(value: str):
    if value in (None, "epoch"):
        return value
    try:
        steps = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of steps or 'epoch', got {value!r}") from None
    if steps <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of steps, got {steps}")
    return steps


def _steps_or_zero(value: str) -> int:
    try:
        steps = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of steps, got {value!r}") from None
    if steps < 0:
        raise argparse.ArgumentTypeError(f"expected 0 or more steps, got {steps}")
    return steps


def add_data_arguments(parser: argparse.ArgumentParser):
    group = parser.add_argument_group("data")
    group.add_argument("--dataset_name", help="A dataset on the Hugging Face hub (needs a network).")
    group.add_argument("--dataset_config_name", help="The hub dataset's configuration name.")
    group.add_argument("--train_file", nargs="+", help="Local training files (txt, csv, tsv, json, jsonl); globs work.")
    group.add_argument("--validation_file", nargs="+", help="Local validation files, as --train_file.")
    group.add_argument(
        "--validation_split_percentage", type=float, default=5.0,
        help="Percent of the training data held out for validation when no validation split is given.",
    )
    group.add_argument("--encoding", default="utf-8", help="Text encoding of local files.")
    group.add_argument("--max_train_samples", type=int, help="Keep only this many training examples (for quick runs).")
    group.add_argument("--max_eval_samples", type=int, help="Keep only this many evaluation examples.")
    group.add_argument("--preprocessing_num_workers", type=int, help="Processes for tokenisation.")


def add_example_script_arguments(parser: argparse.ArgumentParser, script: str):
    """The flags of Hugging Face's `run_<script>_no_trainer.py` (mlm, glue, ner, qa) that the script has no argument
    of its own for: each works with its Hugging Face meaning, or `check_example_script_flags` refuses it in one
    sentence (REFUSED_EXAMPLE_FLAGS)."""
    group = parser.add_argument_group(f"flags of Hugging Face's run_{script}_no_trainer.py")
    group.add_argument("--model_type", help="Accepted as 'sinebert', the only model these scripts train.")
    group.add_argument("--low_cpu_mem_usage", action="store_true",
                       help="Accepted: transformers 5 always builds the model empty and loads the weights into it.")
    group.add_argument("--overwrite_cache", action="store_true",
                       help="Tokenize again instead of reading the datasets cache." if script == "mlm" else
                       "Accepted: fine-tuning tokenizes in memory at every start and caches nothing.")
    group.add_argument("--use_slow_tokenizer", action="store_true", help=argparse.SUPPRESS)
    group.add_argument("--pad_to_max_length", action="store_true",
                       help="Accepted: every block is --max_seq_length tokens." if script == "mlm" else argparse.SUPPRESS)
    if script == "mlm":
        group.add_argument("--line_by_line", action="store_true", help=argparse.SUPPRESS)
    if script == "ner":
        group.add_argument("--task_name", choices=("ner", "pos", "chunk"),
                           help="Hub CoNLL-2003-style data: tag with the '<task>_tags' column (default: ner).")
        group.add_argument("--return_entity_level_metrics", action="store_true",
                           help="Accepted: the results always hold precision, recall and F1 per entity type.")
    if script == "qa":
        group.add_argument("--do_predict", action="store_true", help=argparse.SUPPRESS)
        group.add_argument("--test_file", help=argparse.SUPPRESS)
        group.add_argument("--max_predict_samples", type=int, help=argparse.SUPPRESS)
        group.add_argument("--null_score_diff_threshold", type=float, help=argparse.SUPPRESS)


def check_example_script_flags(args: argparse.Namespace):
    """UserError for an example-script flag the script cannot honour, or a --model_type other than sinebert."""
    if getattr(args, "model_type", None) not in (None, "sinebert"):
        raise UserError(
            f"--model_type {args.model_type}: these scripts train sinebert; Hugging Face's own run_*_no_trainer.py "
            "examples train other model types."
        )
    if hasattr(args, "return_entity_level_metrics") and args.task_name and args.label_column_name is None:
        args.label_column_name = f"{args.task_name}_tags"  # run_ner's --task_name picks the tag column
    if getattr(args, "pad_to_max_length", False) and hasattr(args, "line_by_line"):
        args.pad_to_max_length = False  # pretraining: blocks are full already
    for name, sentence in REFUSED_EXAMPLE_FLAGS.items():
        if getattr(args, name, None) not in (None, False):
            raise UserError(sentence)


def add_model_arguments(parser: argparse.ArgumentParser):
    group = parser.add_argument_group("model")
    group.add_argument("--model_name_or_path", help="A pretrained checkpoint folder (or hub name) to start from.")
    group.add_argument("--config_name", help="A config file or folder for a model trained from scratch.")
    group.add_argument("--tokenizer_name", help="A tokenizer folder (or hub name); defaults to --model_name_or_path.")
    group.add_argument("--trust_remote_code", action="store_true", help="Allow hub checkpoints that ship code.")
    group.add_argument(
        "--allow_pickle_weights", action="store_true",
        help="Also load *.bin (pickle) weights; they can run code, so only for files you trust. Default: safetensors only.",
    )
    group.add_argument(
        "--attn_implementation", choices=("sdpa", "eager"), default=None,
        help="Attention kernel: sdpa (default, fast) or eager (the reference, returns attention weights).",
    )


def add_training_arguments(parser: argparse.ArgumentParser, *, learning_rate: float | None, batch_size: int,
                           epochs: float | None, adversarial_epsilon: float = 0.0):
    """`learning_rate` / `epochs` None: the script chooses them from its data (the fine-tuning scripts). A nonzero
    `adversarial_epsilon` is the script's FGM when --adversarial_epsilon is not given (`fit_schedule` sets it)."""
    group = parser.add_argument_group("training")
    group.add_argument("--output_dir", required=True, help="Where checkpoints, logs and the final model go.")
    group.add_argument("--overwrite_output_dir", action="store_true", help="Replace a different run in --output_dir.")
    group.add_argument("--seed", type=int, default=42)
    group.add_argument("--per_device_train_batch_size", type=int, default=batch_size)
    group.add_argument("--per_device_eval_batch_size", type=int, default=None, help="Defaults to the train batch size.")
    group.add_argument("--learning_rate", type=float, default=learning_rate,
                       help=f"Peak learning rate (default: {learning_rate:g})." if learning_rate is not None else
                       "Peak learning rate (default: chosen from the number of training rows; the run prints it).")
    group.add_argument(
        "--embedding_learning_rate", type=float, default=None,
        help="Peak learning rate of the word embeddings (and of a masked-LM decoder tied to them), on the same "
             "schedule (default: --learning_rate).",
    )
    group.add_argument(
        "--layerwise_lr_decay", type=float, default=1.0,
        help="Each layer's peak learning rate is this times the one of the layer above it (the task head and final "
             "norm at --learning_rate, the embeddings below the first layer), as ELECTRA fine-tunes; 1 disables it.",
    )
    group.add_argument(
        "--optim", choices=OPTIMIZERS, default="adamw",
        help="AdamW (the default), or Muon on the hidden weight matrices (the encoder layers' and the heads' square "
             "transforms) with AdamW on the rest.",
    )
    group.add_argument(
        "--muon_learning_rate", type=float, default=None,
        help=f"Peak learning rate of Muon's matrices under --optim muon (default: {MUON_LEARNING_RATE_RATIO} x "
             "--learning_rate).",
    )
    group.add_argument("--weight_decay", type=float, default=0.01, help="Decoupled weight decay; never on biases or "
                       "LayerNorms.")
    group.add_argument("--adam_beta1", type=float, default=0.9)
    group.add_argument("--adam_beta2", type=float, default=0.999)
    group.add_argument("--adam_epsilon", type=float, default=1e-8)
    group.add_argument("--num_train_epochs", type=float,
                       help=(f"Passes over the training data (default: {epochs:g}" if epochs is not None else
                             "Passes over the training data (default: chosen from the number of training rows")
                       + ", or as many as --max_train_minutes allows when that is given without it).")
    group.add_argument("--max_train_steps", type=_steps_or_zero,
                       help="Total optimizer steps; overrides --num_train_epochs (0: evaluate and save the start).")
    group.add_argument("--max_train_minutes", type=float,
                       help="Stop (and save) after this much training time. Without --max_train_steps or "
                            "--num_train_epochs the run trains until then, its schedule laid over the time.")
    # No default above, so that an explicit --num_train_epochs (or config key) is told apart from the script's.
    parser.set_defaults(default_train_epochs=epochs)
    group.add_argument("--gradient_accumulation_steps", type=int, default=1)
    group.add_argument("--max_grad_norm", type=float, default=1.0, help="Gradient clipping; 0 disables it.")
    group.add_argument("--lr_scheduler_type", choices=SCHEDULERS, default="linear")
    group.add_argument("--num_warmup_steps", type=int, default=None, help="Warmup steps (default: --warmup_ratio).")
    group.add_argument("--warmup_ratio", type=float, default=0.06, help="Warmup as a fraction of all steps.")
    group.add_argument(
        "--mixed_precision", choices=("no", "bf16", "fp16"), default=None,
        help="Overrides the accelerate launcher's setting; bf16 works on CPU and GPU.",
    )
    group.add_argument("--gradient_checkpointing", action="store_true", help="Trade compute for activation memory.")
    group.add_argument("--torch_compile", action="store_true",
                       help="Compile the model with torch.compile. On 2 CPU cores it gained at most 2%% a step, "
                            "after about a minute of compiling.")
    group.add_argument(
        "--adversarial_epsilon", type=float, default=None if adversarial_epsilon else 0.0,
        help="Also train on the word embeddings moved by this norm up the loss gradient (FGM); 0 disables it"
             + (f" (default: {adversarial_epsilon:g}, or 0 under FSDP, which cannot run it)." if adversarial_epsilon
                else "."),
    )
    parser.set_defaults(default_adversarial_epsilon=adversarial_epsilon)
    group.add_argument(
        "--checkpointing_steps", type=_steps_or_epoch, default=None,
        help="Save a resumable checkpoint every N optimizer steps, or 'epoch'.",
    )
    group.add_argument("--checkpoints_total_limit", type=int, default=2, help="Keep only the newest K checkpoints.")
    group.add_argument("--resume_from_checkpoint", help="A checkpoint folder, or 'latest' in --output_dir.")
    group.add_argument(
        "--resume_fallback", action="store_true",
        help="If the checkpoint to resume from is damaged, resume from the newest intact one before it.",
    )
    group.add_argument(
        "--nonfinite_loss", choices=("stop", "skip"), default="stop",
        help="On a NaN/Inf loss: stop with the last good checkpoint kept, or skip that batch's update.",
    )
    group.add_argument("--eval_steps", type=int, help="Evaluate every N optimizer steps (also at each epoch's end).")
    group.add_argument("--logging_steps", type=int, default=10, help="Log the training loss every N steps.")
    group.add_argument("--with_tracking", action="store_true", help="Also log to accelerate trackers (--report_to).")
    group.add_argument("--report_to", default="all", help="Tracker names for --with_tracking, as in accelerate.")
    group.add_argument("--trace_data", action="store_true",
                       help="Write the token ids each process trained on (pretraining: and the masked positions) to "
                            "data_trace_rank*.jsonl in --output_dir.")


# The range of every numeric argument, checked in one place for the command line and the config file alike (an
# argument a script does not have is skipped; None, "not given", always passes): dest -> (lowest, lowest allowed?,
# highest or None, highest allowed?).
AT_LEAST_ONE, ZERO_OR_MORE, MORE_THAN_ZERO = (1, True, None, False), (0, True, None, False), (0, False, None, False)
RANGES = {
    **dict.fromkeys(("per_device_train_batch_size", "per_device_eval_batch_size", "gradient_accumulation_steps",
                     "logging_steps", "eval_steps", "checkpoints_total_limit", "max_length", "max_seq_length",
                     "max_train_samples", "max_eval_samples", "max_train_tokens", "doc_stride",
                     "max_answer_length", "n_best_size", "vocab_size", "min_frequency"), AT_LEAST_ONE),
    # A learning rate of 0 trains nothing (or freezes the embeddings); 0 minutes stops after the first step.
    # A patience of 0 turns early stopping off.
    **dict.fromkeys(("num_warmup_steps", "weight_decay", "max_grad_norm", "seed", "learning_rate",
                     "embedding_learning_rate", "muon_learning_rate", "max_train_minutes", "early_stopping_patience"),
                    ZERO_OR_MORE),
    **dict.fromkeys(("num_train_epochs", "adam_epsilon"), MORE_THAN_ZERO),
    "warmup_ratio": (0, True, 1, True),
    "layerwise_lr_decay": (0, False, 1, True),
    "adam_beta1": (0, True, 1, False),
    "adam_beta2": (0, True, 1, False),
}


def _range_error(name: str, value, bounds) -> str | None:
    """One sentence where `value` of --`name` is outside `bounds`, else None."""
    low, low_allowed, high, high_allowed = bounds
    if value is None:
        return None
    above = value >= low if low_allowed else value > low
    below = high is None or (value <= high if high_allowed else value < high)
    if above and below:
        return None
    lowest = f"at least {low}" if low_allowed else f"more than {low}"
    highest = "" if high is None else f" and {'at most' if high_allowed else 'below'} {high}"
    return f"--{name} must be {lowest}{highest}, got {value}."


def check_ranges(args: argparse.Namespace):
    """UserError for the first numeric argument outside its range (RANGES)."""
    for name, bounds in RANGES.items():
        message = _range_error(name, getattr(args, name, None), bounds)
        if message:
            raise UserError(message)


def _typed(parser: argparse.ArgumentParser, config_file: str, values: dict) -> dict:
    """The config file's values converted as the command line converts them (`type`), so that a list where a number
    belongs is one sentence, not an error from deep inside torch."""
    typed = dict(values)
    for action in parser._actions:
        value = values.get(action.dest)
        if value is None or action.type is None or action.nargs not in (None, "?"):
            continue
        if isinstance(value, (list, dict, bool)):
            raise UserError(f"{config_file}: {action.dest}={value!r} must be a single value, as --{action.dest} takes.")
        try:
            typed[action.dest] = action.type(str(value))
        except (ValueError, argparse.ArgumentTypeError) as error:
            raise UserError(f"{config_file}: {action.dest}={value!r} is not valid ({error}).") from None
    return typed


def parse_with_config_file(parser: argparse.ArgumentParser, argv: list[str] | None = None) -> argparse.Namespace:
    """Parse `argv`, taking defaults from `--config_file` (YAML or JSON) when given; then check every numeric
    argument's range (RANGES), wherever its value came from.

    Unknown keys in the file are an error that lists the valid ones.
    """
    parser.add_argument("--config_file", help="YAML or JSON file of arguments; command-line values win.")
    known, _ = parser.parse_known_args(argv)
    if known.config_file:
        values = read_config_file(known.config_file)
        valid = {action.dest for action in parser._actions if action.dest not in ("help", "config_file")}
        unknown = sorted(set(values) - valid)
        if unknown:
            parser.error(
                f"{known.config_file} has unknown keys {unknown}; valid keys are: {', '.join(sorted(valid))}."
            )
        for action in parser._actions:
            if action.dest not in values:
                continue
            if action.choices is not None and values[action.dest] not in action.choices:
                parser.error(
                    f"{known.config_file}: {action.dest}={values[action.dest]!r} is not one of {list(action.choices)}."
                )
            action.required = False
        parser.set_defaults(**_typed(parser, known.config_file, values))
    args = parser.parse_args(argv)
    check_ranges(args)
    check_example_script_flags(args)
    return args


def read_config_file(path: str) -> dict:
    file = Path(path)
    if not file.is_file():
        raise UserError(f"--config_file {path} does not exist; give the path of a YAML or JSON file of arguments.")
    text = file.read_text(encoding="utf-8")
    try:
        values = json.loads(text) if file.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as error:
        kind = file.suffix.lstrip(".").upper() or "YAML"
        raise UserError(f"--config_file {path} is not valid {kind}: {one_line(error)}") from None
    if not isinstance(values, dict):
        raise UserError(f"--config_file {path} must hold a mapping of argument names to values, got "
                        f"{type(values).__name__}.")
    return values
