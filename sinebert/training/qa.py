"""Extractive question answering data and evaluation: SQuAD v1.1 / v2.0 JSON read directly, its flattened
json / jsonl form (columns id, title, context, question, answers{text, answer_start}) and hub datasets.

Long contexts are split into overlapping windows (`--doc_stride`) by the same function the
`question-answering` pipeline uses, and answers are extracted by the pipeline's own `extract_answers`,
so the pipeline serving the saved model answers exactly as this evaluation scored it.
"""

import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from ..pipeline_sinebert import context_token_mask, extract_answers, tokenize_windows
from .data import expand_files, load_splits, pick_column
from .errors import UserError
from .finetune import Evaluation
from .metrics.squad import compute_squad


@dataclass
class QAExample:
    id: str
    question: str
    context: str
    answers: list[str]  # empty for an unanswerable question
    starts: list[int]  # character offset of each answer in `context`


# ----- reading -----


def read_squad_json(path: str, encoding: str = "utf-8") -> list[dict] | None:
    """The questions of a SQuAD-format JSON file ({"data": [{"paragraphs": [{"context", "qas"}]}]}) as flat records,
    or None when the file is not in that format (e.g. JSON lines)."""
    try:
        with open(path, encoding=encoding) as file:
            document = json.load(file)
    except json.JSONDecodeError:
        return None
    if not isinstance(document, dict) or not isinstance(document.get("data"), list):
        return None
    try:
        return [
            {"id": str(qa["id"]), "title": article.get("title", ""), "context": paragraph["context"],
             "question": qa["question"], "answers": _flat_answers(qa.get("answers", []))}
            for article in document["data"]
            for paragraph in article["paragraphs"]
            for qa in paragraph["qas"]
        ]
    except (KeyError, TypeError, AttributeError) as error:
        raise UserError(f"{path} looks like SQuAD JSON but lacks the field {error} somewhere; each article needs "
                        "'paragraphs', each paragraph 'context' and 'qas', each question 'id' and 'question'.") from None


def _flat_answers(answers: list[dict]) -> dict:
    """SQuAD JSON answers [{text, answer_start}] in the flattened form {text: [...], answer_start: [...]}."""
    return {"text": [a["text"] for a in answers], "answer_start": [a["answer_start"] for a in answers]}


def load_qa_records(args) -> dict[str, list[dict]]:
    """train and validation records from SQuAD JSON files, json / jsonl files or --dataset_name."""
    if args.dataset_name:
        return _records_from_datasets(load_splits(args), args)
    if not args.validation_file:
        raise UserError("Question answering needs validation data with other contexts than the training data: give "
                        "--validation_file.")
    splits = {}
    for name, flag, patterns in (("train", "--train_file", args.train_file),
                                 ("validation", "--validation_file", args.validation_file)):
        files = expand_files(patterns, flag)
        parsed = [read_squad_json(f, args.encoding) if f.lower().endswith(".json") else None for f in files]
        if files and all(records is not None for records in parsed):
            splits[name] = [record for records in parsed for record in records]
        elif any(records is not None for records in parsed):
            raise UserError(f"{flag} mixes SQuAD-format JSON with other files; give files of one kind.")
    if len(splits) == 2:
        return splits
    if splits:
        raise UserError("Give the training and validation data in the same form: both SQuAD JSON or both json / "
                        "jsonl.")
    return _records_from_datasets(load_splits(args), args)


def _records_from_datasets(splits, args) -> dict[str, list[dict]]:
    if "validation" not in splits:
        raise UserError("Question answering needs validation data: give --validation_file (or a hub dataset with a "
                        "validation split).")
    columns = list(splits["train"].column_names)
    chosen = {
        "question": pick_column(columns, args.question_column_name, ("question",), "--question_column_name",
                                "question"),
        "context": pick_column(columns, args.context_column_name, ("context",), "--context_column_name", "context"),
        "answers": pick_column(columns, args.answer_column_name, ("answers",), "--answer_column_name", "answers"),
    }
    records = {}
    for name in ("train", "validation"):
        present = list(splits[name].column_names)
        for role, column in chosen.items():
            if column not in present:
                raise UserError(f"The {name} data has no column {column!r} (the {role} column of the training data); "
                                f"its columns are {present}.")
        ids = splits[name]["id"] if "id" in present else [str(i) for i in range(len(splits[name]))]
        records[name] = [
            {"id": str(key), "question": q, "context": c, "answers": a}
            for key, q, c, a in zip(ids, splits[name][chosen["question"]], splits[name][chosen["context"]],
                                    splits[name][chosen["answers"]])
        ]
    return records


def to_examples(records: list[dict], split: str, allow_unanswerable: bool) -> list[QAExample]:
    """Checked examples: every answer must be found in its context at its answer_start."""
    examples, seen = [], set()
    for record in records:
        key, question, context = record["id"], record["question"], record["context"]
        if key in seen:
            raise UserError(f"The question id {key!r} occurs twice in the {split} data; ids must be unique.")
        seen.add(key)
        if not isinstance(question, str) or not question.strip() or not isinstance(context, str) or not context:
            raise UserError(f"Question {key!r} in the {split} data has an empty question or context.")
        texts, starts = _answer_lists(record["answers"])
        if len(texts) != len(starts):
            raise UserError(f"Question {key!r} in the {split} data has {len(texts)} answer texts but {len(starts)} "
                            "answer_start values.")
        if not texts and not allow_unanswerable:
            raise UserError(f"Question {key!r} in the {split} data has no answer; pass --version_2_with_negative for "
                            "SQuAD v2-style data with unanswerable questions.")
        for text, start in zip(texts, starts):
            if not text or context[start : start + len(text)] != text:
                raise UserError(
                    f"The answer {text!r} of question {key!r} in the {split} data does not match its context at "
                    f"answer_start {start} (the context there reads {context[start : start + len(text)]!r}); fix "
                    "answer_start or the answer text."
                )
        examples.append(QAExample(key, question, context, texts, starts))
    return examples


def _answer_lists(answers) -> tuple[list[str], list[int]]:
    """Answer texts and starts from {"text": [...], "answer_start": [...]} (SQuAD flattened, as on the hub) or
    [{"text", "answer_start"}, ...] (as in SQuAD JSON)."""
    if isinstance(answers, list):
        return [a["text"] for a in answers], [int(a["answer_start"]) for a in answers]
    answers = answers or {}
    return list(answers.get("text", [])), [int(start) for start in answers.get("answer_start", [])]


# ----- windows -----


@dataclass
class Window:
    """What evaluation needs of one window besides its logits."""

    example: int  # index of its example
    offsets: list[tuple[int, int]]  # (seq, 2) character offsets into the context
    context_mask: list[bool]  # (seq,)


def answer_token_span(offsets, context_mask: list[bool], start_char: int, end_char: int) -> tuple[int, int]:
    """Token indices (start, end) of the answer characters [start_char, end_char) in one window, or (0, 0), the
    [CLS] token, when the window does not contain the whole answer."""
    context = [i for i, inside in enumerate(context_mask) if inside]
    if not context or offsets[context[0]][0] > start_char or offsets[context[-1]][1] < end_char:
        return 0, 0
    start = max(i for i in context if offsets[i][0] <= start_char)
    end = min(i for i in context if offsets[i][1] >= end_char)
    return start, end


def check_window_room(examples: list[QAExample], tokenizer, max_length: int, doc_stride: int):
    """Every question must leave room for new context in each window, as the pipeline also requires.

    Windows may be longer than the tokenizer's model_max_length: sinusoidal positions have no length limit (use a
    --sliding_window model for long windows, e.g. a whole paragraph without doc_stride splits)."""
    lengths = tokenizer([e.question for e in examples], add_special_tokens=False)["input_ids"]
    for example, ids in zip(examples, lengths):
        if doc_stride >= max_length - len(ids) - 3:
            raise UserError(
                f"Question {example.id!r} has {len(ids)} tokens, which with --doc_stride {doc_stride} leaves no room "
                f"for new context in windows of --max_seq_length {max_length}; lower --doc_stride or raise "
                "--max_seq_length."
            )


def encode_examples(examples: list[QAExample], tokenizer, max_length: int, doc_stride: int):
    """Rows of token ids, one per window, with start/end_positions of the first answer; and each window's Window."""
    encoding = tokenize_windows(
        tokenizer, [e.question for e in examples], [e.context for e in examples], max_length, doc_stride
    )
    inputs = [name for name in tokenizer.model_input_names if name in encoding]
    rows, windows = [], []
    for w, example_index in enumerate(encoding["overflow_to_sample_mapping"]):
        example = examples[example_index]
        mask = context_token_mask(tokenizer, encoding, w)
        offsets = [tuple(pair) for pair in encoding["offset_mapping"][w]]
        start, end = 0, 0
        if example.answers:
            first = example.starts[0]
            start, end = answer_token_span(offsets, mask, first, first + len(example.answers[0]))
        rows.append({**{name: encoding[name][w] for name in inputs}, "start_positions": start, "end_positions": end})
        windows.append(Window(example_index, offsets, mask))
    return rows, windows


def answer_windows(rows: list[dict], windows: list[Window], examples: list[QAExample]) -> list[dict]:
    """The rows of the windows that hold their question's answer, and every row of a question without one.

    The other windows of an answered question are labelled [CLS], which evaluation under SQuAD v1.1 never predicts;
    with 128-token windows they are half of squad_train's (10,197 of 21,156), and leaving them out came within a
    point of the squad_eval F1 of all windows in half the steps (docs/QUALITY.md)."""
    return [row for row, window in zip(rows, windows)
            if row["start_positions"] != 0 or not examples[window.example].answers]


def window_count(batch: dict) -> int:
    return int(batch["start_positions"].numel())


@dataclass
class QAData:
    train_rows: list[dict]
    eval_rows: list[dict]
    eval_examples: list[QAExample]
    eval_windows: list[Window]


def load_qa_data(args, tokenizer) -> QAData:
    records = load_qa_records(args)
    train = to_examples(records["train"][: args.max_train_samples], "training", args.version_2_with_negative)
    validation = to_examples(records["validation"][: args.max_eval_samples], "validation",
                             args.version_2_with_negative)
    for name, examples in (("training", train), ("validation", validation)):
        if not examples:
            raise UserError(f"The {name} data holds no question; check the files and their format.")
    check_window_room(train + validation, tokenizer, args.max_length, args.doc_stride)
    train_rows, train_windows = encode_examples(train, tokenizer, args.max_length, args.doc_stride)
    if args.train_answer_windows_only:
        train_rows = answer_windows(train_rows, train_windows, train)
    eval_rows, windows = encode_examples(validation, tokenizer, args.max_length, args.doc_stride)
    return QAData(train_rows, eval_rows, validation, windows)


# ----- evaluation -----


class QAEvaluation(Evaluation):
    """Exact match and F1 (official SQuAD normalisation) of the best answer per question, found by the pipeline's
    `extract_answers` over all windows of the question; plus the validation loss over windows."""

    main_metric, greater_is_better, plot_metrics = "eval_f1", True, ("eval_f1", "eval_exact_match")

    def __init__(self, dataloader, accelerator, data: QAData, n_best_size: int, max_answer_length: int,
                 allow_unanswerable: bool):
        super().__init__(dataloader, accelerator)
        self.data, self.n_best_size, self.max_answer_length = data, n_best_size, max_answer_length
        self.allow_unanswerable = allow_unanswerable
        self.nbest = None  # {id: [n best answers]} of the latest evaluation

    def outputs(self, batch, output):
        start, end = output.start_logits.float(), output.end_logits.float()  # (batch, seq) each
        loss = (F.cross_entropy(start, batch["start_positions"], reduction="none")
                + F.cross_entropy(end, batch["end_positions"], reduction="none")) / 2
        return {"start_logits": start, "end_logits": end, "loss": loss}

    def score(self, rows):
        by_example = defaultdict(list)
        for row, window in zip(rows, self.data.eval_windows):
            length = len(window.offsets)  # the gathered logits may end in padding
            by_example[window.example].append({
                "start_logits": row["start_logits"][:length], "end_logits": row["end_logits"][:length],
                "offsets": window.offsets, "context_mask": torch.tensor(window.context_mask),
            })
        predictions, self.nbest = {}, {}
        for index, example in enumerate(self.data.eval_examples):
            answers = extract_answers(
                by_example[index], example.context, self.n_best_size, self.max_answer_length, self.allow_unanswerable
            )
            predictions[example.id] = answers[0]["answer"] if answers else ""
            self.nbest[example.id] = answers
        metrics = compute_squad(predictions, {e.id: e.answers for e in self.data.eval_examples})
        metrics["loss"] = float(torch.stack([row["loss"] for row in rows]).mean())
        return predictions, metrics

    def write(self, output_dir: Path):
        """eval_predictions.json ({id: answer}) and eval_nbest_predictions.json ({id: [n best answers]})."""
        (output_dir / "eval_predictions.json").write_text(json.dumps(self.predictions, indent=2, ensure_ascii=False))
        (output_dir / "eval_nbest_predictions.json").write_text(json.dumps(self.nbest, indent=2, ensure_ascii=False))


def pipeline_settings(args) -> dict:
    """The pipeline parameters that answer as this run evaluates (stored in the checkpoint's config)."""
    return {"max_seq_len": args.max_length, "doc_stride": args.doc_stride, "max_answer_len": args.max_answer_length,
            "handle_impossible_answer": bool(args.version_2_with_negative)}


def model_card(args, data: QAData) -> dict:
    return {
        "title": "sinebert fine-tuned for extractive question answering",
        "summary": "A sinebert encoder fine-tuned by `scripts/finetune_qa.py` to extract answers from a context"
                   f"{' or say there is none' if args.version_2_with_negative else ''}.",
        "pipeline_tag": "question-answering",
        "call": 'pipe(question="Who wrote it?", context="It was written by Ada.")  # windows as the run evaluated',
        "details": {
            "windows": f"{args.max_length} tokens, overlapping by --doc_stride {args.doc_stride}",
            "answers": f"at most {args.max_answer_length} tokens, best of {args.n_best_size} per window",
            "examples": f"{len(data.train_rows)} training windows, {len(data.eval_examples)} validation questions",
        },
    }
