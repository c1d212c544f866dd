"""Sequence classification data and evaluation: single texts or text pairs from csv / tsv / json / jsonl files or a
hub dataset (GLUE by --task_name), with single-label, multi-label or regression targets.

Class labels may be strings or integers; they become ids in sorted order (or in the order of a hub dataset's
ClassLabel names), saved as id2label / label2id in the model config so pipelines answer with the names.
"""

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from datasets import ClassLabel, DatasetDict, Sequence, Value
from torch import nn

from .data import FileRows, hold_out_validation, load_splits, pick_column, split_files
from .errors import UserError
from .finetune import Evaluation, write_jsonl
from .metrics.classification import compute_classification
from .metrics.regression import compute_regression
from .models import check_architecture

PROBLEM_TYPES = ("single_label_classification", "multi_label_classification", "regression")

# GLUE tasks on the hub (nyu-mll/glue): their text columns, as in Hugging Face's run_glue_no_trainer.py.
GLUE_TASKS = {
    "cola": ("sentence", None), "mnli": ("premise", "hypothesis"), "mrpc": ("sentence1", "sentence2"),
    "qnli": ("question", "sentence"), "qqp": ("question1", "question2"), "rte": ("sentence1", "sentence2"),
    "sst2": ("sentence", None), "stsb": ("sentence1", "sentence2"), "wnli": ("sentence1", "sentence2"),
}
PAIR_COLUMNS = (("sentence1", "sentence2"), ("premise", "hypothesis"), ("question1", "question2"),
                ("question", "sentence"), ("text", "text_pair"))
TEXT_COLUMNS = ("sentence", "text", "content", "review", "document")
LABEL_COLUMNS = ("label", "labels", "score")
DEFAULT_LABEL_SEPARATOR = ","  # splits a multi-label text cell when --label_separator is not given


@dataclass
class Columns:
    text: str
    pair: str | None
    label: str


@dataclass
class LabelSpace:
    """The targets of the model: class names by id (empty for regression) and the problem type."""

    problem_type: str
    names: list[str]
    separator: str | None = None  # splits a multi-label string cell into labels
    # Regression: the training targets' mean and standard deviation. The model trains on (y - shift) / scale, so that
    # the head starts at the right scale whatever the targets' units, and is saved mapping to y (`to_target_units`).
    shift: float = 0.0
    scale: float = 1.0

    def config_values(self) -> dict:
        if self.problem_type == "regression":
            return {"num_labels": 1, "problem_type": "regression"}
        return {
            "num_labels": len(self.names), "problem_type": self.problem_type,
            "id2label": dict(enumerate(self.names)), "label2id": {name: i for i, name in enumerate(self.names)},
        }


@dataclass(frozen=True)
class Rows:
    """How error messages name a row of one split: by its place in the data the user gave (its file and row there,
    for local files), which for a split held out of the training data (--validation_split_percentage) is its row
    there."""

    split: str  # "training" or "validation"
    held_out: list[int] | None = None  # for a split held out of the training data: each row's index there
    files: FileRows | None = None  # the files the rows were read from, in order

    def __call__(self, row: int) -> str:
        if self.held_out is not None:
            row = self.held_out[row]
        if self.files is not None:
            file, row_there = self.files.place(row)
            return f"Row {row_there:,} of {file}"
        return f"Row {row + 1} of the {'training' if self.held_out is not None else self.split} data"


@dataclass
class ClassificationData:
    columns: Columns
    labels: LabelSpace
    train_rows: list[dict]
    eval_rows: list[dict]
    eval_texts: list[tuple[str, str | None]]
    eval_targets: list  # encoded targets of the evaluation rows: ids, multi-hot rows or numbers


# ----- loading -----


def load_classification_splits(args) -> tuple[DatasetDict, dict[str, Rows]]:
    """train and validation splits from --task_name (GLUE), --dataset_name or local files, and how to name their
    rows."""
    if args.task_name:
        if args.task_name not in GLUE_TASKS:
            raise UserError(f"--task_name {args.task_name!r} is not a GLUE task; choose one of {sorted(GLUE_TASKS)}.")
        if args.dataset_name or args.train_file:
            raise UserError("--task_name loads a GLUE task from the hub; do not combine it with --dataset_name or "
                            "--train_file.")
        glue = type(args)(**{**vars(args), "dataset_name": "nyu-mll/glue", "dataset_config_name": args.task_name})
        splits = load_splits(glue)
        if "validation" not in splits and "validation_matched" in splits:  # MNLI
            splits["validation"] = splits["validation_matched"]
    else:
        splits = load_splits(args)
    splits, held_out = hold_out_validation(splits, args.validation_split_percentage, args.seed)
    files = {} if args.task_name else split_files(args)
    rows = {"train": Rows("training", held_out.get("train"), files.get("train")),
            "validation": Rows("validation", held_out.get("validation"),
                               files.get("train" if held_out else "validation"))}
    return DatasetDict(train=splits["train"], validation=splits["validation"]), rows


def find_columns(splits: DatasetDict, args) -> Columns:
    """The text (pair) and label columns: named by flags, else the GLUE task's, else the first usual names found."""
    names = list(splits["train"].column_names)
    label = pick_column(names, args.label_column_name, LABEL_COLUMNS, "--label_column_name", "label")
    if args.task_name:
        text, pair = GLUE_TASKS[args.task_name]
    else:
        found = [(a, b) for a, b in PAIR_COLUMNS if a in names and b in names]
        if args.text_column_name or not found:
            text = pick_column(names, args.text_column_name, TEXT_COLUMNS, "--text_column_name", "text")
            pair = None
        else:
            text, pair = found[0]
        if args.text_pair_column_name:
            pair = pick_column(names, args.text_pair_column_name, (), "--text_pair_column_name", "text pair")
    columns = Columns(text, pair, label)
    eval_names = list(splits["validation"].column_names)
    for role, name in (("text", text), ("text pair", pair), ("label", label)):
        if name is not None and name not in eval_names:
            raise UserError(
                f"The validation data has no column {name!r} (the {role} column of the training data); its columns "
                f"are {eval_names}. Give validation data with the training data's columns."
            )
    return columns


def build_label_space(train, column: str, problem_type: str | None, separator: str | None, rows: Rows,
                      print_fn=print) -> LabelSpace:
    """Class names from the training labels (or the hub's ClassLabel names) and the problem type.

    Without --problem_type: list-valued labels are multi-label, and so are text labels when --label_separator is
    given to split them; float-typed labels are regression (as Hugging Face's run_glue decides), anything else
    single-label; the choice is printed.
    """
    feature = train.features[column]
    values = list(train[column])
    if problem_type is None:
        split_text = separator is not None and _is_text(feature)
        problem_type = _infer_problem_type(feature, values, split_text)
        why = f"--label_separator {separator!r} splits its text; " if split_text else ""
        print_fn(f"Labels in {column!r}: training a {problem_type.replace('_', ' ')} model ({why}set --problem_type "
                 "to choose otherwise).")
    multi = problem_type == "multi_label_classification"
    space = LabelSpace(problem_type, [], (separator or DEFAULT_LABEL_SEPARATOR) if multi else None)
    if problem_type == "regression":
        return space
    if isinstance(feature, ClassLabel):
        space.names = list(feature.names)
    elif isinstance(feature, Sequence) and isinstance(feature.feature, ClassLabel):
        space.names = list(feature.feature.names)
    else:
        seen = {key for row, value in enumerate(values) for key in _label_keys(value, space, rows(row))}
        space.names = [str(v) for v in sorted(seen, key=lambda v: (isinstance(v, str), v))]
    if problem_type == "single_label_classification" and len(space.names) < 2:
        raise UserError(f"The training data has only the label {space.names} in {column!r}; a classifier needs at "
                        "least two classes.")
    return space


def _infer_problem_type(feature, values: list, split_text: bool) -> str:
    if split_text or isinstance(feature, (Sequence, list)) or (values and isinstance(values[0], list)):
        return "multi_label_classification"
    if isinstance(feature, Value) and feature.dtype.startswith("float"):
        return "regression"
    return "single_label_classification"


def _is_text(feature) -> bool:
    return isinstance(feature, Value) and feature.dtype in ("string", "large_string")


def _label_keys(value, space: LabelSpace, where: str) -> list:
    """The labels of one cell (several for multi-label), as hashable keys; `where` names its row."""
    if value is None or (isinstance(value, str) and not value.strip()):
        raise UserError(f"{where} has no label; fill it in or remove the row.")
    if space.problem_type == "multi_label_classification":
        items = value.split(space.separator) if isinstance(value, str) else value
        return [item.strip() if isinstance(item, str) else item for item in items]
    return [value]


def encode_targets(values: list, space: LabelSpace, feature, rows: Rows) -> list:
    """Class ids, multi-hot rows or floats for the model; a label the training data never had is an error."""
    if space.problem_type == "regression":
        return [_number(value, rows(row)) for row, value in enumerate(values)]
    class_label = feature if isinstance(feature, ClassLabel) else getattr(feature, "feature", None)
    by_name = {name: i for i, name in enumerate(space.names)}
    encoded = []
    for row, value in enumerate(values):
        ids = []
        for key in _label_keys(value, space, rows(row)):
            name = class_label.int2str(key) if isinstance(class_label, ClassLabel) and key != -1 else str(key)
            if name not in by_name:
                which = "the training data never has" if rows.held_out is None else \
                    "only the rows held out for validation have"
                raise UserError(
                    f"{rows(row)} has the label {name!r}, which {which}; the training labels are {space.names}. "
                    "Remove those rows or add examples of that label to the training data."
                )
            ids.append(by_name[name])
        if space.problem_type == "multi_label_classification":
            encoded.append([float(i in ids) for i in range(len(space.names))])
        else:
            encoded.append(ids[0])
    return encoded


def _number(value, where: str) -> float:
    if value is None or (isinstance(value, str) and not value.strip()):
        raise UserError(f"{where} has no label; fill it in or remove the row.")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise UserError(f"{where} has the label {value!r}, which is not a number as regression needs.") from None
    if not math.isfinite(number):
        raise UserError(f"{where} has the label {value!r}; regression needs finite numbers.")
    return number


def texts_of(split, columns: Columns, rows: Rows) -> list[tuple[str, str | None]]:
    texts = list(split[columns.text])
    pairs = list(split[columns.pair]) if columns.pair else [None] * len(texts)
    for row, (text, pair) in enumerate(zip(texts, pairs)):
        for column, value in ((columns.text, text), (columns.pair, pair)):
            if column and value is not None and not isinstance(value, str):
                raise UserError(
                    f"{rows(row)} has {value!r} ({type(value).__name__}) in {column!r}, not "
                    "text; give text there, or name the text column with --text_column_name."
                )
        if not isinstance(text, str) or (columns.pair and not isinstance(pair, str)):
            raise UserError(f"{rows(row)} has no text in {columns.text!r}"
                            f"{f' or {columns.pair!r}' if columns.pair else ''}; fill it in or remove the row.")
    return list(zip(texts, pairs))


def tokenize(tokenizer, texts: list[tuple[str, str | None]], targets: list, max_length: int) -> list[dict]:
    """Rows of token ids (truncated to `max_length`) with their `labels`."""
    firsts = [text for text, _ in texts]
    seconds = [pair for _, pair in texts] if texts and texts[0][1] is not None else None
    encoding = tokenizer(firsts, seconds, truncation=True, max_length=max_length)
    names = [name for name in tokenizer.model_input_names if name in encoding]
    return [{**{name: encoding[name][i] for name in names}, "labels": target} for i, target in enumerate(targets)]


def load_classification_data(args, tokenizer, print_fn=print) -> ClassificationData:
    splits, rows = load_classification_splits(args)
    columns = find_columns(splits, args)
    train = _first(splits["train"], args.max_train_samples)
    validation = _first(splits["validation"], args.max_eval_samples)
    labels = build_label_space(train, columns.label, args.problem_type, args.label_separator, rows["train"], print_fn)
    targets = {
        name: encode_targets(list(split[columns.label]), labels, split.features[columns.label], rows[name])
        for name, split in (("train", train), ("validation", validation))
    }
    train_texts, eval_texts = texts_of(train, columns, rows["train"]), texts_of(validation, columns, rows["validation"])
    trained = targets
    if labels.problem_type == "regression":
        values = np.asarray(targets["train"], dtype=np.float64)
        labels.shift, labels.scale = float(values.mean()), float(values.std()) or 1.0
        trained = {name: [(y - labels.shift) / labels.scale for y in ys] for name, ys in targets.items()}
    return ClassificationData(
        columns=columns, labels=labels,
        train_rows=tokenize(tokenizer, train_texts, trained["train"], args.max_length),
        eval_rows=tokenize(tokenizer, eval_texts, trained["validation"], args.max_length),
        eval_texts=eval_texts, eval_targets=targets["validation"],
    )


def to_target_units(model: nn.Module, space: LabelSpace):
    """Fold the regression targets' standardisation into the head's last layer, so that it outputs y itself:
    w' = scale * w, b' = scale * b + shift."""
    if space.problem_type == "regression":
        with torch.no_grad():
            model.classifier.weight.mul_(space.scale)
            model.classifier.bias.mul_(space.scale).add_(space.shift)


def starting_config(args):
    """The config of --model_name_or_path, None from scratch: what its classification head, if any, was trained as."""
    return check_architecture(args) if args.model_name_or_path else None


def classifier_pooling(args, start) -> str:
    """--classifier_pooling, else the pooling a classifier checkpoint (`start`) was trained with, else "mean": the
    mean of the token vectors beat the first token's in five of six runs, from a checkpoint and from scratch
    (docs/QUALITY.md, "Pooling")."""
    if args.classifier_pooling:
        return args.classifier_pooling
    if start is not None and any(name.endswith("ForSequenceClassification") for name in start.architectures or []):
        return start.classifier_pooling
    return "mean"


def to_standard_units(model: nn.Module, space: LabelSpace, start):
    """The inverse of `to_target_units` for a head loaded from a regression checkpoint (`start`, which outputs y), so
    that it outputs (y - shift) / scale as training expects; any other head is left as it starts."""
    if space.problem_type == "regression" and start is not None and start.problem_type == "regression":
        with torch.no_grad():
            model.classifier.bias.sub_(space.shift).div_(space.scale)
            model.classifier.weight.div_(space.scale)


def _first(split, limit: int | None):
    return split if limit is None else split.select(range(min(limit, len(split))))


def example_count(batch: dict) -> int:
    """Loss terms of a batch: one per example (multi-label losses average over classes within an example)."""
    return int(batch["labels"].shape[0])


# ----- evaluation -----


class ClassificationEvaluation(Evaluation):
    """Accuracy, macro-F1, per-class precision/recall and the confusion matrix (multi-label: also micro-F1 over
    labels with probability > 0.5; regression: MSE, MAE, Pearson and Spearman), plus the validation loss."""

    # problem type -> (main metric, metrics plotted beside the loss); all of them are better when greater
    METRICS = {
        "single_label_classification": ("eval_accuracy", ("eval_accuracy", "eval_macro_f1")),
        "multi_label_classification": ("eval_micro_f1", ("eval_micro_f1", "eval_macro_f1")),
        "regression": ("eval_pearson", ("eval_pearson", "eval_spearman")),
    }
    greater_is_better = True

    def __init__(self, dataloader, accelerator, data: ClassificationData):
        super().__init__(dataloader, accelerator)
        self.data = data
        self.main_metric, self.plot_metrics = self.METRICS[data.labels.problem_type]

    def outputs(self, batch, output):
        return {"logits": output.logits.float()}  # (batch, num_labels)

    def score(self, rows):
        logits = torch.stack([row["logits"] for row in rows])  # (examples, num_labels)
        targets = torch.tensor(self.data.eval_targets)  # (examples,) ids or numbers, or (examples, num_labels)
        score = {
            "single_label_classification": self._single_label, "multi_label_classification": self._multi_label,
            "regression": self._regression,
        }[self.data.labels.problem_type]
        predictions, metrics, loss = score(logits, targets)
        return predictions, {"loss": float(loss), **metrics}

    def _single_label(self, logits, targets):
        names = self.data.labels.names
        scores, chosen = logits.softmax(-1).max(-1)
        predictions = [{"prediction": names[i], "score": s} for i, s in zip(chosen.tolist(), scores.tolist())]
        metrics = compute_classification(chosen.numpy(), targets.numpy(), names)
        return predictions, metrics, F.cross_entropy(logits, targets)

    def _multi_label(self, logits, targets):
        names = self.data.labels.names
        probabilities = logits.sigmoid()
        chosen = (probabilities > 0.5).long()
        predictions = [
            {"prediction": [names[i] for i in np.flatnonzero(row)], "scores": dict(zip(names, p))}
            for row, p in zip(chosen.tolist(), probabilities.tolist())
        ]
        metrics = compute_classification(chosen.numpy(), targets.long().numpy(), names)
        return predictions, metrics, F.binary_cross_entropy_with_logits(logits, targets.float())

    def served(self, model: nn.Module):
        to_target_units(model, self.data.labels)

    def _regression(self, logits, targets):
        space = self.data.labels
        values = logits[:, 0] * space.scale + space.shift  # the head outputs standardised targets until it is saved
        predictions = [{"prediction": value} for value in values.tolist()]
        return predictions, compute_regression(values.tolist(), targets.tolist()), F.mse_loss(values, targets.float())

    def write(self, output_dir: Path):
        """eval_predictions.jsonl: per validation row its text(s), gold label and prediction."""
        names, rows = self.data.labels.names, []
        for index, ((text, pair), target, prediction) in enumerate(
            zip(self.data.eval_texts, self.data.eval_targets, self.predictions)
        ):
            if self.data.labels.problem_type == "single_label_classification":
                target = names[target]
            elif self.data.labels.problem_type == "multi_label_classification":
                target = [name for name, on in zip(names, target) if on]
            row = {"index": index, "text": text, **({"text_pair": pair} if pair is not None else {})}
            rows.append({**row, "label": target, **prediction})
        write_jsonl(output_dir / "eval_predictions.jsonl", rows)


def model_card(args, data: ClassificationData) -> dict:
    pipeline_call = '"a text to classify"' if data.columns.pair is None else \
        '{"text": "first text", "text_pair": "second text"}'
    return {
        "title": "sinebert fine-tuned for sequence classification",
        "summary": f"A sinebert encoder fine-tuned by `scripts/finetune_classification.py` "
                   f"({data.labels.problem_type.replace('_', ' ')}"
                   f"{', labels: ' + ', '.join(data.labels.names) if data.labels.names else ''}).",
        "pipeline_tag": "text-classification",
        "call": f"pipe({pipeline_call})",
        "details": {
            "columns": f"text {data.columns.text!r}"
                       f"{f', pair {data.columns.pair!r}' if data.columns.pair else ''}, label {data.columns.label!r}",
            "examples": f"{len(data.train_rows)} training, {len(data.eval_rows)} validation",
        },
    }
