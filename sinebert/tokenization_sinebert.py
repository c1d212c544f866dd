"""SineBERT's tokenizer: the `tokenizers` WordPiece backend, plus `case_ids` for models that read letter case.

A lower-cased vocabulary maps "Apple", "apple" and "APPLE" to the same ids. A model with
`SineBertConfig.letter_case` gets the case back as one more input: per token, the case of the word it belongs to,
taken from the original text through the token's offsets. The tokenizer returns it only when `"case_ids"` is in its
`model_input_names` (saved in tokenizer_config.json), so for every other model it is the plain backend.
"""

import bisect
import re

from transformers import TokenizersBackend
from transformers.utils import PaddingStrategy

# The values of `case_ids`: the rows of the model's case embedding (`SineBertEmbeddings.case_embeddings`).
LOWER, CAPITALISED, UPPER = 0, 1, 2
CASE_INPUT = "case_ids"
# Half of a UTF-16 surrogate pair on its own (what a JSON "\ud800" or bytes decoded with errors="surrogateescape"
# leave in a str): not a Unicode character, and `tokenizers` refuses it with a TypeError about its input types.
LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def cased_letters(text: str) -> list[str]:
    return [c for c in text if c.isupper() or c.islower()]


def letter_case(word: str) -> int:
    """UPPER for two or more cased letters all in upper case ("NASA", "U.S."), CAPITALISED for a word whose first
    cased letter is upper case ("London", "I", "McCain", "(Paris"), LOWER for the rest ("eBay", "1990s", ",")."""
    cased = cased_letters(word)
    if len(cased) > 1 and all(c.isupper() for c in cased):
        return UPPER
    return CAPITALISED if cased and cased[0].isupper() else LOWER


class Words:
    """The words of one text, for `case_ids`: a token takes the case of its word, the pre-split word or in raw text
    the run of characters between spaces, so that "U.S." gets the same case either way."""

    def __init__(self, text: str | list[str], is_split_into_words: bool):
        self.text, self.split = text, is_split_into_words
        if not is_split_into_words:
            spans = [match.span() for match in re.finditer(r"\S+", text)]
            self.starts, self.ends = [s for s, _ in spans], [e for _, e in spans]

    def case(self, word: int, start: int, end: int) -> int:
        """The case of the token at characters start:end (of the pre-split word `word`, or of the raw text);
        LOWER for a token without letters (punctuation, digits)."""
        if self.split:
            piece, whole = self.text[word][start:end], self.text[word]
        else:
            i = bisect.bisect_right(self.starts, start) - 1  # the word starting at or before the token
            piece, whole = self.text[start:end], self.text[self.starts[i] : self.ends[i]]
        return letter_case(whole) if cased_letters(piece) else LOWER


def check_text(value):
    """ValueError naming the first lone surrogate in a text, a pair of texts or a (batch of) pre-split words."""
    if isinstance(value, str):
        found = LONE_SURROGATE.search(value)
        if found:
            start = max(0, found.start() - 20)
            raise ValueError(
                f"The text {value[start:found.start() + 20]!r} holds a lone surrogate (U+{ord(found.group()):04X}) at "
                f"character {found.start()}, which is not a Unicode character; decode the text's bytes with "
                "errors='replace' or remove it."
            )
    elif isinstance(value, (list, tuple)):
        for item in value:
            check_text(item)


def encoding_case_ids(encoding, words: tuple[Words, ...]) -> list[int]:
    """`case_ids` of one row, a `tokenizers.Encoding` of the text (and text pair) whose `words` are given; special
    tokens and padding are LOWER."""
    return [
        LOWER if sequence is None else words[sequence].case(word, start, end)
        for sequence, word, (start, end) in zip(encoding.sequence_ids, encoding.word_ids, encoding.offsets)
    ]


class SineBertTokenizer(TokenizersBackend):
    """A `tokenizers`-backed tokenizer that refuses text with lone surrogates in one sentence, and adds `case_ids`
    (LOWER, CAPITALISED or UPPER per token) to its outputs when `"case_ids"` is in `model_input_names`; `pad` pads
    them with LOWER."""

    def _encode_plus(self, text, text_pair=None, *args, is_split_into_words: bool = False, return_tensors=None,
                     **kwargs):
        check_text(text)
        check_text(text_pair)
        encoded = super()._encode_plus(text, text_pair, *args, is_split_into_words=is_split_into_words,
                                       return_tensors=return_tensors, **kwargs)
        if CASE_INPUT not in self.model_input_names or not encoded.encodings:
            return encoded
        batched = isinstance(text, (list, tuple)) and (
            not is_split_into_words or (len(text) > 0 and isinstance(text[0], (list, tuple)))
        )
        texts = list(text) if batched else [text]
        pairs = (list(text_pair) if batched else [text_pair]) if text_pair else [None] * len(texts)
        samples = [
            tuple(Words(part, is_split_into_words) for part in ((t,) if p is None else (t, p)))
            for t, p in zip(texts, pairs)
        ]
        # Long inputs split into windows (return_overflowing_tokens) give several rows per sample.
        owners = encoded.get("overflow_to_sample_mapping", range(len(encoded.encodings)))
        rows = [encoding_case_ids(encoding, samples[int(owner)]) for encoding, owner in zip(encoded.encodings, owners)]
        ids = encoded["input_ids"]
        if return_tensors is not None:
            encoded[CASE_INPUT] = type(encoded)({CASE_INPUT: rows}, tensor_type=return_tensors)[CASE_INPUT]
        else:
            # A single unbatched input comes back as flat lists.
            encoded[CASE_INPUT] = rows if ids and isinstance(ids[0], list) else rows[0]
        return encoded

    def _pad(self, encoded_inputs, max_length=None, padding_strategy=PaddingStrategy.DO_NOT_PAD,
             pad_to_multiple_of=None, padding_side=None, return_attention_mask=None):
        case_ids = encoded_inputs.pop(CASE_INPUT, None)
        padded = super()._pad(encoded_inputs, max_length, padding_strategy, pad_to_multiple_of, padding_side,
                              return_attention_mask)
        if case_ids is not None:
            extra = [LOWER] * (len(padded[self.model_input_names[0]]) - len(case_ids))
            side = padding_side or self.padding_side
            padded[CASE_INPUT] = list(case_ids) + extra if side == "right" else extra + list(case_ids)
        return padded


def with_case_ids(tokenizer) -> SineBertTokenizer:
    """`tokenizer` as a SineBertTokenizer that returns `case_ids` (the same vocabulary, special tokens and
    settings)."""
    names = [name for name in tokenizer.model_input_names if name != CASE_INPUT] + [CASE_INPUT]
    if isinstance(tokenizer, SineBertTokenizer):
        tokenizer.model_input_names = names
        return tokenizer
    settings = {key: value for key, value in tokenizer.init_kwargs.items() if key not in ("backend", "vocab_file")}
    return SineBertTokenizer(tokenizer_object=tokenizer.backend_tokenizer, **(settings | {"model_input_names": names}))


def without_case_ids(tokenizer):
    """`tokenizer`, returning no `case_ids` any more."""
    if CASE_INPUT in tokenizer.model_input_names:
        tokenizer.model_input_names = [name for name in tokenizer.model_input_names if name != CASE_INPUT]
    return tokenizer


SineBertTokenizer.register_for_auto_class("AutoTokenizer")

__all__ = ["SineBertTokenizer"]
