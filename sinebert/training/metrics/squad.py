"""SQuAD exact match and F1 (Rajpurkar et al., 2016), with the normalisation of the official evaluation script.

Both sides are normalised (lower case, punctuation removed, the articles a/an/the removed, whitespace collapsed);
F1 is the harmonic mean of precision and recall over the bag of normalised tokens. A question scores its best
value over its gold answers; the totals are means in percent. Unanswerable questions (SQuAD v2) have no gold
answer: they score 1 only for the empty prediction, as in the official v2 script.
"""

import re
import string
from collections import Counter

import datasets
import evaluate

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = frozenset(string.punctuation)


def normalize_answer(text: str) -> str:
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, gold: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(gold))


def f1(prediction: str, gold: str) -> float:
    predicted, expected = normalize_answer(prediction).split(), normalize_answer(gold).split()
    if not predicted or not expected:  # an empty side scores 1 only when both are empty
        return float(predicted == expected)
    common = sum((Counter(predicted) & Counter(expected)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(predicted), common / len(expected)
    return 2 * precision * recall / (precision + recall)


def compute_squad(predictions: dict[str, str], references: dict[str, list[str]]) -> dict:
    """predictions: {id: answer}; references: {id: [gold answers]} (an empty list for an unanswerable question).

    Returns exact_match and f1 in percent over all questions, and with unanswerable questions present, the same
    over the answerable (has_answer_*) and unanswerable (no_answer_*) ones. Every reference needs a prediction.
    """
    missing = [key for key in references if key not in predictions]
    if missing:
        raise ValueError(f"{len(missing)} questions have no prediction, e.g. id {missing[0]!r}.")
    scores = {"exact_match": {}, "f1": {}}
    for key, golds in references.items():
        golds = golds or [""]
        scores["exact_match"][key] = max(exact_match(predictions[key], gold) for gold in golds)
        scores["f1"][key] = max(f1(predictions[key], gold) for gold in golds)
    results = {name: _percent(values.values()) for name, values in scores.items()}
    unanswerable = {key for key, golds in references.items() if not golds}
    if unanswerable:
        for prefix, keys in (("has_answer", set(references) - unanswerable), ("no_answer", unanswerable)):
            for name, values in scores.items():
                results[f"{prefix}_{name}"] = _percent(values[key] for key in keys)
            results[f"{prefix}_total"] = len(keys)
    return results


def _percent(values) -> float:
    values = list(values)
    return 100.0 * sum(values) / len(values) if values else 0.0


class Squad(evaluate.Metric):
    """Inputs as for the hub's `squad` metric: predictions [{id, prediction_text}], references
    [{id, answers: {text: [...], answer_start: [...]}}]."""

    def _info(self):
        return evaluate.MetricInfo(
            description=__doc__,
            citation="Rajpurkar et al., 2016, SQuAD: 100,000+ Questions for Machine Comprehension of Text.",
            inputs_description="predictions: [{id, prediction_text}]; "
            "references: [{id, answers: {text, answer_start}}]",
            features=datasets.Features(
                {
                    "predictions": {"id": datasets.Value("string"), "prediction_text": datasets.Value("string")},
                    "references": {
                        "id": datasets.Value("string"),
                        "answers": datasets.Sequence(
                            {"text": datasets.Value("string"), "answer_start": datasets.Value("int32")}
                        ),
                    },
                }
            ),
        )

    def _compute(self, predictions, references):
        return compute_squad(
            {p["id"]: p["prediction_text"] for p in predictions},
            {r["id"]: list(r["answers"]["text"]) for r in references},
        )
