"""benchmarks/untuned.py's data and baseline, on synthetic stand-ins for the wheels (the suite fetches nothing): the
link that would name a tweet's agency is removed, duplicates never straddle train and test, and the TF-IDF baseline
scores what it predicts."""

import csv
import io
import zipfile

from benchmarks import untuned
from recipes.baselines import tfidf_logistic_regression


def wheel_with(tmp_path, member: str, data: bytes):
    path = tmp_path / "package-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(member, data)
    return path


def test_health_tweets_lose_their_links_and_are_labelled_by_agency(tmp_path):
    text = io.StringIO()
    writer = csv.writer(text)
    writer.writerows([["source_id", "text"],
                      ["bbchealth-585978391360221184", "Breast cancer risk test devised http://bbc.in/1CimpJF"],
                      ["cnnhealth-576880531301801984", "http://cnn.it/1EbtGjp"],  # only a link: nothing left
                      ["KaiserHealthNews-5880", "Medicaid  waivers,  explained: https://t.co/abc more"]])
    inner = io.BytesIO()
    with zipfile.ZipFile(inner, "w") as archive:
        archive.writestr("healthtweets.csv", text.getvalue())
    wheel = wheel_with(tmp_path, untuned.SOURCES["health_tweet_source"].member, inner.getvalue())
    assert untuned.health_tweet_rows(wheel) == [
        {"sentence": "Breast cancer risk test devised", "label": "bbchealth"},
        {"sentence": "Medicaid waivers, explained: more", "label": "KaiserHealthNews"},
    ]


def test_the_sample_drops_duplicate_texts_before_it_splits(monkeypatch):
    monkeypatch.setattr(untuned, "TRAIN_ROWS", 30)
    monkeypatch.setattr(untuned, "TEST_ROWS", 10)
    rows = [{"sentence": f"text {i % 50}", "label": str(i % 2)} for i in range(200)]  # each text four times
    splits = untuned.sample_split(rows, seed=0)
    train, test = ({row["sentence"] for row in splits[name]} for name in ("train", "test"))
    assert (len(splits["train"]), len(splits["test"])) == (30, 10) and not train & test
    assert splits == untuned.sample_split(rows, seed=0) != untuned.sample_split(rows, seed=1)


def test_the_bag_of_words_baseline_scores_its_predictions():
    words = {"pos": ["great", "superb", "lovely"], "neg": ["awful", "dull", "bad"]}
    train = [{"sentence": f"a {w} film {i}", "label": label} for label, ws in words.items() for w in ws
             for i in range(10)]
    test = [{"sentence": "superb", "label": "pos"}, {"sentence": "dull", "label": "neg"},
            {"sentence": "lovely", "label": "neg"}]  # the last label is wrong on purpose
    scores = tfidf_logistic_regression(train, test)
    assert round(scores["accuracy"], 1) == 66.7 and scores["C"] in (0.3, 1, 3, 10, 30)
