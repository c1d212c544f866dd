"""SineBertTokenizer: `case_ids` (the letter case of each token's word) for every input form the pipelines and
scripts use, padding, saving and loading."""

import pytest
import torch
from transformers import AutoTokenizer

import sinebert  # noqa: F401  (registers SineBertTokenizer)
from sinebert.tokenization_sinebert import (
    CAPITALISED,
    LOWER,
    UPPER,
    SineBertTokenizer,
    letter_case,
    with_case_ids,
    without_case_ids,
)

L, C, U = LOWER, CAPITALISED, UPPER


@pytest.fixture(scope="module")
def cased(tokenizer_dir):
    return with_case_ids(AutoTokenizer.from_pretrained(tokenizer_dir))


def word_cases(encoding, row=0):
    """The case of each word, read at its tokens (all tokens of a word must agree)."""
    cases = {}
    for word, case in zip(encoding.word_ids(row), encoding["case_ids"][row]):
        if word is not None:
            assert cases.setdefault(word, case) == case
    return [cases[word] for word in sorted(cases)]


def test_letter_case_classes():
    words = ("the", "42", ",", "London", "I", "McCain", "(Paris", "NASA", "U.S.", "ÉTÉ", "eBay", "1990s")
    assert [letter_case(w) for w in words] == [L, L, L, C, C, C, C, U, U, U, L, L]


def test_raw_text_and_the_same_words_pre_split_get_the_same_case(cased):
    words = ["The", "U.S.", "and", "McDonald's", "(", "NYSE", ")", "said", "1990s", "sales", "rose", "."]
    pre_split = cased([words], is_split_into_words=True)
    raw = cased(["The U.S. and McDonald's ( NYSE ) said 1990s sales rose ."])
    assert raw["input_ids"] == pre_split["input_ids"] and raw["case_ids"] == pre_split["case_ids"]
    # Pieces with letters take their word's case; pieces without (the dots of "U.S.", brackets, digits) are lower.
    word_case = [C, U, L, C, L, U, L, L, L, L, L, L]
    expected = [
        L if word is None or not any(ch.isalpha() for ch in words[word][start:end]) else word_case[word]
        for word, (start, end) in zip(pre_split.word_ids(0), pre_split.encodings[0].offsets)
    ]
    assert raw["case_ids"][0] == expected
    assert cased.convert_ids_to_tokens(raw["input_ids"][0]).count(".") == 3  # the dots are tokens of their own


def test_raw_text_pairs_get_the_case_of_each_word_and_special_tokens_are_lower(cased):
    encoding = cased(["Maria visited the BBC in Cardiff"], ["who is MARIA ?"])
    tokens = cased.convert_ids_to_tokens(encoding["input_ids"][0])
    cases = encoding["case_ids"][0]
    assert len(cases) == len(tokens)
    assert [c for t, c in zip(tokens, cases) if t in ("[CLS]", "[SEP]")] == [L, L, L]
    words = {}
    for sequence, word, case in zip(encoding.sequence_ids(0), encoding.word_ids(0), cases):
        if sequence is not None:
            words.setdefault((sequence, word), set()).add(case)
    assert [words[(0, w)] for w in range(6)] == [{C}, {L}, {L}, {U}, {L}, {C}]
    assert [words[(1, w)] for w in range(4)] == [{L}, {L}, {U}, {L}]


def test_pre_split_words_single_inputs_and_tensors(cased):
    words = [["EU", "rejects", "German", "call"], ["Peter", "Blackburn"]]
    encoding = cased(words, is_split_into_words=True)
    assert word_cases(encoding, 0) == [U, L, C, L]
    assert word_cases(encoding, 1) == [C, C]
    single = cased("Peter Blackburn")
    assert isinstance(single["case_ids"][0], int) and len(single["case_ids"]) == len(single["input_ids"])
    tensors = cased(["Peter Blackburn", "a film"], padding=True, return_tensors="pt")
    assert tensors["case_ids"].shape == tensors["input_ids"].shape and tensors["case_ids"].dtype == torch.long
    assert (tensors["case_ids"][tensors["attention_mask"] == 0] == L).all()
    assert tensors["case_ids"][0, 1] == C


def test_windows_of_a_long_input_keep_the_case_of_words_they_cut(cased):
    text = "Maria visited the BBC in Cardiff , and then Blackburn , Mississauga and Ouagadougou"
    expected = word_cases(cased([text]))
    assert expected == [C, L, L, U, L, C, L, L, L, C, L, C, L, C]
    windows = cased(text, max_length=6, truncation=True, stride=2, return_overflowing_tokens=True)
    for row, cases in enumerate(windows["case_ids"]):
        assert cases == [L if word is None else expected[word] for word in windows.word_ids(row)]
    # Some window starts inside a word (with a continuation piece), where the piece alone is lower case.
    firsts = [cased.convert_ids_to_tokens(ids)[1] for ids in windows["input_ids"]]
    assert any(token.startswith("##") for token in firsts), firsts


@pytest.mark.parametrize("side", ["right", "left"])
def test_pad_pads_case_ids_like_the_tokens(cased, side):
    rows = cased(["Peter", "the BBC film"])
    padded = cased.pad(rows, padding_side=side, return_tensors="pt")
    short = rows["case_ids"][0]
    extra = [L] * (padded["input_ids"].shape[1] - len(short))
    assert padded["case_ids"][0].tolist() == (short + extra if side == "right" else extra + short)
    assert padded["case_ids"][1].tolist() == rows["case_ids"][1]


def test_saved_and_reloaded_with_auto_tokenizer_and_switched_off(cased, tmp_path):
    cased.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    assert isinstance(loaded, SineBertTokenizer) and loaded.model_input_names[-1] == "case_ids"
    assert loaded("Peter BBC")["case_ids"] == cased("Peter BBC")["case_ids"]
    assert (tmp_path / "tokenization_sinebert.py").is_file()  # for trust_remote_code where sinebert is missing
    plain = without_case_ids(loaded)
    assert "case_ids" not in plain("Peter BBC") and "case_ids" not in plain.model_input_names
