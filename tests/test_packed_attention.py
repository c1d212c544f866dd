"""The GPU fast path, checked on the CPU: full attention on the sequences packed in one row ("varlen"), with
PyTorch's CUDA kernel replaced by a per-sequence reference, equals the eager reference in every head, with gradients;
what runs is what attention_kernels() reports; and where the kernel does not apply, the buckets run, by name."""

import math

import pytest
import torch

from benchmarks.gpu_check import DeviceReads
from sinebert import SineBertForMaskedLM, SineBertForSequenceClassification, SineBertModel
from sinebert.attention_sinebert import packed_attention, varlen_available
from sinebert.layout_sinebert import TokenRows
from tests.conftest import tiny_config


def per_sequence_attention(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k):
    """softmax(Q K^T / sqrt(head_dim)) V within each packed sequence: `(total, heads, head_dim)` in and out."""
    assert cu_seq_q.dtype == torch.int32 and torch.equal(cu_seq_q, cu_seq_k) and max_q == max_k
    lengths = (cu_seq_q[1:] - cu_seq_q[:-1]).tolist()
    assert max_q == max(lengths) and min(lengths) > 0
    outputs = []
    for start, end in zip(cu_seq_q[:-1].tolist(), cu_seq_q[1:].tolist()):
        q, k, v = (t[start:end].transpose(0, 1) for t in (query, key, value))  # (heads, n, head_dim)
        weights = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]), dim=-1)
        outputs.append((weights @ v).transpose(0, 1))
    return torch.cat(outputs)


@pytest.fixture
def varlen_on_cpu(monkeypatch):
    """The "varlen" kernel available on the CPU in float32, running the reference; returns each call's lengths."""
    calls = []

    def kernel(*args):
        calls.append((args[3][1:] - args[3][:-1]).tolist())
        return per_sequence_attention(*args)

    monkeypatch.setattr("sinebert.attention_sinebert.varlen_available", lambda device, dtype: True)
    monkeypatch.setattr("sinebert.attention_sinebert._varlen_attn", kernel)
    return calls


def _pair(cls, **overrides):
    torch.manual_seed(0)
    eager = cls(tiny_config(**overrides))
    eager.config._attn_implementation = "eager"
    fast = cls(tiny_config(**overrides))
    fast.load_state_dict(eager.state_dict())
    return eager, fast


def _batch(lengths, seq=12):
    mask = (torch.arange(seq) < torch.tensor(lengths)[:, None]).long()
    ids = torch.randint(5, 99, mask.shape, generator=torch.Generator().manual_seed(1))
    return ids, mask


def _assert_same(eager, fast, outputs):
    torch.testing.assert_close(outputs[1], outputs[0], atol=1e-5, rtol=1e-5)
    for (name, p), q in zip(eager.named_parameters(), fast.parameters()):
        if p.grad is not None:
            torch.testing.assert_close(q.grad, p.grad, atol=1e-5, rtol=1e-4, msg=name)


def test_no_gpu_no_half_precision_no_varlen():
    cuda = torch.device("cuda")
    assert not varlen_available(torch.device("cpu"), torch.bfloat16)
    assert not varlen_available(cuda, torch.float32)  # FlashAttention has no float32: the buckets run sdpa
    assert not packed_attention("eager", cuda, torch.bfloat16, 0.0)


@pytest.mark.parametrize("positions", ["absolute", "rotary"])
@pytest.mark.parametrize("cls", [SineBertModel, SineBertForSequenceClassification])
def test_packed_rows_equal_the_reference_and_its_gradients(cls, positions, varlen_on_cpu):
    eager, fast = _pair(cls, num_labels=3, classifier_pooling="mean", position_embedding_type=positions)
    ids, mask = _batch([12, 3, 0, 7] if cls is SineBertModel else [12, 3, 5, 7])
    assert fast.attention_kernels() == ["full_attention via varlen"] * 2
    outputs = []
    for model in (eager, fast):
        output = model(input_ids=ids, attention_mask=mask, return_dict=False)[0]
        values = output[mask.bool()] if cls is SineBertModel else output
        values.sum().backward()
        outputs.append(values)
    _assert_same(eager, fast, outputs)
    # One kernel call per layer, on the sequences longest first; the one without tokens is left out.
    expected = [12, 7, 3] if cls is SineBertModel else [12, 7, 5, 3]
    assert varlen_on_cpu == [expected, expected]  # one call in each of the 2 layers (the eager reference: none)


def test_a_batch_without_padding_is_packed_too_so_that_what_runs_is_what_is_reported(varlen_on_cpu):
    eager, fast = _pair(SineBertModel)
    ids, mask = _batch([12, 12])
    with torch.no_grad():
        torch.testing.assert_close(fast(input_ids=ids).last_hidden_state, eager(input_ids=ids).last_hidden_state,
                                   atol=1e-5, rtol=1e-5)
    assert varlen_on_cpu == [[12, 12], [12, 12]]


@pytest.mark.parametrize("positions", ["absolute", "rotary"])
def test_masked_lm_with_the_rows_read_and_token_dropping_on_packed_rows(positions, varlen_on_cpu):
    overrides = dict(num_hidden_layers=4, sparse_prediction=True, token_dropping_layers=[1, 3],
                     token_dropping_keep=0.4, position_embedding_type=positions)
    eager, fast = (model.train() for model in _pair(SineBertForMaskedLM, **overrides))
    ids, mask = _batch([12, 5, 9])
    chosen = (torch.rand(mask.shape, generator=torch.Generator().manual_seed(2)) < 0.3) & mask.bool()
    labels = torch.where(chosen, ids, -100)
    outputs = []
    for model in (eager, fast):
        torch.manual_seed(3)  # the same tokens kept
        output = model(input_ids=ids, attention_mask=mask, labels=labels)
        output.loss.backward()
        outputs.append(output.logits)
    _assert_same(eager, fast, outputs)
    assert len(varlen_on_cpu) == 4 and varlen_on_cpu[0] == [12, 9, 5]  # layers 1 and 2 see the kept tokens only
    assert sum(varlen_on_cpu[1]) < sum(varlen_on_cpu[0])


def test_sliding_window_layers_keep_their_kernel_beside_packed_full_attention(varlen_on_cpu):
    local = dict(num_hidden_layers=4, sliding_window=3, global_attn_every_n_layers=2, global_attention_positions=[0])
    eager, fast = _pair(SineBertModel, **local)
    ids, mask = _batch([12, 6, 9])
    assert fast.attention_kernels() == ["full_attention via varlen",
                                        "sliding_attention(window=3, global=[0]) via local_blocked (full attention up "
                                        "to 4 tokens, sdpa up to 384)"] * 2
    with torch.no_grad():
        a, b = (model(input_ids=ids, attention_mask=mask).last_hidden_state for model in (eager, fast))
    torch.testing.assert_close(a[mask.bool()], b[mask.bool()], atol=1e-5, rtol=1e-5)
    assert len(varlen_on_cpu) == 2  # the two full-attention layers


def test_sliding_window_layers_whose_window_covers_the_batch_run_varlen_on_the_packed_rows(varlen_on_cpu):
    """A window of 11 reaches every key of sequences of at most 12 tokens: every layer is full attention."""
    local = dict(num_hidden_layers=4, sliding_window=11, global_attn_every_n_layers=2, global_attention_positions=[0])
    eager, fast = _pair(SineBertModel, **local)
    assert fast.attention_kernels(input_shape=(3, 12))[1] == (
        "sliding_attention(window=11, global=[0]) via varlen (the window covers the input: full attention)")
    ids, mask = _batch([12, 6, 9], seq=16)  # padded past the window: the longest sequence decides
    with torch.no_grad():
        a, b = (model(input_ids=ids, attention_mask=mask).last_hidden_state for model in (eager, fast))
    torch.testing.assert_close(a[mask.bool()], b[mask.bool()], atol=1e-5, rtol=1e-5)
    assert varlen_on_cpu == [[12, 9, 6]] * 4


def test_training_with_attention_dropout_runs_the_buckets_and_says_so(varlen_on_cpu):
    model = SineBertModel(tiny_config(attention_probs_dropout_prob=0.1)).train()
    assert model.attention_kernels() == ["full_attention via sdpa"] * 2  # varlen has no dropout
    ids, mask = _batch([12, 4])
    model(input_ids=ids, attention_mask=mask)
    assert varlen_on_cpu == []
    assert model.eval().attention_kernels() == ["full_attention via varlen"] * 2


def test_packing_knows_each_sequence_boundary_and_the_longest():
    mask = (torch.arange(10) < torch.tensor([4, 0, 10, 7])[:, None]).long()
    rows = TokenRows.from_mask(mask, 1, packed=True)
    assert rows.buckets == () and rows.packing.max_length == 10
    assert rows.packing.cu_seq_lens.tolist() == [0, 10, 17, 21] and rows.packing.cu_seq_lens.dtype == torch.int32
    assert rows.layout.slots[:10].tolist() == list(range(20, 30))  # the longest sequence (row 2) first


def test_the_gpu_path_reads_the_batch_back_once_per_decision(varlen_on_cpu, monkeypatch):
    """On a GPU each read of the batch's values waits for the device. A masked-LM training step on full blocks (the
    cram's, rotary positions) reads twice: the ids' range, and the labels' counts per row with their check. A padded
    batch of the classifier reads five times: whether every row starts with a token, the rows' lengths, the [CLS]
    rows' counts with their check, the ids with the token types, and the absolute positions' largest. (Before: 11 and
    14, one read per `nonzero`, `int()`, `bool()` and boolean mask; the token types had a read of their own.)"""
    monkeypatch.setattr("sinebert.attention_sinebert._varlen_attn", lambda q, *args: q)  # (the kernel's own reads)
    model = SineBertForMaskedLM(tiny_config(position_embedding_type="rotary", sparse_prediction=True)).train()
    ids = torch.randint(5, 99, (3, 16), generator=torch.Generator().manual_seed(0))
    labels = torch.full_like(ids, -100)
    labels[:, ::4] = ids[:, ::4]
    with DeviceReads() as counter:
        loss = model(input_ids=ids, labels=labels).loss
    assert model.attention_kernels() == ["full_attention via varlen"] * 2
    assert loss.isfinite() and len(counter.reads) == 2, counter.reads
    classifier = SineBertForSequenceClassification(tiny_config(num_labels=2)).eval()
    mask = (torch.arange(16) < torch.tensor([16, 9, 12])[:, None]).long()
    with DeviceReads() as counter, torch.no_grad():
        logits = classifier(input_ids=ids * mask, attention_mask=mask, token_type_ids=torch.zeros_like(ids)).logits
    assert logits.isfinite().all() and len(counter.reads) == 5, counter.reads


def _zeros_around_copies(loss: torch.Tensor) -> list[str]:
    """The nodes of `loss`'s graph that take an activation's gradient through a select or a slice: each writes a
    tensor of zeros the size of what was indexed, then copies the gradient into it. (Those of a parameter, such as
    one row of an embedding table, go straight to its accumulated gradient and are left out.)"""
    found, seen, stack = [], set(), [loss.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        inputs = [function for function, _ in node.next_functions if function is not None]
        if type(node).__name__ in ("SelectBackward0", "SliceBackward0") and any(
            type(function).__name__ != "AccumulateGrad" for function in inputs
        ):
            found.append(type(node).__name__)
        stack.extend(inputs)
    return found


class _OneNode(torch.autograd.Function):
    """`per_sequence_attention` as one node of the graph, as the CUDA kernel is (its own slices are the test's)."""

    @staticmethod
    def forward(ctx, query, key, value, *layout):
        ctx.save_for_backward(query, key, value)
        ctx.layout = layout
        return per_sequence_attention(query, key, value, *layout)

    @staticmethod
    def backward(ctx, grad):
        inputs = [tensor.detach().requires_grad_() for tensor in ctx.saved_tensors]
        with torch.enable_grad():
            output = per_sequence_attention(*inputs, *ctx.layout)
        return *torch.autograd.grad(output, inputs, grad), *(None for _ in ctx.layout)


def test_the_gradients_of_activations_pass_through_views_not_indexing(varlen_on_cpu, monkeypatch):
    """On a GPU, where a small model's step waits on the host's launches, each select or slice of an activation costs
    two more kernels in the backward (the zeros and the copy into them) and a write of the whole tensor: 16 of them
    in a 4-layer step of the packed path before `squeeze` took the place of `[0]`. The packed path, and on a CPU
    the last layer's rows read (`_attend_queries`), have none."""
    monkeypatch.setattr("sinebert.attention_sinebert._varlen_attn", _OneNode.apply)
    model = SineBertForMaskedLM(tiny_config(position_embedding_type="rotary", sparse_prediction=True)).train()
    ids, mask = _batch([12, 5, 9])
    labels = torch.where((torch.arange(12) % 3 == 0) & mask.bool(), ids, -100)
    assert model.attention_kernels() == ["full_attention via varlen"] * 2
    assert _zeros_around_copies(model(input_ids=ids, attention_mask=mask, labels=labels).loss) == []
    monkeypatch.undo()  # the CPU's layout: length buckets, and the rows read in the last layer
    assert model.attention_kernels() == ["full_attention via sdpa"] * 2
    for batch in (dict(input_ids=ids), dict(input_ids=ids, attention_mask=mask)):
        assert _zeros_around_copies(model(**batch, labels=torch.where(mask.bool(), labels, -100)).loss) == []
