"""The demo's test-set evaluation and serving: every fine-tuned model scored on the held-out test split (which no
training or model choice has seen), and the saved models answering new sentences through `pipeline(...)`."""

import json
import time
from dataclasses import replace
from pathlib import Path

import torch
from transformers import AutoModelForSequenceClassification, AutoModelForTokenClassification, AutoTokenizer

from sinebert.training.finetune import PaddingCollator
from sinebert.training.metrics.classification import compute_classification
from sinebert.training.metrics.seqeval_strict import compute_entities
from sinebert.tagging import IOB2TaggingPipeline
from sinebert.training.ner import Sentence, encode_sentences, word_tags

from .baselines import tfidf_logistic_regression
from .stages import STARTS

BAG_OF_WORDS = "classification-tfidf"  # evaluation.json's key of the baseline the classifiers are reported beside


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]


def _batches(rows: list, size: int):
    for start in range(0, len(rows), size):
        yield rows[start : start + size]


def evaluate_classifier(model_dir: Path, test_file: Path, max_length: int, batch_size: int = 64) -> dict:
    """Accuracy, macro-F1, per-class scores and the confusion matrix on `test_file` ({'sentence', 'label'} rows),
    inputs truncated to `max_length` tokens as in training."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForSequenceClassification.from_pretrained(model_dir).eval()
    names = [model.config.id2label[i] for i in range(model.config.num_labels)]
    rows = read_jsonl(test_file)
    predictions, tokens, start = [], 0, time.perf_counter()
    with torch.no_grad():
        for batch in _batches(rows, batch_size):
            inputs = tokenizer([row["sentence"] for row in batch], truncation=True, max_length=max_length,
                               padding=True, return_tensors="pt")
            predictions += model(**inputs).logits.argmax(-1).tolist()
            tokens += int(inputs["attention_mask"].sum())
    seconds = time.perf_counter() - start
    references = [names.index(row["label"]) for row in rows]
    metrics = compute_classification(predictions, references, names)
    return {**metrics, "examples": len(rows), "seconds": seconds, "tokens_per_second": tokens / seconds}


def tagger_scores(model_dir: Path, sentences: list[Sentence], max_length: int, context: bool = False,
                  batch_size: int = 64) -> dict:
    """A saved tagger's log-probabilities over `sentences`, rows built as in training (`max_length` tokens, with
    `context` several sentences each): {names: the tags, log_probs: per row `(tokens, tags)`, places: per sentence
    its row and per word the position of its first sub-token (None past the limit), tokens, seconds}."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForTokenClassification.from_pretrained(model_dir).eval()
    names = [model.config.id2label[i] for i in range(model.config.num_labels)]
    # A tag the training split never had cannot be predicted; it stays in the gold tags but is encoded as O.
    known = [replace(s, tags=[t if t in names else "O" for t in s.tags]) for s in sentences]
    encoded, places = encode_sentences(known, tokenizer, names, max_length, label_all_tokens=False, context=context)
    collate = PaddingCollator(tokenizer.pad_token_id)
    log_probs, tokens, start = [], 0, time.perf_counter()
    with torch.no_grad():
        for batch in _batches(encoded, batch_size):
            # The tokenizer's inputs (ids, mask, token types and, for a case-reading model, case ids), padded.
            inputs = collate([{k: v for k, v in row.items() if k != "labels"} for row in batch])
            log_probs += list(model(**inputs).logits.float().log_softmax(-1))  # rows of (longest row, tags)
            tokens += int(inputs["attention_mask"].sum())
    return {"names": names, "log_probs": log_probs, "places": places, "tokens": tokens,
            "seconds": time.perf_counter() - start}


def read_tagged_jsonl(path: Path) -> list[Sentence]:
    """The sentences of {'tokens', 'ner_tags'} rows, in order, as one document."""
    return [Sentence(row["tokens"], row["ner_tags"], f"{path} line {i + 1}", str(path))
            for i, row in enumerate(read_jsonl(path))]


def evaluate_tagger(model_dir: Path, test_file: Path, max_length: int, context: bool = False,
                    batch_size: int = 64) -> dict:
    """Entity-level precision/recall/F1 (strict IOB2) on `test_file` ({'tokens', 'ner_tags'} rows in document
    order); words tagged as the training script scores them (`word_tags`: the best well-formed sequence over their
    first sub-tokens; with `context`, several sentences a row)."""
    gold = read_tagged_jsonl(test_file)
    scores = tagger_scores(model_dir, gold, max_length, context, batch_size)
    tags = [word_tags(scores["log_probs"][row], first, scores["names"]) for row, first in scores["places"]]
    entities = compute_entities(tags, [s.tags for s in gold])
    return {
        "precision": entities["overall_precision"], "recall": entities["overall_recall"], "f1": entities["overall_f1"],
        "accuracy": entities["overall_accuracy"], "per_type": entities["per_type"], "examples": len(gold),
        "seconds": scores["seconds"], "tokens_per_second": scores["tokens"] / scores["seconds"],
    }


def evaluate_bag_of_words(data: Path) -> dict:
    """TF-IDF + logistic regression trained on the classification training split, scored on its test split: what a
    classifier costing seconds reaches, the bar for the fine-tuned ones (accuracy and macro-F1 as fractions)."""
    scores = tfidf_logistic_regression(read_jsonl(data / "train.jsonl"), read_jsonl(data / "test.jsonl"))
    return {"accuracy": scores["accuracy"] / 100, "macro_f1": scores["macro_f1"] / 100, "C": scores["C"],
            "seconds": scores["seconds"]}


def evaluate_all(paths, max_lengths: dict[str, int], threads: int) -> dict:
    """Score the four fine-tuned models on their test splits (`max_lengths`: per task, as in training) with `threads`
    CPU threads, and the bag-of-words baseline on the classification split; writes and returns evaluation.json's
    content."""
    results, saved_threads = {}, torch.get_num_threads()
    # As many threads as each training process had: on a busy 2-core machine, 2 spinning threads ran 3x slower than 1.
    torch.set_num_threads(threads)
    try:
        for task, evaluate in (("classification", evaluate_classifier), ("ner", evaluate_tagger)):
            for start in STARTS:
                model_dir = paths.finetuned(task, start)
                results[f"{task}-{start}"] = evaluate(model_dir, paths.data / task / "test.jsonl", max_lengths[task])
                print(f"{task} ({start}): {_headline(task, results[f'{task}-{start}'])}", flush=True)
        results[BAG_OF_WORDS] = evaluate_bag_of_words(paths.data / "classification")
        print(f"classification (TF-IDF + logistic regression): {_headline('classification', results[BAG_OF_WORDS])}",
              flush=True)
    finally:
        torch.set_num_threads(saved_threads)
    paths.evaluation.write_text(json.dumps(results, indent=1) + "\n")
    return results


def _headline(task: str, metrics: dict) -> str:
    if task == "classification":
        return f"test accuracy {metrics['accuracy']:.3f}, macro-F1 {metrics['macro_f1']:.3f}"
    return f"test entity F1 {metrics['f1']:.3f} (precision {metrics['precision']:.3f}, recall {metrics['recall']:.3f})"


# ----- serving -----

SERVING_EXAMPLES = {
    "fill-mask": "The Congress must [MASK] the budget before the end of the year.",
    "text-classification": "A warm, funny and beautifully acted film that never loses its nerve.",
    "token-classification": "Heading to Chicago tonight to see the Bulls play with my friend Sarah !",
}


def serve_examples(paths) -> list[dict]:
    """The saved models answering new sentences through `pipeline(...)`, one line each."""
    from transformers import pipeline

    lines = []
    fill = pipeline("fill-mask", model=str(paths.pretrain))
    text = SERVING_EXAMPLES["fill-mask"].replace("[MASK]", fill.tokenizer.mask_token)
    guesses = fill(text, top_k=3)
    lines.append({"task": "fill-mask", "model": str(paths.pretrain), "input": text,
                  "output": ", ".join(f"{g['token_str']} ({g['score']:.2f})" for g in guesses)})
    model = paths.finetuned("classification", "pretrained")
    text = SERVING_EXAMPLES["text-classification"]
    (answer,) = pipeline("text-classification", model=str(model))(text)
    lines.append({"task": "text-classification", "model": str(model), "input": text,
                  "output": f"{answer['label']} ({answer['score']:.2f})"})
    model = paths.finetuned("ner", "pretrained")
    text = SERVING_EXAMPLES["token-classification"]
    entities = pipeline("token-classification", model=str(model), pipeline_class=IOB2TaggingPipeline)(text)
    found = ", ".join(f"{e['word']} = {e['entity_group']} ({e['score']:.2f})" for e in entities) or "no entity found"
    lines.append({"task": "token-classification", "model": str(model), "input": text, "output": found})
    return lines
