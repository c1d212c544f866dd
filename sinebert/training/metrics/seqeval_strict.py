"""Entity-level precision, recall and F1 for tagged sequences, with seqeval in strict IOB2 mode.

An entity counts as found only when its type and both boundaries match a gold entity exactly, and only a
well-formed IOB2 span is an entity: a predicted I-X that does not continue a B-X/I-X is not the start of one (the
CoNLL convention of conlleval would count it). Token accuracy is reported beside, over all tokens.
"""

import datasets
import evaluate
from seqeval.metrics import accuracy_score, classification_report
from seqeval.scheme import IOB2


def compute_entities(predictions: list[list[str]], references: list[list[str]]) -> dict:
    """predictions, references: one list of IOB2 tags per sentence, of equal lengths.

    Returns overall_precision / overall_recall / overall_f1 / overall_accuracy and, per entity type,
    {precision, recall, f1, number} (number = gold entities of that type).
    """
    for row, (predicted, gold) in enumerate(zip(predictions, references, strict=True)):
        if len(predicted) != len(gold):
            raise ValueError(f"Sentence {row} has {len(predicted)} predicted tags for {len(gold)} gold tags.")
    report = classification_report(
        references, predictions, mode="strict", scheme=IOB2, output_dict=True, zero_division=0
    )
    overall = report.pop("micro avg")
    per_type = {
        name: {"precision": float(v["precision"]), "recall": float(v["recall"]), "f1": float(v["f1-score"]),
               "number": int(v["support"])}
        for name, v in report.items()
        if not name.endswith(" avg")
    }
    return {
        "overall_precision": float(overall["precision"]),
        "overall_recall": float(overall["recall"]),
        "overall_f1": float(overall["f1-score"]),
        "overall_accuracy": float(accuracy_score(references, predictions)),
        "per_type": per_type,
    }


class SeqevalStrict(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=__doc__,
            citation="Nakayama, 2018, seqeval: A Python framework for sequence labeling evaluation.",
            inputs_description="predictions, references: lists of IOB2 tag sequences",
            features=datasets.Features(
                {
                    "predictions": datasets.Sequence(datasets.Value("string")),
                    "references": datasets.Sequence(datasets.Value("string")),
                }
            ),
        )

    def _compute(self, predictions, references):
        return compute_entities(predictions, references)
