"""Classification metrics with scikit-learn: accuracy, macro-F1, per-class precision/recall/F1 and the confusion
matrix; multi-label data (config "multilabel", multi-hot rows) adds micro-F1 and scores accuracy as exact match of
the whole label set.

Macro-F1 averages over the classes that occur in the references or the predictions (scikit-learn's default), so a
class absent from both does not count as a zero.
"""

import datasets
import evaluate
import numpy as np
from sklearn.metrics import accuracy_score, confusion_matrix, f1_score, precision_recall_fscore_support


def compute_classification(predictions, references, label_names: list[str] | None = None) -> dict:
    """predictions, references: class ids `(n,)`, or multi-hot rows `(n, classes)` for multi-label data.

    label_names: the name of every class id (default: the ids as strings); names the per-class rows and the
    confusion matrix, whose rows are gold classes and columns predicted ones.
    """
    predictions, references = np.asarray(predictions), np.asarray(references)
    multilabel = references.ndim == 2
    classes = references.shape[1] if multilabel else int(max(predictions.max(initial=0), references.max(initial=0))) + 1
    names = list(label_names) if label_names is not None else [str(i) for i in range(classes)]
    ids = list(range(len(names)))
    precision, recall, f1, support = precision_recall_fscore_support(
        references, predictions, labels=None if multilabel else ids, zero_division=0
    )
    results = {
        "accuracy": float(accuracy_score(references, predictions)),
        "macro_f1": float(f1_score(references, predictions, average="macro", zero_division=0)),
        "per_class": {
            name: {"precision": float(p), "recall": float(r), "f1": float(f), "support": int(s)}
            for name, p, r, f, s in zip(names, precision, recall, f1, support)
        },
    }
    if multilabel:
        results["micro_f1"] = float(f1_score(references, predictions, average="micro", zero_division=0))
    else:
        results["confusion_matrix"] = {
            "labels": names, "matrix": confusion_matrix(references, predictions, labels=ids).tolist()
        }
    return results


class Classification(evaluate.Metric):
    def _info(self):
        value = datasets.Value("int64")
        feature = datasets.Sequence(value) if self.config_name == "multilabel" else value
        return evaluate.MetricInfo(
            description=__doc__,
            citation="Pedregosa et al., 2011, Scikit-learn: Machine Learning in Python.",
            inputs_description="predictions, references: class ids, or multi-hot rows with config 'multilabel'; "
            "label_names: optional class names",
            features=datasets.Features({"predictions": feature, "references": feature}),
        )

    def _compute(self, predictions, references, label_names=None):
        return compute_classification(predictions, references, label_names)
