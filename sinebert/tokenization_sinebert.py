"""SineBERT's tokenizer: the `tokenizers` WordPiece backend, plus `case_ids` for models that read letter case.

A lower-cased vocabulary maps "Apple", "apple" and "APPLE" to the same ids. A model with
`SineBertConfig.letter_case` gets the case back as one more input: per token, the case of the word it belongs to,
taken from the original text through the token's offsets. The tokenizer returns it only when `"case_ids"` is in its
`model_input_names` (saved in tokenizer_config.json), so for every other model it is the plain backend.
"""

from transformers import TokenizersBackend

# The values of `case_ids`: the rows of the model's case embedding (`SineBertEmbeddings.case_embeddings`).
LOWER, CAPITALISED, UPPER = 0, 1, 2
CASE_INPUT = "case_ids"


def letter_case(word: str) -> int:
    """UPPER for two or more cased letters all in upper case ("NASA"), CAPITALISED for a word that starts with an
    upper-case letter ("London", "I", "McCain"), LOWER for the rest (lower case, digits, punctuation)."""
    cased = [c for c in word if c.isupper() or c.islower()]
    if len(cased) > 1 and all(c.isupper() for c in cased):
        return UPPER
    return CAPITALISED if word[:1].isupper() else LOWER


def encoding_case_ids(encoding, sequences: tuple, is_split_into_words: bool) -> list[int]:
    """`case_ids` of one row: `encoding` is a `tokenizers.Encoding`, `sequences` the row's text (and text pair),
    each a string or, with `is_split_into_words`, a list of words. Special tokens and padding are LOWER."""
    cases = {}  # (sequence, word) -> case
    for sequence, word, (start, end) in zip(encoding.sequence_ids, encoding.word_ids, encoding.offsets):
        if sequence is not None and (sequence, word) not in cases:
            source = sequences[sequence]
            text = source[word] if is_split_into_words else _word_around(source, start, end)
            cases[(sequence, word)] = letter_case(text)
    return [cases.get(key, LOWER) for key in zip(encoding.sequence_ids, encoding.word_ids)]


def _word_around(text: str, start: int, end: int) -> str:
    """The whole word holding the token at text[start:end], even where a window of a long input cuts the word:
    BERT's pre-tokenizer ends words at whitespace and punctuation, so the word is the run of letters and digits."""
    while start > 0 and text[start - 1].isalnum():
        start -= 1
    while end < len(text) and text[end].isalnum():
        end += 1
    return text[start:end]


class SineBertTokenizer(TokenizersBackend):
    """A `tokenizers`-backed tokenizer that adds `case_ids` (LOWER, CAPITALISED or UPPER per token) to its outputs
    when `"case_ids"` is in `model_input_names`; `pad` pads them with LOWER."""

    def _encode_plus(self, text, text_pair=None, *args, is_split_into_words: bool = False, return_tensors=None,
                     **kwargs):
        encoded = super()._encode_plus(text, text_pair, *args, is_split_into_words=is_split_into_words,
                                       return_tensors=return_tensors, **kwargs)
        if CASE_INPUT not in self.model_input_names or not encoded.encodings:
            return encoded
        batched = isinstance(text, (list, tuple)) and (
            not is_split_into_words or (len(text) > 0 and isinstance(text[0], (list, tuple)))
        )
        texts = list(text) if batched else [text]
        pairs = (list(text_pair) if batched else [text_pair]) if text_pair else [None] * len(texts)
        samples = [(t,) if p is None else (t, p) for t, p in zip(texts, pairs)]
        # Long inputs split into windows (return_overflowing_tokens) give several rows per sample.
        owners = encoded.get("overflow_to_sample_mapping", range(len(encoded.encodings)))
        rows = [
            encoding_case_ids(encoding, samples[int(owner)], is_split_into_words)
            for encoding, owner in zip(encoded.encodings, owners)
        ]
        ids = encoded["input_ids"]
        if return_tensors is not None:
            encoded[CASE_INPUT] = type(encoded)({CASE_INPUT: rows}, tensor_type=return_tensors)[CASE_INPUT]
        else:
            # A single unbatched input comes back as flat lists.
            encoded[CASE_INPUT] = rows if ids and isinstance(ids[0], list) else rows[0]
        return encoded

    def _pad(self, encoded_inputs, max_length=None, padding_strategy=None, pad_to_multiple_of=None,
             padding_side=None, return_attention_mask=None):
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
