"""The tag decoding of NER: the most probable well-formed IOB2 sequence, checked against every sequence there is."""

import itertools
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers.pipelines.token_classification import AggregationStrategy

from sinebert.tagging import IOB2TaggingPipeline, best_tag_path, iob2_transitions
from sinebert.training.ner import word_tags

LABELS = ("O", "B-PER", "I-PER", "B-LOC", "I-LOC")


def well_formed(tags: list[str]) -> bool:
    return all(not tag.startswith("I-") or (i > 0 and tags[i - 1][2:] == tag[2:] and tags[i - 1] != "O")
               for i, tag in enumerate(tags))


@pytest.mark.parametrize("words", [1, 2, 3, 5])
def test_best_tag_path_is_the_most_probable_well_formed_sequence(words):
    generator = torch.Generator().manual_seed(words)
    allowed, first = iob2_transitions(LABELS)
    for _ in range(20):
        log_probs = torch.randn(words, len(LABELS), generator=generator).log_softmax(-1)
        candidates = [path for path in itertools.product(range(len(LABELS)), repeat=words)
                      if well_formed([LABELS[tag] for tag in path])]
        best = max(candidates, key=lambda path: sum(float(log_probs[i, tag]) for i, tag in enumerate(path)))
        assert best_tag_path(log_probs, allowed, first) == list(best)


def test_an_i_tag_that_continues_nothing_becomes_part_of_a_well_formed_span():
    # Word by word: "I-PER" after "O", then "I-LOC" after "I-PER": both continue nothing.
    probs = torch.tensor([[0.6, 0.3, 0.05, 0.03, 0.02],
                          [0.1, 0.35, 0.45, 0.05, 0.05],
                          [0.1, 0.05, 0.3, 0.05, 0.5]])
    assert [LABELS[i] for i in probs.argmax(-1)] == ["O", "I-PER", "I-LOC"]
    tags = [LABELS[i] for i in best_tag_path(probs.log(), *iob2_transitions(LABELS))]
    assert tags == ["O", "B-PER", "I-PER"] and well_formed(tags)


@pytest.mark.parametrize(("strategy", "expected"), [
    ("first", [0.5, 0.4, 0.1]), ("max", [0.1, 0.2, 0.7]), ("average", [0.3, 0.35, 0.35])])
def test_a_word_of_sub_tokens_is_scored_as_the_aggregation_strategy_says(strategy, expected):
    """As transformers' pipeline reads the strategies: the first sub-token's probabilities, those of the sub-token
    with the highest one, or their mean."""
    word = [{"scores": np.array(p)} for p in ([0.5, 0.4, 0.1], [0.1, 0.2, 0.7], [0.3, 0.45, 0.25])]
    scores = IOB2TaggingPipeline._word_scores(word, AggregationStrategy(strategy))
    assert scores.tolist() == pytest.approx(expected)


def test_word_tags_read_first_sub_tokens_and_tag_cut_off_words_o():
    log_probs = torch.full((6, len(LABELS)), -5.0)  # (seq, tags): [CLS], maria, ##no, rossi, [SEP], padding
    log_probs[1, LABELS.index("B-PER")] = log_probs[3, LABELS.index("I-PER")] = 0.0
    log_probs[2, LABELS.index("B-LOC")] = 0.0  # a later sub-token: not read
    assert word_tags(log_probs, [1, 3, None], LABELS) == ["B-PER", "I-PER", "O"]
    assert word_tags(log_probs, [], LABELS) == []


def test_decoding_benchmark_scores_both_decodings_and_the_sequence_as_the_cram_does(tokenizer_dir, tmp_path):
    from transformers import AutoTokenizer

    from benchmarks.tag_decoding import main
    from recipes.demo_eval import evaluate_tagger
    from sinebert import SineBertForTokenClassification
    from tests.conftest import tiny_config

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    tags = {"id2label": dict(enumerate(LABELS)), "label2id": {name: i for i, name in enumerate(LABELS)}}
    torch.manual_seed(0)
    model = SineBertForTokenClassification(tiny_config(vocab_size=len(tokenizer), max_position_embeddings=32, **tags))
    with torch.no_grad():  # orphan I- tags likely: I-LOC the most probable tag of a token
        model.classifier.bias.copy_(torch.tensor([0.0, 0.2, 0.0, 0.0, 0.6]))
    model.save_pretrained(tmp_path / "tagger")
    tokenizer.save_pretrained(tmp_path / "tagger")
    rows = [{"tokens": "maria rossi went to the city of rome".split(),
             "ner_tags": ["B-PER", "I-PER", "O", "O", "O", "O", "O", "B-LOC"]},
            {"tokens": "the old harbour".split(), "ner_tags": ["O", "B-LOC", "I-LOC"]}] * 3
    test = tmp_path / "test.jsonl"
    test.write_text("".join(json.dumps(row) + "\n" for row in rows))
    conll = tmp_path / "valid.txt"
    conll.write_text("\n\n".join("\n".join(f"{t} NN {g}" for t, g in zip(r["tokens"], r["ner_tags"])) for r in rows))
    main(["--model", str(tmp_path / "tagger"), "--file", str(test), str(conll), "--output", str(tmp_path / "out")])
    by_file = {Path(r["file"]).suffix: r for r in json.loads((tmp_path / "out.json").read_text())}
    assert by_file[".jsonl"]["sequence"] == pytest.approx(100 * evaluate_tagger(tmp_path / "tagger", test, 32)["f1"])
    for result in by_file.values():
        assert result["orphan_i_tags"] > 0  # word by word, ill-formed ...
        assert result["sequence"] == result["sequence_conlleval"]  # ... and the sequence, the same either way
    assert by_file[".jsonl"]["sequence"] == pytest.approx(by_file[".txt"]["sequence"])
