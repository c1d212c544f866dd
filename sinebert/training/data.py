"""Loading data with `datasets`: local files (globs, several types), hub datasets, streaming; and clear errors for
files that are missing, empty, of an unknown type or in another encoding."""

import argparse
import functools
import glob
import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import datasets
import numpy as np
from datasets import DatasetDict, IterableDatasetDict, load_dataset
from datasets.exceptions import DatasetNotFoundError

from .errors import UserError, one_line

# `datasets` counts loads of its file builders (text, csv, json) with a request to the hub, even for local files and
# without a hub name: a name lookup and a connection from every run. sinebert's runs on local files contact nothing.
datasets.config.HF_UPDATE_DOWNLOAD_COUNTS = False

FILE_TYPES = {".txt": "text", ".text": "text", ".csv": "csv", ".tsv": "csv", ".json": "json", ".jsonl": "json"}


def expand_files(patterns: list[str] | None, flag: str) -> list[str]:
    """Expand globs; every file must exist and hold data."""
    files = []
    for pattern in patterns or []:
        matches = sorted(glob.glob(pattern, recursive=True)) if glob.has_magic(pattern) else [pattern]
        if not matches:
            raise UserError(f"{flag} {pattern!r} matched no file; check the path (and quote globs).")
        for match in matches:
            path = Path(match)
            if not path.is_file():
                raise UserError(f"{flag} {match} does not exist or is not a file.")
            if path.stat().st_size == 0:
                raise UserError(f"{flag} {match} is empty; remove it from {flag} or give a file with data.")
            files.append(str(path))
    return files


def file_type(files: list[str], flag: str) -> str:
    """The `datasets` builder for `files`: text, csv or json (all files of one type)."""
    kinds = set()
    for file in files:
        suffix = Path(file).suffix.lower()
        if suffix not in FILE_TYPES:
            raise UserError(
                f"{flag} {file} has the extension {suffix or '(none)'!r}; use .txt, .csv, .tsv, .json or .jsonl."
            )
        kinds.add(FILE_TYPES[suffix])
    if len(kinds) > 1:
        raise UserError(f"{flag} mixes file types {sorted(kinds)}; give files of one type.")
    separated = {Path(file).suffix.lower() for file in files} & {".csv", ".tsv"}
    if len(separated) > 1:  # one reader reads them all, with one separator
        raise UserError(f"{flag} mixes .csv (comma-separated) and .tsv (tab-separated) files; give files of one kind.")
    return kinds.pop()


def add_text_arguments(parser):
    """The data flags of the scripts that read training text only (the tokenizer and the word embeddings)."""
    parser.add_argument("--train_file", nargs="+", help="Text, csv, tsv, json or jsonl files; globs work.")
    parser.add_argument("--validation_file", nargs="+", help=argparse.SUPPRESS)  # accepted, never trained on
    parser.add_argument("--dataset_name", help="A dataset on the Hugging Face hub (needs a network).")
    parser.add_argument("--dataset_config_name")
    parser.add_argument("--text_column_name", help="Column holding the text in csv/json data (default: 'text').")
    parser.add_argument("--encoding", default="utf-8")
    parser.add_argument("--max_train_samples", type=int, help="Train on at most this many lines.")


def training_texts(args, streaming: bool = False) -> Iterator[str]:
    """The text column of the training split (at most --max_train_samples rows), read lazily when streaming."""
    train = load_splits(args, streaming=streaming)["train"]
    column = pick_column(list(train.column_names or ["text"]), args.text_column_name,
                         ("text", "sentence", "content"), "--text_column_name", "text")
    rows = (row[column] for row in train) if streaming else iter(train[column])
    return itertools.islice(rows, args.max_train_samples)


def load_hub_dataset(args, streaming: bool) -> DatasetDict | IterableDatasetDict:
    """--dataset_name (and --dataset_config_name) from the hub, or one sentence saying why not and what to give
    instead; a name that is a local folder or loading script loads as `datasets` loads it."""
    name = args.dataset_name + (f" ({args.dataset_config_name})" if args.dataset_config_name else "")
    try:
        return load_dataset(args.dataset_name, args.dataset_config_name, streaming=streaming,
                            trust_remote_code=getattr(args, "trust_remote_code", False) or None)
    except (ConnectionError, DatasetNotFoundError) as error:
        reason = one_line(error)
        raise UserError(
            f"Could not load --dataset_name {name}: {reason}. Check the name and the network (the hub is "
            "unreachable when HF_DATASETS_OFFLINE or HF_HUB_OFFLINE is set), or give local files with "
            "--train_file and --validation_file."
        ) from None


def load_splits(args, streaming: bool = False) -> DatasetDict | IterableDatasetDict:
    """`train` (and `validation` when given) from --dataset_name or --train_file/--validation_file."""
    if args.dataset_name:
        return load_hub_dataset(args, streaming)
    data_files, builder, options = local_files(args)
    all_files = [file for files in data_files.values() for file in files]
    check_encoding(all_files, args.encoding)
    try:
        return load_dataset(builder, data_files=data_files, streaming=streaming, **options)
    except datasets.exceptions.DatasetGenerationError as error:
        cause = error.__cause__ or error
        if "column names don't match" in str(cause):
            columns = "; ".join(f"{f} has {file_columns(f, builder, options)}" for f in all_files)
            raise UserError(f"The data files do not all have the same columns ({columns}); give every file the "
                            "same column names.") from error
        raise UserError(f"Could not read {', '.join(all_files)} as {builder}: {cause}") from error


def local_files(args) -> tuple[dict[str, list[str]], str, dict]:
    """The files of each split (--train_file, --validation_file), their `datasets` builder and its options."""
    train_files = expand_files(args.train_file, "--train_file")
    if not train_files:
        raise UserError("Give training data with --train_file (local files) or --dataset_name (a hub dataset).")
    data_files = {"train": train_files}
    validation_files = expand_files(args.validation_file, "--validation_file")
    if validation_files:
        data_files["validation"] = validation_files
    all_files = train_files + validation_files
    builder = file_type(all_files, "--train_file/--validation_file")
    options = {"encoding": args.encoding}
    if builder == "csv" and all(f.lower().endswith(".tsv") for f in all_files):
        options["sep"] = "\t"
    return data_files, builder, options


@dataclass(frozen=True)
class FileRows:
    """The local files a split was read from, in order, so that a message about a bad row can name its file and its
    row there even when the split is several files."""

    files: tuple[str, ...]
    builder: str
    options: tuple[tuple[str, str], ...]

    def place(self, row: int) -> tuple[str, int]:
        """The file of `row` (0-based, in the split) and its row there (1-based)."""
        *earlier, last = self.files
        for file in earlier:
            count = _rows_in(file, self.builder, self.options)
            if row < count:
                return file, row + 1
            row -= count
        return last, row + 1


def split_files(args) -> dict[str, FileRows]:
    """FileRows for each split of --train_file / --validation_file; empty for --dataset_name."""
    if args.dataset_name:
        return {}
    data_files, builder, options = local_files(args)
    return {name: FileRows(tuple(files), builder, tuple(sorted(options.items()))) for name, files in data_files.items()}


@functools.cache
def _rows_in(file: str, builder: str, options: tuple[tuple[str, str], ...]) -> int:
    """How many rows `datasets` reads from `file` alone (a second read, made only to name a bad row's file)."""
    shown = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    try:
        return load_dataset(builder, data_files={"train": [file]}, split="train", **dict(options)).num_rows
    finally:
        if shown:
            datasets.enable_progress_bars()


def file_columns(file: str, builder: str, options: dict) -> list[str]:
    """The column names of a csv/tsv file (its header) or a json/jsonl file (the keys of its first record)."""
    import csv
    import json

    with open(file, encoding=options.get("encoding", "utf-8")) as handle:
        if builder == "csv":
            return next(csv.reader(handle, delimiter=options.get("sep", ",")), [])
        text = handle.read()
    try:
        document = json.loads(text)
    except json.JSONDecodeError:
        document = json.loads(next(line for line in text.splitlines() if line.strip()))
    record = document[0] if isinstance(document, list) and document else document
    return list(record) if isinstance(record, dict) else []


def check_encoding(files: list[str], encoding: str, sample_bytes: int = 64 << 20):
    """Fail early, naming the file and line, when a file is not in `encoding` (the first 64 MiB are checked)."""
    for file in files:
        with open(file, "rb") as handle:
            data = handle.read(sample_bytes)
        try:
            data.decode(encoding)
        except UnicodeDecodeError as error:
            if error.start >= len(data) - 4 and len(data) == sample_bytes:
                continue  # a multi-byte character cut by the sample's end
            line = data.count(b"\n", 0, error.start) + 1
            raise UserError(
                f"{file} line {line} is not valid {encoding} (byte 0x{data[error.start]:02x}); pass --encoding with "
                "the file's encoding (e.g. latin-1) or convert the file to UTF-8."
            ) from None
        except LookupError:
            raise UserError(f"--encoding {encoding!r} is not an encoding Python knows.") from None


def pick_column(column_names: list[str], requested: str | None, preferred: tuple[str, ...], flag: str, role: str) -> str:
    """The column named by `flag`, else the first of `preferred` present; errors list the columns there are."""
    if requested:
        if requested not in column_names:
            raise UserError(f"{flag} {requested!r} is not a column of the data; its columns are {column_names}.")
        return requested
    for name in preferred:
        if name in column_names:
            return name
    raise UserError(f"Found no {role} column among {column_names}; name it with {flag}.")


def hold_out_validation(splits: DatasetDict, percentage: float, seed: int) -> tuple[DatasetDict, dict[str, list[int]]]:
    """Split `percentage`% of `train` off as `validation` when the data has no validation split, drawn as
    `Dataset.train_test_split(seed=seed)` draws them. Also returns, for messages that name a row, the row in the
    training data of each row of a split made so (empty when the data had its validation split)."""
    if "validation" in splits:
        return splits, {}
    if not 0 < percentage < 100:
        raise UserError(f"--validation_split_percentage must be in (0, 100), got {percentage}.")
    rows = len(splits["train"])
    held = math.ceil(rows * percentage / 100)
    if rows < 2 or held >= rows:
        raise UserError(
            f"The training data has {rows} row{'s' if rows != 1 else ''}, too few to hold out "
            f"{percentage:g}% for validation; give --validation_file, or more data."
        )
    order = np.random.default_rng(seed).permutation(rows)
    source = {"train": order[held:].tolist(), "validation": order[:held].tolist()}
    return DatasetDict({name: splits["train"].select(indices) for name, indices in source.items()}), source
