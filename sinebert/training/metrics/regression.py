"""Regression metrics: mean squared and absolute error, Pearson and Spearman correlation (as GLUE reports STS-B)."""

import datasets
import evaluate
import numpy as np
from scipy.stats import pearsonr, spearmanr
from sklearn.metrics import mean_absolute_error, mean_squared_error


def compute_regression(predictions, references) -> dict:
    """predictions, references: numbers `(n,)`. Correlations are 0.0 when either side is constant."""
    predictions, references = np.asarray(predictions, dtype=float), np.asarray(references, dtype=float)
    constant = predictions.std() == 0 or references.std() == 0
    return {
        "mse": float(mean_squared_error(references, predictions)),
        "mae": float(mean_absolute_error(references, predictions)),
        "pearson": 0.0 if constant else float(pearsonr(references, predictions)[0]),
        "spearman": 0.0 if constant else float(spearmanr(references, predictions)[0]),
    }


class Regression(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=__doc__,
            citation="Cer et al., 2017, SemEval-2017 Task 1: Semantic Textual Similarity.",
            inputs_description="predictions, references: numbers",
            features=datasets.Features({"predictions": datasets.Value("float64"),
                                        "references": datasets.Value("float64")}),
        )

    def _compute(self, predictions, references):
        return compute_regression(predictions, references)
