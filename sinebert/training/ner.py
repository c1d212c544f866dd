"""Named-entity recognition data and evaluation: CoNLL-style column files read directly, json / jsonl files or hub
datasets through `datasets`; IOB1 or IOB2 tags, trained and scored as IOB2; word labels aligned to sub-tokens.

CoNLL files: one token per line, whitespace-separated columns (token and tag columns chosen by index), blank or
whitespace-only lines between sentences, `-DOCSTART-` lines between documents.

With document context, each row holds as many consecutive sentences of one document as fit in the length limit, every
word labelled: a word is tagged seeing its neighbouring sentences (the full name of a person mentioned by surname, the
team of a score line) for about the same tokens per epoch as one sentence per row.
"""

import random
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from datasets import ClassLabel, Sequence

from ..tagging import best_tag_path, iob2_transitions
from .data import FileRows, check_encoding, expand_files, load_splits, pick_column, split_files
from .errors import UserError
from .finetune import Evaluation, write_jsonl
from .metrics.seqeval_strict import compute_entities

CONLL_SUFFIXES = (".txt", ".conll", ".iob", ".iob1", ".iob2", ".bio", ".tsv")
DATASET_SUFFIXES = (".json", ".jsonl")
SCHEMES = ("IOB2", "IOB1")


@dataclass
class Sentence:
    tokens: list[str]
    tags: list[str]
    origin: str  # where it came from, for error messages: "FILE line N", "FILE row N" or "training row N"
    # Consecutive sentences of one document share it; document context never crosses from one document to the next.
    document: str = ""


# ----- reading -----


def read_conll(path: str, token_column: int, tag_column: int, encoding: str = "utf-8") -> list[Sentence]:
    """Sentences of a CoNLL-style file; every token line must have as many columns as the file's first one. A file
    without `-DOCSTART-` lines is one document."""
    sentences, tokens, tags, start, width, document = [], [], [], 0, None, f"{path} line 1"

    def flush():
        if tokens:
            sentences.append(Sentence(list(tokens), list(tags), f"{path} line {start}", document))
            tokens.clear()
            tags.clear()

    with open(path, encoding=encoding) as file:
        for number, line in enumerate(file, 1):
            fields = line.split()
            if not fields or fields[0] == "-DOCSTART-":
                flush()
                document = f"{path} line {number}" if fields else document
                continue
            if width is None:
                width = len(fields)
                for flag, index in (("--conll_token_column", token_column), ("--conll_tag_column", tag_column)):
                    if not -width <= index < width:
                        raise UserError(f"{flag} {index} is outside the {width} columns of {path} line {number}.")
            if len(fields) != width:
                raise UserError(
                    f"{path} line {number} has {len(fields)} columns where the file's first token line has {width}; "
                    "every token line needs the same whitespace-separated columns."
                )
            if not tokens:
                start = number
            tokens.append(fields[token_column])
            tags.append(fields[tag_column])
    flush()
    if not sentences:
        raise UserError(f"{path} holds no token lines; is it a CoNLL-style file (token ... tag per line)?")
    return sentences


def _records_to_sentences(split, label: str, token_column: str, tag_column: str, files: FileRows | None
                          ) -> list[Sentence]:
    """The rows in order as one running text, or for several files one text per file."""
    feature = split.features[tag_column]
    names = feature.feature.names if isinstance(feature, Sequence) and isinstance(feature.feature, ClassLabel) else None
    sentences = []
    for row, (tokens, tags) in enumerate(zip(split[token_column], split[tag_column])):
        if files is None:
            origin, document = f"{label} row {row + 1}", label
        else:
            document, row_there = files.place(row)
            origin = f"{document} row {row_there}"
        if not isinstance(tokens, list) or not isinstance(tags, list) or len(tokens) != len(tags):
            raise UserError(f"{origin}: {token_column!r} and {tag_column!r} need lists of tokens and tags of equal "
                            "length.")
        if names is not None:
            tags = [names[t] for t in tags]
        elif any(not isinstance(t, str) for t in tags):
            raise UserError(f"{origin}: the tags in {tag_column!r} are not strings like 'B-PER', and the data has no "
                            "ClassLabel names for them.")
        sentences.append(Sentence(list(tokens), list(tags), origin, document))
    return sentences


def load_ner_sentences(args) -> dict[str, list[Sentence]]:
    """train and validation sentences from CoNLL-style files, json / jsonl files or --dataset_name."""
    files = expand_files(args.train_file, "--train_file") + expand_files(args.validation_file, "--validation_file")
    suffixes = {Path(f).suffix.lower() for f in files}
    if args.dataset_name or (suffixes and suffixes <= set(DATASET_SUFFIXES)):
        return _load_records(args)
    if not files:
        raise UserError("Give training data with --train_file (local files) or --dataset_name (a hub dataset).")
    unknown = suffixes - set(CONLL_SUFFIXES)
    if unknown:
        raise UserError(
            f"--train_file/--validation_file have the extensions {sorted(unknown)}; give CoNLL-style files "
            f"({', '.join(CONLL_SUFFIXES)}) or json / jsonl files, not a mix."
        )
    check_encoding(files, args.encoding)
    splits = {
        "train": _read_conll_files(args.train_file, "--train_file", args),
        "validation": _read_conll_files(args.validation_file, "--validation_file", args),
    }
    return _with_validation(splits, args)


def _read_conll_files(patterns: list[str] | None, flag: str, args) -> list[Sentence]:
    return [
        sentence
        for path in expand_files(patterns, flag)
        for sentence in read_conll(path, args.conll_token_column, args.conll_tag_column, args.encoding)
    ]


def _load_records(args) -> dict[str, list[Sentence]]:
    splits, files = load_splits(args), split_files(args)
    columns = list(splits["train"].column_names)
    token_column = pick_column(columns, args.text_column_name, ("tokens", "words"), "--text_column_name", "token")
    tag_column = pick_column(columns, args.label_column_name, ("ner_tags", "tags", "labels"), "--label_column_name",
                             "tag")
    sentences = {}
    for name in ("train", "validation"):
        if name not in splits:
            continue
        present = list(splits[name].column_names)
        for column in (token_column, tag_column):
            if column not in present:
                raise UserError(f"The {name} data has no column {column!r} (found in the training data); its columns "
                                f"are {present}.")
        label = "training" if name == "train" else name
        sentences[name] = _records_to_sentences(splits[name], label, token_column, tag_column, files.get(name))
    return _with_validation(sentences, args)


def _with_validation(splits: dict[str, list[Sentence]], args) -> dict[str, list[Sentence]]:
    """Hold out --validation_split_percentage of the training sentences when no validation data was given."""
    if splits.get("validation"):
        return splits
    if not 0 < args.validation_split_percentage < 100:
        raise UserError(f"--validation_split_percentage must be in (0, 100), got {args.validation_split_percentage}.")
    order = list(range(len(splits["train"])))
    random.Random(args.seed).shuffle(order)
    held = max(1, round(len(order) * args.validation_split_percentage / 100))
    return {
        "train": _consecutive(splits["train"], sorted(order[held:]), "training"),
        "validation": _consecutive(splits["train"], sorted(order[:held]), "held-out"),
    }


def _consecutive(sentences: list[Sentence], indices: list[int], part: str) -> list[Sentence]:
    """sentences[i] for the ascending `indices`, a new document wherever a sentence's predecessor went to the other
    part: a held-out sentence is never a training sentence's context, nor the other way round."""
    picked, document = [], ""
    for k, i in enumerate(indices):
        if k == 0 or indices[k - 1] != i - 1 or sentences[i].document != sentences[i - 1].document:
            document = f"{part} part of {sentences[i].document} from {sentences[i].origin}"
        picked.append(replace(sentences[i], document=document))
    return picked


# ----- tags -----


def to_iob2(sentence: Sentence, scheme: str) -> Sentence:
    """The sentence with IOB2 tags: IOB1 is converted (an I-X that starts an entity becomes B-X); IOB2 is checked."""
    tags, previous = [], "O"
    for position, tag in enumerate(sentence.tags):
        if tag != "O" and (tag[:2] not in ("B-", "I-") or len(tag) < 3):
            raise UserError(f"{sentence.origin}: the tag {tag!r} (token {position + 1}) is not O, B-TYPE or I-TYPE; "
                            "only IOB1 and IOB2 tags are supported.")
        starts = tag.startswith("I-") and (previous == "O" or previous[2:] != tag[2:])
        if starts and scheme == "IOB2":
            raise UserError(
                f"{sentence.origin}: the tag {tag} (token {position + 1}) follows {previous}, which IOB2 does not "
                "allow; if the data is IOB1 pass --label_scheme IOB1."
            )
        tag = "B-" + tag[2:] if starts else tag
        tags.append(tag)
        previous = tag
    return replace(sentence, tags=tags)


def tag_names(train: list[Sentence]) -> list[str]:
    """O, then B-X and I-X for every entity type X of the training data (I-X even if only single-token X occur)."""
    types = sorted({tag[2:] for sentence in train for tag in sentence.tags if tag != "O"})
    if not types:
        raise UserError("The training data has no entity at all (every tag is O); there is nothing to learn.")
    return ["O"] + [f"{prefix}-{kind}" for kind in types for prefix in ("B", "I")]


def check_known_types(sentences: list[Sentence], names: list[str], split: str):
    known = set(names)
    for sentence in sentences:
        for tag in sentence.tags:
            if tag not in known:
                types = sorted({name[2:] for name in names if name != "O"})
                raise UserError(
                    f"The {split} data has the entity type {tag[2:]!r} ({sentence.origin}) that the training data "
                    f"never has; the training types are {types}. Remove it or add examples of it to the training data."
                )


# ----- tokens -----


def context_groups(sentences: list[Sentence], lengths: list[int], budget: int) -> list[list[int]]:
    """The sentences of each row: consecutive sentences of one document while their `lengths` (tokens, no special
    ones) add up to at most `budget`; a sentence longer than that gets a row of its own (and is cut there)."""
    groups, used = [], 0
    for i, (sentence, length) in enumerate(zip(sentences, lengths)):
        if groups and sentences[groups[-1][-1]].document == sentence.document and used + length <= budget:
            groups[-1].append(i)
            used += length
        else:
            groups.append([i])
            used = length
    return groups


def encode_sentences(sentences: list[Sentence], tokenizer, names: list[str], max_length: int, label_all_tokens: bool,
                     context: bool = False) -> tuple[list[dict], list[tuple[int, list[int | None]]]]:
    """Rows of token ids with one label per sub-token, one sentence per row or, with `context`, as many of a
    document's consecutive sentences as fit in `max_length` (`context_groups`); and per sentence its row and the
    position there of each of its words' first sub-token (None for a word cut off by `max_length` or without any
    token).

    The first sub-token of a word carries its tag; later sub-tokens carry -100 (not trained), or with
    `label_all_tokens` the tag too, B-X turned into I-X since they continue the entity.
    """
    groups = [[i] for i in range(len(sentences))]
    if context:
        pieces = tokenizer([s.tokens for s in sentences], is_split_into_words=True, add_special_tokens=False)
        lengths = [len(ids) for ids in pieces["input_ids"]]
        groups = context_groups(sentences, lengths, max_length - tokenizer.num_special_tokens_to_add())
    ids = {name: i for i, name in enumerate(names)}
    encoding = tokenizer([[word for i in group for word in sentences[i].tokens] for group in groups],
                         is_split_into_words=True, truncation=True, max_length=max_length)
    inputs = [name for name in tokenizer.model_input_names if name in encoding]
    rows, places = [], []
    for row, group in enumerate(groups):
        tags = [tag for i in group for tag in sentences[i].tags]
        labels, first, previous = [], [None] * len(tags), None
        for position, word in enumerate(encoding.word_ids(row)):
            if word is None:
                labels.append(-100)
            elif word != previous:
                labels.append(ids[tags[word]])
                first[word] = position
            else:
                tag = tags[word]
                labels.append(ids["I-" + tag[2:] if tag.startswith("B-") else tag] if label_all_tokens else -100)
            previous = word
        rows.append({**{name: encoding[name][row] for name in inputs}, "labels": labels})
        for i in group:  # the group's words are its sentences' words in order
            places.append((row, first[: len(sentences[i].tokens)]))
            first = first[len(sentences[i].tokens):]
    return rows, places


def labelled_token_count(batch: dict) -> int:
    return int((batch["labels"] != -100).sum())


@dataclass
class NerData:
    names: list[str]
    train_rows: list[dict]
    eval_rows: list[dict]
    eval_sentences: list[Sentence]
    eval_places: list[tuple[int, list[int | None]]]  # per validation sentence: its row, its words' first sub-tokens
    train_sentences: int


def load_ner_data(args, tokenizer, print_fn=print) -> NerData:
    splits = load_ner_sentences(args)
    train = [to_iob2(s, args.label_scheme) for s in splits["train"][: args.max_train_samples]]
    validation = [to_iob2(s, args.label_scheme) for s in splits["validation"][: args.max_eval_samples]]
    names = tag_names(train)
    check_known_types(validation, names, "validation")
    context = args.document_context
    train_rows, _ = encode_sentences(train, tokenizer, names, args.max_length, args.label_all_tokens, context)
    eval_rows, places = encode_sentences(validation, tokenizer, names, args.max_length, args.label_all_tokens, context)
    cut = sum(1 for row, first in places if len(eval_rows[row]["input_ids"]) >= args.max_length and None in first)
    if cut:
        print_fn(f"{cut} validation sentences are longer than --max_length {args.max_length} tokens; their words past "
                 "it are predicted O and scored as such.")
    return NerData(names, train_rows, eval_rows, validation, places, len(train))


# ----- evaluation -----


def word_tags(log_probs: torch.Tensor, first: list[int | None], names: list[str]) -> list[str]:
    """A sentence's word tags: the best well-formed IOB2 sequence over the words' first sub-tokens, as
    `IOB2TaggingPipeline` serves them. log_probs: `(seq, tags)`; first: per word its first sub-token's position
    (None for a word cut off by the length limit or without any token: tagged O)."""
    positions = [p for p in first if p is not None]
    path = iter(best_tag_path(log_probs[positions], *iob2_transitions(tuple(names))))
    return [names[next(path)] if p is not None else "O" for p in first]


class NerEvaluation(Evaluation):
    """Entity-level precision/recall/F1 (strict IOB2, overall and per type), token accuracy and the validation loss,
    over words: each word is tagged from the prediction at its first sub-token (`word_tags`)."""

    main_metric, greater_is_better, plot_metrics = "eval_f1", True, ("eval_f1", "eval_accuracy")

    def __init__(self, dataloader, accelerator, data: NerData):
        super().__init__(dataloader, accelerator)
        self.data = data

    def outputs(self, batch, output):
        logits = output.logits.float()  # (batch, seq, tags)
        labels = batch["labels"]
        token_loss = F.cross_entropy(logits.transpose(1, 2), labels, ignore_index=-100, reduction="none")
        return {
            "log_probs": logits.log_softmax(-1),  # (batch, seq, tags)
            "loss_sum": token_loss.sum(-1),  # (batch,)
            "loss_terms": (labels != -100).sum(-1),  # (batch,)
        }

    def score(self, rows):
        predictions = [word_tags(rows[row]["log_probs"], first, self.data.names)
                       for row, first in self.data.eval_places]
        gold = [sentence.tags for sentence in self.data.eval_sentences]
        entities = compute_entities(predictions, gold)
        loss = sum(float(row["loss_sum"]) for row in rows) / max(1, sum(int(row["loss_terms"]) for row in rows))
        metrics = {
            "loss": loss, "precision": entities["overall_precision"], "recall": entities["overall_recall"],
            "f1": entities["overall_f1"], "accuracy": entities["overall_accuracy"], "per_type": entities["per_type"],
        }
        return predictions, metrics

    def write(self, output_dir: Path):
        """eval_predictions.jsonl: per validation sentence its tokens, gold IOB2 tags and predicted tags."""
        write_jsonl(output_dir / "eval_predictions.jsonl", [
            {"index": i, "tokens": s.tokens, "labels": s.tags, "predictions": p}
            for i, (s, p) in enumerate(zip(self.data.eval_sentences, self.predictions))
        ])


def model_card(args, data: NerData) -> dict:
    types = sorted({name[2:] for name in data.names if name != "O"})
    return {
        "title": "sinebert fine-tuned for named-entity recognition",
        "summary": f"A sinebert encoder fine-tuned by `scripts/finetune_ner.py` to tag the entity types "
                   f"{', '.join(types)} (IOB2 tags). The scores below are of each sentence's most probable "
                   "well-formed tag sequence; with sinebert installed, `pipeline(..., "
                   "pipeline_class=sinebert.IOB2TaggingPipeline)` serves those tags, where the plain pipeline "
                   "below takes each word's most probable tag.",
        "pipeline_tag": "token-classification",
        "pipeline_kwargs": ', aggregation_strategy="first"',
        "call": 'pipe("Ada Lovelace was born in London .")',
        "details": {
            "tags": ", ".join(data.names),
            "label alignment": "every sub-token" if args.label_all_tokens else "first sub-token of each word",
            "examples": f"{data.train_sentences} training, {len(data.eval_sentences)} validation sentences",
            "context": f"up to {args.max_length} tokens of each sentence's document" if args.document_context
            else "none (one sentence per row)",
        },
    }

