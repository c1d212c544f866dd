"""Train a BERT-style WordPiece tokenizer, a `SineBertTokenizer`, and save it for `AutoTokenizer.from_pretrained`."""

from collections.abc import Iterable, Iterator

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from ..tokenization_sinebert import SineBertTokenizer
from .errors import UserError

SPECIAL_TOKENS = {
    "pad_token": "[PAD]",
    "unk_token": "[UNK]",
    "cls_token": "[CLS]",
    "sep_token": "[SEP]",
    "mask_token": "[MASK]",
}


def train_wordpiece(
    texts: Iterable[str],
    vocab_size: int = 16000,
    min_frequency: int = 2,
    lowercase: bool = True,
    special_tokens: dict[str, str] | None = None,
    model_max_length: int = 512,
) -> SineBertTokenizer:
    """WordPiece with BERT's normalisation and pre-tokenisation; [CLS] A [SEP] (B [SEP]) with token types 0/1.

    The special tokens take ids 0-4 in the order pad, unk, cls, sep, mask, so `pad_token_id` is 0 as
    `SineBertConfig` assumes by default.
    """
    special_tokens = {**SPECIAL_TOKENS, **(special_tokens or {})}
    if set(special_tokens) != set(SPECIAL_TOKENS):
        raise UserError(
            f"special_tokens must name exactly {sorted(SPECIAL_TOKENS)}, got {sorted(special_tokens)}."
        )
    if vocab_size <= len(special_tokens):
        raise UserError(f"vocab_size={vocab_size} leaves no room beyond the {len(special_tokens)} special tokens.")
    cls, sep = special_tokens["cls_token"], special_tokens["sep_token"]
    tokenizer = Tokenizer(models.WordPiece(unk_token=special_tokens["unk_token"]))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=lowercase, strip_accents=lowercase)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece()
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=list(special_tokens.values())
    )
    tokenizer.train_from_iterator(_non_empty(texts), trainer=trainer)
    tokenizer.model = _renumbered(tokenizer.get_vocab(), special_tokens)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{cls}:0 $A:0 {sep}:0",
        pair=f"{cls}:0 $A:0 {sep}:0 $B:1 {sep}:1",
        special_tokens=[(cls, tokenizer.token_to_id(cls)), (sep, tokenizer.token_to_id(sep))],
    )
    return SineBertTokenizer(
        tokenizer_object=tokenizer,
        model_max_length=model_max_length,
        model_input_names=["input_ids", "token_type_ids", "attention_mask"],
        **special_tokens,
    )


def _renumbered(vocab: dict[str, int], special_tokens: dict[str, str]) -> models.WordPiece:
    """The trained vocabulary with ids that depend only on its tokens: the special tokens first, then the rest in
    sorted order.

    The trainer numbers its '##' sub-word pieces in hash-map order, which changes from run to run (tokenizers issue
    #1794), so two trainings on the same text gave models with different ids for the same tokens (four of four on
    3,000 SST-2 sentences). WordPiece splits text by the vocabulary alone (longest match first), so new ids change no
    tokenisation. Ties in the pair counts, broken in the same order, can also change the vocabulary itself (6 of 700
    tokens in 1 of 6 trainings on the test corpus), which no setting of the trainer prevents.
    """
    specials = list(special_tokens.values())
    ordered = specials + sorted(set(vocab) - set(specials))
    return models.WordPiece({token: i for i, token in enumerate(ordered)}, unk_token=special_tokens["unk_token"])


def _non_empty(texts: Iterable[str]) -> Iterator[str]:
    count = 0
    for text in texts:
        if text and not text.isspace():
            count += 1
            yield text
    if count == 0:
        raise UserError("The tokenizer got no text: every input line was empty; check the files you passed.")
