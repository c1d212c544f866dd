"""The shipped offline metrics against values computed by hand, directly and through `evaluate.load(path)`."""

import evaluate
import pytest

from sinebert.training.metrics import metric_path
from sinebert.training.metrics.classification import compute_classification
from sinebert.training.metrics.regression import compute_regression
from sinebert.training.metrics.seqeval_strict import compute_entities
from sinebert.training.metrics.squad import compute_squad, exact_match, f1, normalize_answer


@pytest.mark.parametrize(
    "text, normalised",
    [
        ("The Eiffel Tower.", "eiffel tower"),  # lower case, punctuation and the article go
        ("  an   apple,  a pear ", "apple pear"),  # articles anywhere, whitespace collapsed
        ("Theatre of the Absurd", "theatre of absurd"),  # 'the' only as a whole word
        ("U.S.-based", "usbased"),  # punctuation is deleted, not turned into spaces
        ("A", ""),
    ],
)
def test_squad_normalisation(text, normalised):
    assert normalize_answer(text) == normalised


def test_squad_scores_by_hand():
    assert exact_match("the Eiffel tower!", "Eiffel Tower") == 1.0
    # pred tokens [in, year, 1990], gold [1990, year]: 2 shared, P = 2/3, R = 1, F1 = 2PR/(P+R) = 0.8
    assert f1("in the year 1990", "1990 year") == pytest.approx(0.8)
    assert f1("paris", "london") == 0.0
    assert f1("cat cat", "cat dog cat") == pytest.approx(0.8)  # tokens shared with their counts: 2; P = 1, R = 2/3
    assert f1("", "") == 1.0 and f1("x", "") == 0.0  # SQuAD v2: no answer scores only the empty prediction
    predictions = {"q1": "The Eiffel Tower", "q2": "in the year 1990", "q3": "nothing"}
    references = {"q1": ["Eiffel Tower", "tower"], "q2": ["1990 year", "1990"], "q3": ["something else"]}
    # q1: EM 1 F1 1; q2: best gold '1990 year' -> EM 0, F1 0.8 ('1990' alone: P 1/3, R 1, F1 0.5); q3: 0
    scores = compute_squad(predictions, references)
    assert scores == pytest.approx({"exact_match": 100 / 3, "f1": 100 * 1.8 / 3})


def test_squad_with_unanswerable_questions():
    scores = compute_squad({"a": "", "b": "x", "c": "red car"}, {"a": [], "b": [], "c": ["the red car"]})
    assert scores["exact_match"] == pytest.approx(200 / 3) and scores["f1"] == pytest.approx(200 / 3)
    assert scores["no_answer_exact_match"] == 50.0 and scores["no_answer_total"] == 2
    assert scores["has_answer_f1"] == 100.0 and scores["has_answer_total"] == 1
    with pytest.raises(ValueError, match="no prediction"):
        compute_squad({}, {"a": ["x"]})


def test_squad_through_evaluate_load():
    metric = evaluate.load(metric_path("squad"))
    result = metric.compute(
        predictions=[{"id": "1", "prediction_text": "in the year 1990"}],
        references=[{"id": "1", "answers": {"text": ["1990 year"], "answer_start": [0]}}],
    )
    assert result == pytest.approx({"exact_match": 0.0, "f1": 80.0})


def test_entities_need_exact_boundaries_and_type():
    gold = [["B-PER", "I-PER", "O", "B-LOC", "O", "B-ORG"]]
    pred = [["B-PER", "I-PER", "O", "B-LOC", "I-LOC", "O"]]
    # gold entities PER(0-1), LOC(3), ORG(5); predicted PER(0-1), LOC(3-4): only PER matches (LOC's end differs).
    scores = compute_entities(pred, gold)
    assert scores["overall_precision"] == pytest.approx(1 / 2)
    assert scores["overall_recall"] == pytest.approx(1 / 3)
    assert scores["overall_f1"] == pytest.approx(2 * (1 / 2) * (1 / 3) / (1 / 2 + 1 / 3))  # 0.4
    assert scores["overall_accuracy"] == pytest.approx(4 / 6)  # tokens 4 and 5 are wrong
    assert scores["per_type"]["PER"] == {"precision": 1.0, "recall": 1.0, "f1": 1.0, "number": 1}
    assert scores["per_type"]["LOC"]["f1"] == 0.0 and scores["per_type"]["ORG"]["number"] == 1


def test_entities_strict_iob2_ignores_spans_that_start_with_i():
    gold = [["B-PER", "I-PER", "O", "B-LOC"]]
    # conlleval would read I-PER I-PER as a PER entity; strict IOB2 does not, so only LOC is predicted.
    scores = compute_entities([["I-PER", "I-PER", "O", "B-LOC"]], gold)
    assert scores["overall_precision"] == 1.0 and scores["overall_recall"] == 0.5
    assert scores["per_type"]["PER"]["recall"] == 0.0
    # Two adjacent entities of one type are two entities only with B- on the second.
    two = compute_entities([["B-PER", "I-PER", "O", "B-LOC"]], [["B-PER", "B-PER", "O", "B-LOC"]])
    assert two["overall_precision"] == 0.5 and two["overall_recall"] == pytest.approx(1 / 3)


def test_entities_through_evaluate_load_match_the_direct_call():
    gold = [["B-PER", "I-PER", "O"], ["B-ORG", "O", "B-LOC"]]
    pred = [["B-PER", "O", "O"], ["B-ORG", "O", "B-LOC"]]
    assert evaluate.load(metric_path("seqeval_strict")).compute(predictions=pred, references=gold) == \
        compute_entities(pred, gold)


def test_classification_by_hand():
    predictions, references = [0, 1, 1, 2, 2, 0], [0, 1, 2, 2, 2, 1]
    scores = compute_classification(predictions, references, ["a", "b", "c"])
    assert scores["accuracy"] == pytest.approx(4 / 6)
    # a: P 1/2 R 1/1; b: P 1/2 R 1/2; c: P 2/2 R 2/3 -> F1 2/3, 1/2, 4/5
    assert scores["per_class"]["a"] == pytest.approx({"precision": 0.5, "recall": 1.0, "f1": 2 / 3, "support": 1})
    assert scores["per_class"]["b"] == pytest.approx({"precision": 0.5, "recall": 0.5, "f1": 0.5, "support": 2})
    assert scores["per_class"]["c"] == pytest.approx({"precision": 1.0, "recall": 2 / 3, "f1": 0.8, "support": 3})
    assert scores["macro_f1"] == pytest.approx((2 / 3 + 0.5 + 0.8) / 3)
    assert scores["confusion_matrix"] == {"labels": ["a", "b", "c"], "matrix": [[1, 0, 0], [1, 1, 0], [0, 1, 2]]}
    loaded = evaluate.load(metric_path("classification"))
    assert loaded.compute(predictions=predictions, references=references, label_names=["a", "b", "c"]) == scores


def test_multilabel_and_regression_by_hand():
    # rows: {a}, {a, b}, {b} predicted; {a}, {b}, {b} gold -> exact sets 2/3; a: TP 1 FP 1; b: TP 2 FN 0
    scores = compute_classification([[1, 0], [1, 1], [0, 1]], [[1, 0], [0, 1], [0, 1]], ["a", "b"])
    assert scores["accuracy"] == pytest.approx(2 / 3)
    assert scores["per_class"]["a"]["precision"] == 0.5 and scores["per_class"]["b"]["recall"] == 1.0
    assert scores["micro_f1"] == pytest.approx(2 * 3 / (2 * 3 + 1))  # TP 3, FP 1, FN 0
    regression = compute_regression([1.0, 2.0, 4.0], [1.0, 2.0, 3.0])
    assert regression["mse"] == pytest.approx(1 / 3) and regression["mae"] == pytest.approx(1 / 3)
    assert regression["spearman"] == pytest.approx(1.0) and 0.9 < regression["pearson"] < 1.0
    assert compute_regression([1.0, 1.0], [0.0, 2.0])["pearson"] == 0.0  # constant predictions
    assert evaluate.load(metric_path("regression")).compute(predictions=[1.0, 2.0, 4.0],
                                                           references=[1.0, 2.0, 3.0]) == regression
