"""Property-based tests (hypothesis) over shapes, masks and lengths: positions, attention, padding, collators; and
the shares of the masking collator's choices."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sinebert import SineBertModel
from sinebert.layout_sinebert import padding_mask
from sinebert.modeling_sinebert import SineBertAttention, sinusoidal_encoding
from sinebert.training.mlm import MaskingCollator, pack_texts
from tests.conftest import tiny_config

FAST = settings(max_examples=40, deadline=None)


@FAST
@given(dim=st.integers(1, 64), positions=st.lists(st.integers(0, 200_000), min_size=0, max_size=20))
def test_sinusoids_match_the_formula_at_any_position(dim, positions):
    ours = sinusoidal_encoding(torch.tensor(positions, dtype=torch.long), dim).numpy()
    i = np.arange(dim)
    angles = np.array(positions, dtype=np.float64)[:, None] / 10000.0 ** ((i - i % 2) / dim)
    expected = np.where(i % 2 == 0, np.sin(angles), np.cos(angles))
    np.testing.assert_allclose(ours, expected.reshape(len(positions), dim), atol=1e-5)


@st.composite
def attention_case(draw):
    heads = draw(st.integers(1, 4))
    head_dim = draw(st.integers(1, 8))
    batch = draw(st.integers(1, 3))
    seq = draw(st.integers(1, 16))
    mask = draw(st.lists(st.lists(st.booleans(), min_size=seq, max_size=seq), min_size=batch, max_size=batch))
    seed = draw(st.integers(0, 2**16))
    return heads, head_dim, torch.tensor(mask, dtype=torch.long), seed


@FAST
@given(case=attention_case())
def test_eager_and_sdpa_agree_and_stay_finite_for_any_mask(case):
    heads, head_dim, mask, seed = case
    torch.manual_seed(seed)
    config = tiny_config(hidden_size=heads * head_dim, num_attention_heads=heads)
    eager = SineBertAttention(config, 0).eval()
    x = torch.randn(*mask.shape, heads * head_dim)
    outputs = {}
    for implementation in ("eager", "sdpa"):
        eager.config._attn_implementation = implementation
        with torch.no_grad():
            outputs[implementation], _ = eager(x, padding_mask(mask))
    assert torch.isfinite(outputs["eager"]).all()
    torch.testing.assert_close(outputs["eager"], outputs["sdpa"], atol=1e-5, rtol=1e-5)
    empty = mask.sum(-1) == 0  # rows with nothing to attend to give zero attention, i.e. the output bias
    bias = eager.out_proj.bias
    assert torch.allclose(outputs["eager"][empty], bias.expand_as(outputs["eager"][empty]), atol=1e-6)


@FAST
@given(
    length=st.integers(1, 24), padding=st.integers(1, 12), seed=st.integers(0, 2**16),
    window=st.sampled_from([None, 2, 5]), implementation=st.sampled_from(["eager", "sdpa"]),
)
def test_padding_never_changes_real_tokens(length, padding, seed, window, implementation):
    torch.manual_seed(seed)
    local = dict(sliding_window=window, global_attn_every_n_layers=2) if window else {}
    model = SineBertModel(tiny_config(**local)).eval()
    model.config._attn_implementation = implementation
    ids = torch.randint(5, 99, (1, length))
    padded = torch.cat([ids, torch.zeros(1, padding, dtype=torch.long)], dim=1)
    mask = torch.cat([torch.ones(1, length), torch.zeros(1, padding)], dim=1).long()
    with torch.no_grad():
        plain = model(input_ids=ids).last_hidden_state
        with_padding = model(input_ids=padded, attention_mask=mask).last_hidden_state[:, :length]
    torch.testing.assert_close(plain, with_padding, atol=1e-5, rtol=1e-5)


class ToyTokenizer:
    """The parts of a tokenizer the collator uses: 5 special tokens, vocabulary of 50."""

    pad_token_id, cls_token_id, sep_token_id, mask_token_id = 0, 2, 3, 4
    all_special_ids = [0, 1, 2, 3, 4]

    def __len__(self):
        return 50


@FAST
@given(
    blocks=st.lists(st.lists(st.integers(1, 49), min_size=1, max_size=30), min_size=1, max_size=6),
    probability=st.floats(0.05, 0.6), seed=st.integers(0, 1000), epoch=st.integers(0, 3),
)
def test_masking_collator_invariants(blocks, probability, seed, epoch):
    collator = MaskingCollator(ToyTokenizer(), probability, seed=seed, epoch=epoch)
    examples = [{"input_ids": block, "example_id": i} for i, block in enumerate(blocks)]
    batch = collator(examples)
    assert batch["input_ids"].shape == (len(blocks), max(map(len, blocks)))
    for row, block in enumerate(blocks):
        n = len(block)
        original = torch.tensor(block)
        ids, labels, mask = batch["input_ids"][row], batch["labels"][row], batch["attention_mask"][row]
        assert mask[:n].all() and not mask[n:].any() and (labels[n:] == -100).all()
        chosen = labels[:n] != -100
        assert torch.equal(labels[:n][chosen], original[chosen])  # labels hold the original tokens
        assert not (chosen & torch.isin(original, torch.tensor([0, 1, 2, 3, 4]))).any()  # specials never masked
        assert torch.equal(ids[:n][~chosen], original[~chosen])  # unchosen tokens untouched
        # Every block with an ordinary token predicts one at least (short blocks often draw none at 15%).
        assert chosen.any() or torch.isin(original, torch.tensor([0, 1, 2, 3, 4])).all()
    again = collator(list(reversed(examples)))  # masks follow the example, not its place in the batch
    assert torch.equal(again["labels"][len(blocks) - 1, : len(blocks[0])], batch["labels"][0, : len(blocks[0])])


def test_masking_collator_chooses_its_share_and_masks_80_replaces_10_keeps_10_percent():
    """BERT's recipe over 20,000 ordinary tokens (about 3,000 chosen: one standard error of a share is under 0.01)."""
    generator = torch.Generator().manual_seed(0)
    blocks = torch.randint(5, 50, (200, 100), generator=generator).tolist()
    batch = MaskingCollator(ToyTokenizer(), 0.15, seed=1)([{"input_ids": b, "example_id": i} for i, b in
                                                           enumerate(blocks)])
    chosen = batch["labels"] != -100
    ids, original = batch["input_ids"][chosen], batch["labels"][chosen]
    masked, kept = (ids == ToyTokenizer.mask_token_id).float().mean(), (ids == original).float().mean()
    assert chosen.float().mean().item() == pytest.approx(0.15, abs=0.01)
    # A random replacement is the original token 1 time in 50 here.
    assert (masked.item(), kept.item(), 1 - masked.item() - kept.item()) == pytest.approx((0.8, 0.102, 0.098), abs=0.03)


class WordTokenizer:
    """Splits on spaces; ids are the word lengths plus 10 (enough to check the packing arithmetic)."""

    cls_token_id, sep_token_id = 2, 3

    def __call__(self, texts, add_special_tokens=False):
        return {"input_ids": [[10 + len(word) for word in text.split()] for text in texts]}


@FAST
@given(
    texts=st.lists(st.text(alphabet="ab ", min_size=0, max_size=40), min_size=1, max_size=10),
    block_size=st.integers(3, 16),
)
def test_packing_keeps_every_token_in_order(texts, block_size):
    blocks = pack_texts(texts, WordTokenizer(), block_size)
    assert all(block[0] == 2 and len(block) <= block_size for block in blocks)
    stream = [token for block in blocks for token in block[1:]]
    expected = [token for text in texts for token in [10 + len(w) for w in text.split()] + [3]]
    assert stream == expected
