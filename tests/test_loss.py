"""The masked-LM head's chunked cross-entropy against PyTorch's on float32 copies of the logits."""

import pytest
import torch
import torch.nn.functional as F

from sinebert import SineBertForMaskedLM
from sinebert.loss_sinebert import vocabulary_cross_entropy
from tests.conftest import tiny_config


def _logits_and_labels(dtype: torch.dtype, rows: int = 37, vocab: int = 50):
    generator = torch.Generator().manual_seed(0)
    logits = (torch.randn(rows, vocab, generator=generator) * 4).to(dtype).requires_grad_()
    labels = torch.randint(0, vocab, (rows,), generator=generator)
    labels[[1, rows - 2]] = -100
    return logits, labels


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chunks_give_pytorchs_losses_and_gradients_in_the_logits_dtype(dtype, monkeypatch):
    monkeypatch.setattr("sinebert.loss_sinebert.CPU_CHUNK_ENTRIES", 8 * 50)  # 5 chunks, the last one short
    logits, labels = _logits_and_labels(dtype)
    weights = torch.rand(len(labels))  # a different incoming gradient for each row
    expected = F.cross_entropy(logits.float(), labels, reduction="none")
    (expected * weights).sum().backward()
    expected_grad, logits.grad = logits.grad, None
    ours = vocabulary_cross_entropy(logits, labels)
    (ours * weights).sum().backward()
    assert ours.dtype == torch.float32 and logits.grad.dtype == dtype
    torch.testing.assert_close(ours, expected)
    torch.testing.assert_close(logits.grad, expected_grad)
    assert ours[1] == 0 and logits.grad[-2].abs().max() == 0  # ignored rows: no loss, no gradient


def test_gradcheck_in_float64():
    logits, labels = _logits_and_labels(torch.float64, rows=6, vocab=7)
    assert torch.autograd.gradcheck(lambda x: vocabulary_cross_entropy(x, labels), (logits,))


def test_the_backward_pass_leaves_float32_logits_as_they_were():
    """In float32 a chunk's cast is the logits themselves unless copied: the gradient must not be computed in them."""
    logits, labels = _logits_and_labels(torch.float32)
    before = logits.detach().clone()
    vocabulary_cross_entropy(logits, labels).sum().backward()
    assert torch.equal(logits.detach(), before)


@pytest.mark.parametrize("sparse_prediction", [True, False])
def test_the_masked_lm_loss_is_the_mean_over_the_labelled_tokens(sparse_prediction):
    model = SineBertForMaskedLM(tiny_config(sparse_prediction=sparse_prediction)).eval()
    input_ids = torch.randint(5, 99, (2, 10))
    labels = torch.full_like(input_ids, -100)
    labels[0, [1, 4]], labels[1, 7] = input_ids[0, [1, 4]], input_ids[1, 7]
    output = model(input_ids=input_ids, labels=labels)
    logits = output.logits.reshape(-1, output.logits.shape[-1])  # (3, vocab) predicted rows, or (20, vocab)
    expected = F.cross_entropy(logits.float(), labels.flatten()[labels.flatten() != -100] if sparse_prediction
                               else labels.flatten())
    torch.testing.assert_close(output.loss, expected)
