"""Loading fine-tuning data: column and label discovery, CoNLL reading, IOB schemes, sub-token alignment, SQuAD
windows; and the one-sentence errors for data that cannot be used."""

import argparse
import json
import re

import pytest
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from sinebert import SineBertForMaskedLM, SineBertForSequenceClassification
from sinebert.training.classification import (
    ClassificationEvaluation,
    classifier_pooling,
    example_count,
    load_classification_data,
    starting_config,
    to_standard_units,
    to_target_units,
)
from sinebert.training.errors import UserError
from sinebert.training.finetune import LengthGroupedSampler
from sinebert.training.ner import (
    Sentence,
    context_groups,
    encode_sentences,
    load_ner_data,
    load_ner_sentences,
    read_conll,
    to_iob2,
)
from sinebert.training.qa import (
    QAEvaluation,
    QAExample,
    answer_token_span,
    check_window_room,
    encode_examples,
    load_qa_data,
    read_squad_json,
    to_examples,
)
from tests.conftest import tiny_config


def namespace(**values) -> argparse.Namespace:
    """The arguments the loaders read, with the scripts' defaults."""
    defaults = dict(
        dataset_name=None, dataset_config_name=None, train_file=None, validation_file=None, encoding="utf-8",
        validation_split_percentage=10.0, seed=0, max_train_samples=None, max_eval_samples=None, max_length=64,
        trust_remote_code=False, task_name=None, text_column_name=None, text_pair_column_name=None,
        label_column_name=None, problem_type=None, label_separator=None, conll_token_column=0, conll_tag_column=-1,
        label_scheme="IOB2", label_all_tokens=False, document_context=False, question_column_name=None,
        context_column_name=None,
        answer_column_name=None, version_2_with_negative=False, doc_stride=16, train_answer_windows_only=False,
        early_stopping_patience=None, load_best_model_at_end=False,
    )
    return argparse.Namespace(**{**defaults, **values})


@pytest.fixture(scope="module")
def tokenizer(tokenizer_dir):
    return AutoTokenizer.from_pretrained(tokenizer_dir)


def write(path, text: str):
    path.write_text(text, encoding="utf-8")
    return str(path)


def one_sentence(error: pytest.ExceptionInfo) -> str:
    message = str(error.value)
    assert "\n" not in message and message.endswith("."), message
    return message


# ----- classification -----


def test_string_labels_get_sorted_ids_and_pairs_are_found(tmp_path, tokenizer):
    train = write(tmp_path / "train.csv", "premise,hypothesis,label\na cat,an animal,yes\na car,a fruit,no\n"
                                          "a dog,a pet,yes\n")
    valid = write(tmp_path / "valid.csv", "premise,hypothesis,label\na rose,a flower,yes\n")
    data = load_classification_data(namespace(train_file=[train], validation_file=[valid]), tokenizer)
    assert (data.columns.text, data.columns.pair, data.columns.label) == ("premise", "hypothesis", "label")
    assert data.labels.config_values()["id2label"] == {0: "no", 1: "yes"}
    assert [row["labels"] for row in data.train_rows] == [1, 0, 1] and data.eval_targets == [1]
    pair = tokenizer("a rose", "a flower")
    assert data.eval_rows[0]["input_ids"] == pair["input_ids"]
    assert data.eval_rows[0]["token_type_ids"] == pair["token_type_ids"]


def test_integer_labels_and_named_columns(tmp_path, tokenizer):
    train = write(tmp_path / "train.tsv", "review\tstars\ngood\t5\nbad\t1\nfine\t3\n")
    valid = write(tmp_path / "valid.tsv", "review\tstars\nok\t3\n")
    args = namespace(train_file=[train], validation_file=[valid], text_column_name="review", label_column_name="stars")
    data = load_classification_data(args, tokenizer)
    assert data.labels.names == ["1", "3", "5"] and data.eval_targets == [1]
    assert data.labels.problem_type == "single_label_classification"


def test_multi_label_lists_and_regression_floats(tmp_path, tokenizer):
    rows = [{"text": "a", "label": ["x", "y"]}, {"text": "b", "label": ["y"]}, {"text": "c", "label": []}]
    train = write(tmp_path / "train.jsonl", "\n".join(json.dumps(r) for r in rows))
    valid = write(tmp_path / "valid.jsonl", json.dumps({"text": "d", "label": ["x"]}))
    data = load_classification_data(namespace(train_file=[train], validation_file=[valid]), tokenizer)
    assert data.labels.problem_type == "multi_label_classification"
    assert [row["labels"] for row in data.train_rows] == [[1.0, 1.0], [0.0, 1.0], [0.0, 0.0]]
    train = write(tmp_path / "r.csv", "sentence,score\nx,0.5\ny,3.25\n")
    valid = write(tmp_path / "rv.csv", "sentence,score\nz,1.5\n")
    data = load_classification_data(namespace(train_file=[train], validation_file=[valid]), tokenizer)
    assert data.labels.config_values() == {"num_labels": 1, "problem_type": "regression"}
    assert data.eval_targets == [1.5]


def test_text_labels_split_by_a_given_separator_are_multi_label_and_otherwise_one_class_each(tmp_path, tokenizer):
    train = write(tmp_path / "train.csv", "sentence,labels\na,acting|plot\nb,plot\nc,acting\n")
    said = []
    data = load_classification_data(namespace(train_file=[train], validation_file=[train], label_separator="|"),
                                    tokenizer, print_fn=said.append)
    assert (data.labels.problem_type, data.labels.names) == ("multi_label_classification", ["acting", "plot"])
    assert [row["labels"] for row in data.train_rows] == [[1.0, 1.0], [0.0, 1.0], [1.0, 0.0]]
    assert said == ["Labels in 'labels': training a multi label classification model (--label_separator '|' splits "
                    "its text; set --problem_type to choose otherwise)."]
    data = load_classification_data(namespace(train_file=[train], validation_file=[train]), tokenizer)
    assert (data.labels.problem_type, data.labels.names) == ("single_label_classification", ["acting", "acting|plot",
                                                                                             "plot"])
    comma = write(tmp_path / "comma.jsonl", "\n".join(json.dumps({"text": t, "label": label})
                                                       for t, label in (("a", "x, y"), ("b", "y"))))
    data = load_classification_data(namespace(train_file=[comma], validation_file=[comma],
                                              problem_type="multi_label_classification"), tokenizer)
    assert data.labels.names == ["x", "y"]  # ',' splits a multi-label cell unless told otherwise


def test_a_validation_label_unseen_in_training_is_one_clear_error(tmp_path, tokenizer):
    train = write(tmp_path / "train.csv", "sentence,label\ngood,positive\nbad,negative\n")
    valid = write(tmp_path / "valid.csv", "sentence,label\nfine,positive\nmeh,neutral\n")
    with pytest.raises(UserError) as error:
        load_classification_data(namespace(train_file=[train], validation_file=[valid]), tokenizer)
    assert f"Row 2 of {valid} has the label 'neutral', which the training data never has" in one_sentence(error)
    assert "['negative', 'positive']" in str(error.value)


@pytest.mark.parametrize("bad", range(6))
def test_a_row_of_a_held_out_split_is_named_by_its_file_and_row_there(tmp_path, tokenizer, bad):
    """With no validation file, half of the rows of two files are held out at random; a message about a row gives its
    file and its row there, wherever it went: row `bad` has no label, then row 5-`bad` the only 'neutral'."""
    cells = [["good", "positive"] if row % 2 else ["bad", "negative"] for row in range(6)]

    def files(name: str) -> list[str]:  # rows 0-2 in the first file, 3-5 in the second
        return [write(tmp_path / f"{name}{part}.csv", "sentence,label\n" + "".join(f"{a},{b}\n" for a, b in half))
                for part, half in enumerate((cells[:3], cells[3:]))]

    def place(row: int, name: str) -> str:
        return f"Row {row % 3 + 1} of {tmp_path / f'{name}{row // 3}.csv'}"

    cells[bad][1] = ""
    with pytest.raises(UserError) as error:
        load_classification_data(namespace(train_file=files("blank"), validation_split_percentage=50.0), tokenizer)
    assert one_sentence(error) == f"{place(bad, 'blank')} has no label; fill it in or remove the row."
    cells[bad][1], cells[5 - bad][1] = ("positive" if bad % 2 else "negative"), "neutral"
    try:
        data = load_classification_data(namespace(train_file=files("neutral"), validation_split_percentage=50.0),
                                        tokenizer)
        assert "neutral" in data.labels.names  # it went to training
    except UserError as error:  # or a label went to validation only: the row named has it
        found = re.match(r"(Row \d of \S+) has the label '(\w+)', which only the rows held out for validation have; "
                         "the training labels are", str(error))
        assert found and any(place(row, "neutral") == found[1] and cells[row][1] == found[2] for row in range(6)), \
            str(error)


def test_json_tagged_rows_of_several_files_are_named_by_file_and_read_as_one_document_each(tmp_path, tokenizer):
    rows = [{"tokens": ["EU", "rejects"], "ner_tags": ["B-ORG", "O"]}, {"tokens": ["Peter"], "ner_tags": ["B-PER"]}]
    first, second = (write(tmp_path / name, "\n".join(json.dumps(row) for row in rows))
                     for name in ("a.jsonl", "b.jsonl"))
    sentences = load_ner_sentences(namespace(train_file=[first, second], validation_file=[second]))["train"]
    # Document context never runs from the end of one file into the next.
    assert [(s.origin, s.document) for s in sentences] == [(f"{first} row 1", first), (f"{first} row 2", first),
                                                           (f"{second} row 1", second), (f"{second} row 2", second)]
    bad = write(tmp_path / "c.jsonl", "\n".join(json.dumps(row) for row in [*rows, {"tokens": ["x"], "ner_tags": []}]))
    with pytest.raises(UserError) as error:
        load_ner_data(namespace(train_file=[first, bad], validation_file=[first]), tokenizer)
    assert one_sentence(error) == f"{bad} row 3: 'tokens' and 'ner_tags' need lists of tokens and tags of equal length."


def test_columns_that_do_not_match_are_one_clear_error(tmp_path, tokenizer):
    train = write(tmp_path / "train.csv", "sentence,label\ngood,1\nbad,0\n")
    valid = write(tmp_path / "valid.csv", "text,label\nfine,1\n")
    with pytest.raises(UserError) as error:
        load_classification_data(namespace(train_file=[train], validation_file=[valid]), tokenizer)
    assert "do not all have the same columns" in one_sentence(error)
    assert "train.csv has ['sentence', 'label']" in str(error.value) and "valid.csv has ['text', 'label']" in str(
        error.value)
    with pytest.raises(UserError) as error:
        load_classification_data(
            namespace(train_file=[train], validation_file=[train], text_column_name="review"), tokenizer
        )
    assert "'review' is not a column" in one_sentence(error) and "['sentence', 'label']" in str(error.value)
    unlabelled = write(tmp_path / "unlabelled.csv", "sentence,mood\ngood,1\n")
    with pytest.raises(UserError, match="Found no label column among"):
        load_classification_data(namespace(train_file=[unlabelled], validation_file=[unlabelled]), tokenizer)


# ----- NER -----


CONLL = """-DOCSTART- -X- -X- O

EU NNP B-NP B-ORG
rejects VBZ B-VP O
German JJ B-NP B-MISC
   \t
Peter NNP B-NP B-PER
Blackburn NNP I-NP I-PER
"""


def test_conll_reading_skips_docstart_and_splits_on_blank_or_whitespace_lines(tmp_path):
    sentences = read_conll(write(tmp_path / "a.txt", CONLL), token_column=0, tag_column=-1)
    assert [s.tokens for s in sentences] == [["EU", "rejects", "German"], ["Peter", "Blackburn"]]
    assert [s.tags for s in sentences] == [["B-ORG", "O", "B-MISC"], ["B-PER", "I-PER"]]
    assert sentences[1].origin.endswith("a.txt line 7")
    assert sentences[0].document == sentences[1].document  # one document, context for each other
    two = read_conll(write(tmp_path / "b.txt", CONLL + "\n-DOCSTART- -X- -X- O\n\n" + CONLL[22:]), 0, -1)
    assert [s.document for s in two] == [two[0].document] * 2 + [two[2].document] * 2 != [two[0].document] * 4
    chunks = read_conll(str(tmp_path / "a.txt"), token_column=0, tag_column=2)
    assert chunks[0].tags == ["B-NP", "B-VP", "B-NP"]


def test_conll_line_with_wrong_columns_names_file_and_line(tmp_path):
    path = write(tmp_path / "bad.txt", "EU NNP B-NP B-ORG\nrejects B-VP O\n")
    with pytest.raises(UserError) as error:
        read_conll(path, 0, -1)
    assert f"{path} line 2 has 3 columns" in one_sentence(error)
    with pytest.raises(UserError, match="--conll_tag_column 7 is outside the 4 columns"):
        read_conll(path, 0, 7)


def test_iob1_is_converted_and_invalid_iob2_is_refused():
    iob1 = Sentence(["a", "b", "c", "d", "e", "f"], ["I-PER", "I-PER", "B-PER", "O", "I-LOC", "I-ORG"], "x line 1")
    assert to_iob2(iob1, "IOB1").tags == ["B-PER", "I-PER", "B-PER", "O", "B-LOC", "B-ORG"]  # a new type, a new entity
    with pytest.raises(UserError) as error:
        to_iob2(iob1, "IOB2")
    assert "x line 1: the tag I-PER (token 1) follows O" in one_sentence(error)
    assert "--label_scheme IOB1" in str(error.value)
    with pytest.raises(UserError, match="'PER' .* is not O, B-TYPE or I-TYPE"):
        to_iob2(Sentence(["a"], ["PER"], "x line 1"), "IOB2")


def test_word_labels_align_to_first_or_all_sub_tokens(tokenizer):
    sentence = Sentence(["unflinchingly", "bleak", "Peter"], ["B-MISC", "O", "B-PER"], "s")
    names = ["O", "B-MISC", "I-MISC", "B-PER", "I-PER"]
    pieces = tokenizer.tokenize("unflinchingly")
    assert len(pieces) > 1  # the test needs a word split into several sub-tokens
    (first,), ((row, positions),) = encode_sentences([sentence], tokenizer, names, 64, label_all_tokens=False)
    n = len(pieces)
    assert first["labels"][: n + 1] == [-100, 1] + [-100] * (n - 1)  # [CLS], then the word's pieces
    assert row == 0 and positions[0] == 1 and positions[1] == n + 1
    assert first["labels"][positions[1]] == 0 and first["labels"][positions[2]] == 3
    (every,), _ = encode_sentences([sentence], tokenizer, names, 64, label_all_tokens=True)
    assert every["labels"][1 : n + 1] == [1] + [2] * (n - 1)  # B-MISC, then I-MISC on the later pieces


def test_document_context_fills_rows_with_consecutive_sentences_of_one_document():
    sentences = [Sentence(["w"] * n, ["O"] * n, f"s{i}", document) for i, (n, document) in
                 enumerate([(3, "a"), (4, "a"), (2, "a"), (9, "a"), (1, "b"), (1, "b"), (12, "b"), (2, "b")])]
    lengths = [len(s.tokens) for s in sentences]
    # 3+4+2 fill a budget of 10 (one more would not fit), document b starts a row of its own, and a sentence
    # longer than the budget gets a row alone.
    assert context_groups(sentences, lengths, 10) == [[0, 1, 2], [3], [4, 5], [6], [7]]


def test_document_context_rows_label_every_sentence_at_its_own_words(tokenizer):
    names = ["O", "B-LOC", "I-LOC", "B-PER", "I-PER"]
    words = [(["Peter", "went", "to", "Paris"], ["B-PER", "O", "O", "B-LOC"]),
             (["He", "liked", "New", "York"], ["O", "O", "B-LOC", "I-LOC"]),
             (["unflinchingly", "Peter"], ["O", "B-PER"])]
    sentences = [Sentence(tokens, tags, f"s{i}", "d") for i, (tokens, tags) in enumerate(words)]
    sentences.append(Sentence(["Paris"], ["B-LOC"], "s3", "other"))
    alone, alone_places = encode_sentences(sentences, tokenizer, names, 64, label_all_tokens=False)
    rows, places = encode_sentences(sentences, tokenizer, names, 64, label_all_tokens=False, context=True)
    assert len(alone) == 4 and len(rows) == 2  # the three sentences of document d share a row
    assert [row for row, _ in places] == [0, 0, 0, 1]
    for sentence, (row, first), (single_row, single_first) in zip(sentences, places, alone_places):
        assert all(p is not None for p in first)
        # Each word starts at the same token, with the same label, as when its sentence is alone, shifted by the
        # tokens of the sentences before it in the row.
        shift = first[0] - single_first[0]
        assert [p - shift for p in first] == single_first
        assert [rows[row]["labels"][p] for p in first] == [names.index(tag) for tag in sentence.tags]
        assert [rows[row]["input_ids"][p] for p in first] == [alone[single_row]["input_ids"][p] for p in single_first]
    assert sum(label != -100 for label in rows[0]["labels"]) == 10  # every word of the three sentences is trained
    # Without room for the three, the row takes what fits and the rest start the next one.
    short, short_places = encode_sentences(sentences, tokenizer, names, 14, label_all_tokens=False, context=True)
    assert len(short) > 2 and all(len(row["input_ids"]) <= 14 for row in short)
    assert [p for _, first in short_places for p in first].count(None) == 0


def test_a_held_out_validation_split_never_gives_context_across_the_split(tmp_path, tokenizer):
    text = "\n\n".join(f"w{i} O\nParis B-LOC" for i in range(20)) + "\n"
    splits = load_ner_data(namespace(train_file=[write(tmp_path / "t.txt", text)], validation_split_percentage=30,
                                     document_context=True), tokenizer)
    held = [int(s.tokens[0][1:]) for s in splits.eval_sentences]
    assert len(held) == 6 and any(b == a + 1 for a, b in zip(held, held[1:]))
    # Sentences stay in one document exactly where they were neighbours in the file.
    for (a, b), (sa, sb) in zip(zip(held, held[1:]), zip(splits.eval_sentences, splits.eval_sentences[1:])):
        assert (sa.document == sb.document) == (b == a + 1)


def test_ner_type_unseen_in_training_and_columns_that_do_not_match(tmp_path, tokenizer):
    train = write(tmp_path / "train.txt", "Peter B-PER\nruns O\n\nParis B-LOC\n")
    valid = write(tmp_path / "valid.txt", "Acme B-ORG\nsells O\n")
    with pytest.raises(UserError) as error:
        load_ner_data(namespace(train_file=[train], validation_file=[valid]), tokenizer)
    assert "entity type 'ORG'" in one_sentence(error) and "valid.txt line 1" in str(error.value)
    rows = write(tmp_path / "train.jsonl", json.dumps({"words": ["Peter"], "ner_tags": ["B-PER"]}))
    other = write(tmp_path / "valid.jsonl", json.dumps({"tokens": ["Paris"], "ner_tags": ["B-PER"]}))
    with pytest.raises(UserError) as error:
        load_ner_data(namespace(train_file=[rows], validation_file=[other]), tokenizer)
    assert "do not all have the same columns" in one_sentence(error)
    assert "valid.jsonl has ['tokens', 'ner_tags']" in str(error.value)
    with pytest.raises(UserError) as error:
        load_ner_data(namespace(train_file=[rows], validation_file=[rows], text_column_name="tokens"), tokenizer)
    assert "--text_column_name 'tokens' is not a column" in one_sentence(error)


# ----- QA -----


CONTEXT = "the film was written by maria and shot in the old harbour of the city during a cold winter ."


def squad_file(path, answers, version="1.1"):
    document = {"version": version, "data": [{"title": "t", "paragraphs": [{"context": CONTEXT, "qas": [
        {"id": f"q{i}", "question": "who wrote the film ?", "answers": a} for i, a in enumerate(answers)
    ]}]}]}
    return write(path, json.dumps(document))


def test_squad_json_and_its_flattened_jsonl_load_alike(tmp_path, tokenizer):
    answer = [{"text": "maria", "answer_start": CONTEXT.index("maria")}]
    squad = squad_file(tmp_path / "train.json", [answer, answer])
    records = read_squad_json(squad)
    flat = write(tmp_path / "train.jsonl", "\n".join(json.dumps(r) for r in records))
    from_json = load_qa_data(namespace(train_file=[squad], validation_file=[squad], max_length=64), tokenizer)
    from_jsonl = load_qa_data(namespace(train_file=[flat], validation_file=[flat], max_length=64), tokenizer)
    assert from_json.eval_examples == from_jsonl.eval_examples and from_json.train_rows == from_jsonl.train_rows
    assert read_squad_json(flat) is None  # JSON lines are not SQuAD JSON
    as_list = write(tmp_path / "list.jsonl", "\n".join(json.dumps({**r, "answers": answer}) for r in records))
    from_list = load_qa_data(namespace(train_file=[as_list], validation_file=[as_list], max_length=64), tokenizer)
    assert from_list.eval_examples == from_json.eval_examples  # answers as SQuAD JSON writes them work too
    with pytest.raises(UserError, match="needs validation data"):
        load_qa_data(namespace(train_file=[squad], max_length=64), tokenizer)


def test_windows_put_the_answer_where_the_offsets_say(tokenizer):
    examples = to_examples([{"id": "a", "question": "where was it shot ?", "context": CONTEXT,
                             "answers": {"text": ["the old harbour"], "answer_start": [CONTEXT.index("the old")]}}],
                           "training", False)
    rows, windows = encode_examples(examples, tokenizer, max_length=24, doc_stride=8)
    assert len(rows) > 1  # the context needs several windows of 24 tokens
    found = 0
    for row, window in zip(rows, windows):
        start, end = row["start_positions"], row["end_positions"]
        if (start, end) == (0, 0):
            continue  # this window does not hold the whole answer
        found += 1
        assert CONTEXT[window.offsets[start][0] : window.offsets[end][1]] == "the old harbour"
    assert found >= 1
    assert answer_token_span([(0, 0), (0, 3), (4, 8)], [False, True, True], 5, 12) == (0, 0)  # runs past the end


def test_a_stride_that_leaves_a_window_no_new_context_is_one_sentence(tokenizer):
    """Windows of 32 tokens hold [CLS] question [SEP] context [SEP]: a stride of the whole context room would make
    the tokenizer panic; one token less is the largest that works."""
    example = QAExample("q1", "who wrote the film ?", " ".join(["the film was written by maria ."] * 12), [], [])
    room = 32 - len(tokenizer(example.question, add_special_tokens=False)["input_ids"]) - 3
    check_window_room([example], tokenizer, 32, room - 1)
    rows, _ = encode_examples([example], tokenizer, 32, room - 1)
    assert len(rows) > 2
    with pytest.raises(UserError, match=f"Question 'q1' has {32 - 3 - room} tokens, which with --doc_stride {room} "
                                        "leaves no room for new context in windows of --max_seq_length 32"):
        check_window_room([example], tokenizer, 32, room)


def test_answer_windows_only_drops_the_windows_an_answered_question_labels_cls(tmp_path, tokenizer):
    # Windows of 24 tokens: the answered question's context spans several, one or two of which hold "maria";
    # an unanswerable question (SQuAD v2) keeps every window, since [CLS] is what it teaches.
    answered = [{"text": "maria", "answer_start": CONTEXT.index("maria")}]
    squad = squad_file(tmp_path / "train.json", [answered, []], version="2.0")
    arguments = dict(train_file=[squad], validation_file=[squad], max_length=24, doc_stride=8,
                     version_2_with_negative=True)
    every = load_qa_data(namespace(**arguments), tokenizer).train_rows
    kept = load_qa_data(namespace(**arguments, train_answer_windows_only=True), tokenizer).train_rows
    per_question = len(every) // 2  # both questions share the context, so they have the same windows
    assert len(every) == 2 * per_question and per_question > 2
    holding = [row for row in every[:per_question] if row["start_positions"] != 0]
    assert 1 <= len(holding) < per_question
    assert kept == holding + every[per_question:]


def test_bad_squad_answers_are_one_clear_error(tmp_path, tokenizer):
    shifted = squad_file(tmp_path / "shifted.json", [[{"text": "maria", "answer_start": 3}]])
    with pytest.raises(UserError) as error:
        load_qa_data(namespace(train_file=[shifted], validation_file=[shifted], max_length=64), tokenizer)
    assert "'maria' of question 'q0'" in one_sentence(error) and "reads ' fi" in str(error.value)
    unanswerable = squad_file(tmp_path / "v2.json", [[]], version="v2.0")
    with pytest.raises(UserError, match="pass --version_2_with_negative"):
        load_qa_data(namespace(train_file=[unanswerable], validation_file=[unanswerable], max_length=64), tokenizer)
    data = load_qa_data(namespace(train_file=[unanswerable], validation_file=[unanswerable], max_length=64,
                                  version_2_with_negative=True), tokenizer)
    assert data.eval_examples[0].answers == [] and data.train_rows[0]["start_positions"] == 0


# ----- scoring gathered outputs -----


def test_squad_v2_scoring_lets_no_answer_win_only_when_asked(tmp_path, tokenizer):
    answer = [{"text": "maria", "answer_start": CONTEXT.index("maria")}]
    squad = squad_file(tmp_path / "v2.json", [answer, []], version="v2.0")
    args = namespace(train_file=[squad], validation_file=[squad], max_length=64, version_2_with_negative=True)
    data = load_qa_data(args, tokenizer)
    rows = []
    for row in data.eval_rows:  # logits that point at the labelled tokens: the answer, or [CLS] for none
        start, end = torch.zeros(len(row["input_ids"])), torch.zeros(len(row["input_ids"]))
        start[row["start_positions"]], end[row["end_positions"]] = 10.0, 10.0
        rows.append({"start_logits": start, "end_logits": end, "loss": torch.tensor(0.5)})
    predictions, metrics = QAEvaluation(None, None, data, 5, 30, allow_unanswerable=True).score(rows)
    assert predictions == {"q0": "maria", "q1": ""}
    assert metrics["exact_match"] == 100.0 and metrics["no_answer_total"] == 1 and metrics["loss"] == 0.5
    predictions, metrics = QAEvaluation(None, None, data, 5, 30, allow_unanswerable=False).score(rows)
    assert predictions["q0"] == "maria" and predictions["q1"] != "" and metrics["no_answer_exact_match"] == 0.0


def classification_data(tmp_path, tokenizer, rows, **flags):
    train = write(tmp_path / "train.jsonl", "\n".join(json.dumps(r) for r in rows))
    return load_classification_data(namespace(train_file=[train], validation_file=[train], **flags), tokenizer)


def test_multi_label_and_regression_predictions(tmp_path, tokenizer):
    data = classification_data(tmp_path, tokenizer, [{"text": "a", "label": "x|y"}, {"text": "b", "label": "y"}],
                               problem_type="multi_label_classification", label_separator="|")
    evaluation = ClassificationEvaluation(None, None, data)
    # sigmoid > 0.5 exactly where the labels are: x at 0.55 in the first row, 0.45 in the second
    logits = [torch.tensor([0.2, 2.0]), torch.tensor([-0.2, 2.0])]
    predictions, metrics = evaluation.score([{"logits": row} for row in logits])
    assert [p["prediction"] for p in predictions] == [["x", "y"], ["y"]]
    assert metrics["accuracy"] == 1.0 and metrics["micro_f1"] == 1.0 and evaluation.main_metric == "eval_micro_f1"
    targets = torch.tensor([[1.0, 1.0], [0.0, 1.0]])
    expected = torch.nn.functional.binary_cross_entropy_with_logits(torch.stack(logits), targets)
    assert metrics["loss"] == pytest.approx(float(expected))
    data = classification_data(tmp_path, tokenizer, [{"text": "a", "label": 1.0}, {"text": "b", "label": 3.0}])
    # The model learns the standardised targets (mean 2, standard deviation 1); predictions are in the targets' units.
    assert (data.labels.shift, data.labels.scale) == (2.0, 1.0) and [r["labels"] for r in data.train_rows] == [-1, 1]
    with pytest.raises(UserError, match="Row 2 of .* has the label 'inf'; regression needs finite"):
        classification_data(tmp_path, tokenizer, [{"text": "a", "label": "1.5"}, {"text": "b", "label": "inf"}],
                            problem_type="regression")
    predictions, metrics = ClassificationEvaluation(None, None, data).score([{"logits": torch.tensor([v])}
                                                                            for v in (0.0, 1.0)])
    assert [p["prediction"] for p in predictions] == [2.0, 3.0]
    assert metrics["mse"] == pytest.approx(0.5) and metrics["loss"] == pytest.approx(0.5)


def test_a_regression_head_is_saved_in_the_targets_units_and_trained_further_in_standard_ones(tmp_path, tokenizer):
    data = classification_data(tmp_path, tokenizer, [{"text": t, "label": v} for t, v in (("a", 100.0), ("b", 500.0))])
    space = data.labels
    assert (space.shift, space.scale) == (300.0, 200.0)
    torch.manual_seed(0)
    model = SineBertForSequenceClassification(tiny_config(vocab_size=len(tokenizer), num_labels=1,
                                                          problem_type="regression")).eval()
    inputs = tokenizer(["a good film", "a dull one"], padding=True, return_tensors="pt")
    with torch.no_grad():
        standard = model(**inputs).logits  # (2, 1)
        to_target_units(model, space)
        torch.testing.assert_close(model(**inputs).logits, standard * 200 + 300)
    model.save_pretrained(tmp_path / "regression")
    again = AutoModelForSequenceClassification.from_pretrained(tmp_path / "regression").eval()
    to_standard_units(again, space, starting_config(namespace(model_name_or_path=str(tmp_path / "regression"))))
    with torch.no_grad():
        torch.testing.assert_close(again(**inputs).logits, standard)


def test_the_classifier_reads_the_token_mean_unless_a_classifier_checkpoint_or_the_flag_says_otherwise(tmp_path):
    SineBertForMaskedLM(tiny_config()).save_pretrained(tmp_path / "mlm")  # its config holds the default, "cls"
    SineBertForSequenceClassification(tiny_config(num_labels=2)).save_pretrained(tmp_path / "classifier")
    for start, flag, expected in ((None, None, "mean"), ("mlm", None, "mean"), ("classifier", None, "cls"),
                                  ("classifier", "mean", "mean"), (None, "cls", "cls")):
        args = namespace(model_name_or_path=start and str(tmp_path / start), classifier_pooling=flag)
        assert classifier_pooling(args, starting_config(args)) == expected, (start, flag)


def test_evaluations_give_the_loop_their_main_metric_patience_and_best_model_choice(tmp_path, tokenizer):
    data = classification_data(tmp_path, tokenizer, [{"text": "a", "label": "x"}, {"text": "b", "label": "y"}])
    args = namespace(early_stopping_patience=2, load_best_model_at_end=True)
    task = ClassificationEvaluation(None, None, data).task(args, example_count)
    assert (task.main_metric, task.greater_is_better, task.early_stopping_patience) == ("eval_accuracy", True, 2)
    assert task.load_best_model_at_end


def test_class_label_features_of_a_dataset_folder_name_the_labels(tmp_path, tokenizer):
    """A --dataset_name folder (as the hub serves them: parquet with `datasets` features) whose labels are ClassLabel
    ids: the names come from the features, for classification and for NER tags."""
    from datasets import ClassLabel, Dataset, Features, Sequence, Value

    sentiment = Features({"sentence": Value("string"), "label": ClassLabel(names=["negative", "positive"])})
    tags = Features({"tokens": Sequence(Value("string")),
                     "ner_tags": Sequence(ClassLabel(names=["O", "B-PER", "I-PER"]))})
    for split, rows in (("train", 3), ("validation", 2)):
        Dataset.from_dict({"sentence": ["good", "bad", "fine"][:rows], "label": [1, 0, 1][:rows]},
                          features=sentiment).to_parquet(str(tmp_path / "sst" / f"{split}.parquet"))
        Dataset.from_dict({"tokens": [["Ada", "wrote"], ["Alan", "Turing"], ["x"]][:rows],
                           "ner_tags": [[1, 0], [1, 2], [0]][:rows]}, features=tags).to_parquet(
            str(tmp_path / "ner" / f"{split}.parquet"))
    data = load_classification_data(namespace(dataset_name=str(tmp_path / "sst")), tokenizer)
    assert data.labels.names == ["negative", "positive"] and data.eval_targets == [1, 0]
    ner = load_ner_data(namespace(dataset_name=str(tmp_path / "ner")), tokenizer)
    assert ner.names == ["O", "B-PER", "I-PER"]
    assert [s.tags for s in ner.eval_sentences] == [["B-PER", "O"], ["B-PER", "I-PER"]]


def test_malformed_squad_json_is_one_clear_error(tmp_path, tokenizer):
    question = {"id": "q", "question": "who ?", "answers": []}
    broken = write(tmp_path / "broken.json", json.dumps({"data": [{"paragraphs": [{"qas": [question]}]}]}))
    with pytest.raises(UserError) as error:
        load_qa_data(namespace(train_file=[broken], validation_file=[broken]), tokenizer)
    assert "lacks the field 'context'" in one_sentence(error)
    empty = write(tmp_path / "empty.json", json.dumps({"data": [{"paragraphs": [{"context": "x", "qas": []}]}]}))
    with pytest.raises(UserError, match="The training data holds no question"):
        load_qa_data(namespace(train_file=[empty], validation_file=[empty]), tokenizer)


# ----- batching -----


def test_length_grouped_batches_cover_the_data_once_with_little_padding_and_resume_alike():
    lengths = torch.randint(2, 100, (1000,), generator=torch.Generator().manual_seed(0)).tolist()
    sampler = LengthGroupedSampler(lengths, batch_size=16, seed=3, group_batches=10)
    sampler.set_epoch(0)
    first = list(sampler)
    assert sorted(first) == list(range(1000)) and len(sampler) == 1000

    def padded(order):  # tokens computed when each batch of 16 is padded to its longest row
        return sum(16 * max(lengths[i] for i in order[s:s + 16]) for s in range(0, len(order), 16))

    random_order = torch.randperm(1000, generator=torch.Generator().manual_seed(1)).tolist()
    # Random batches of lengths uniform on 2..99 are about half padding; grouped ones a few percent.
    assert sum(lengths) / padded(random_order) < 0.6 and sum(lengths) / padded(first) > 0.9
    # The batches come in a random order, not longest first: the batch lengths are not sorted within a group.
    longest = [max(lengths[i] for i in first[s:s + 16]) for s in range(0, 160, 16)]
    assert longest != sorted(longest, reverse=True) and longest != sorted(longest)
    sampler.set_epoch(1)
    assert list(sampler) != first
    sampler.set_epoch(0)
    assert list(sampler) == first  # a resumed run replays an epoch exactly


@pytest.mark.parametrize("script", ["finetune_classification", "finetune_ner", "finetune_qa"])
def test_grouping_by_length_is_off_unless_asked_for_on_the_command_line_or_in_a_config_file(tmp_path, script):
    from tests.conftest import load_script

    parse = load_script(script).parse_args
    required = ["--output_dir", str(tmp_path), "--train_file", "x.txt"]
    assert not parse(required).group_by_length
    assert parse([*required, "--group_by_length"]).group_by_length
    config = write(tmp_path / "recipe.yaml", "group_by_length: true\n")
    assert parse([*required, "--config_file", config]).group_by_length
    assert not parse([*required, "--config_file", config, "--no_group_by_length"]).group_by_length
