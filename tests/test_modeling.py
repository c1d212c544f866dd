"""The model against independent NumPy formulas, and its Hugging Face contract (heads, save/load, options)."""

import datetime
import math
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from sinebert import (
    SineBertConfig,
    SineBertForMaskedLM,
    SineBertForQuestionAnswering,
    SineBertForSequenceClassification,
    SineBertForTokenClassification,
    SineBertModel,
)
from sinebert.attention_sinebert import (
    MATMUL_ATTENTION_MAX_SCORES,
    MATMUL_ATTENTION_MIN_SCORES,
    MATMUL_KEY_MULTIPLE,
    SINEBERT_ATTENTION_FUNCTIONS,
    full_attention_kernel,
    matmul_attention_forward,
)
from sinebert.layout_sinebert import (
    BUCKET_COST,
    CPU_BF16_ROW_MULTIPLE,
    TokenLayout,
    TokenLoss,
    TokenRows,
    _gather_heads,
    _gather_rows,
    attention_buckets,
    padding_mask,
    per_head_kernel,
    tokens_to_keep,
    unpadded_multiples,
)
from sinebert.modeling_sinebert import (
    Rotation,
    SineBertAttention,
    cross_segment_matches,
    eager_attention_forward,
    sinusoidal_encoding,
)
from tests.conftest import auto_heads, gradients_at_optimizer_step, load_script, tiny_config

ALL_HEADS = [
    SineBertModel,
    SineBertForMaskedLM,
    SineBertForSequenceClassification,
    SineBertForTokenClassification,
    SineBertForQuestionAnswering,
]


def numpy_sinusoids(length: int, dim: int) -> np.ndarray:
    table = np.zeros((length, dim))
    for pos in range(length):
        for i in range(dim):
            angle = pos / 10000 ** ((i - i % 2) / dim)
            table[pos, i] = np.sin(angle) if i % 2 == 0 else np.cos(angle)
    return table


def numpy_rotary(t, positions, theta=10000.0):
    """RoFormer's rotation written with complex numbers: t (batch, heads, seq, head_dim), positions (batch, seq); the
    halves of each head are the real and imaginary parts of head_dim/2 numbers, pair k turned by pos * theta^(-2k/h)."""
    half = t.shape[-1] // 2
    turns = np.exp(1j * positions[:, None, :, None] * theta ** (-2 * np.arange(half) / t.shape[-1]))
    z = (t[..., :half] + 1j * t[..., half:]) * turns
    return np.concatenate([z.real, z.imag], axis=-1)


def numpy_attention(x, mask, w_qkv, b_qkv, w_out, b_out, heads, positions=None):
    """Multi-head attention from the formulas: x (batch, seq, d) float64, mask (batch, seq) of 1/0; with
    `positions` (batch, seq), rotary positions."""
    batch, seq, dim = x.shape
    head_dim = dim // heads
    q, k, v = np.split(x @ w_qkv.T + b_qkv, 3, axis=-1)

    def split_heads(t):
        return t.reshape(batch, seq, heads, head_dim).transpose(0, 2, 1, 3)

    q, k, v = split_heads(q), split_heads(k), split_heads(v)
    if positions is not None:
        q, k = numpy_rotary(q, positions), numpy_rotary(k, positions)
    scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(head_dim)
    allowed = np.broadcast_to(mask[:, None, None, :].astype(bool), scores.shape)
    scores = np.where(allowed, scores, -np.inf)
    row_max = np.max(np.where(allowed, scores, -1e300), axis=-1, keepdims=True)
    weights = np.where(allowed, np.exp(scores - row_max), 0.0)
    norm = weights.sum(-1, keepdims=True)
    weights = np.divide(weights, norm, out=np.zeros_like(weights), where=norm > 0)  # empty rows stay zero
    out = (weights @ v).transpose(0, 2, 1, 3).reshape(batch, seq, dim)
    return out @ w_out.T + b_out


@pytest.mark.parametrize("dim", [1, 7, 32, 33])
@pytest.mark.parametrize("length", [0, 1, 50])
def test_sinusoidal_encoding_matches_formula(dim, length):
    ours = sinusoidal_encoding(torch.arange(length), dim).numpy()
    np.testing.assert_allclose(ours, numpy_sinusoids(length, dim), atol=1e-5)


def test_positions_past_the_table_are_computed_on_the_fly():
    model = SineBertModel(tiny_config(max_position_embeddings=8)).eval()
    far = model.embeddings.position_encoding(torch.tensor([[3, 100, 2000]]), 3)[0].numpy()
    np.testing.assert_allclose(far, numpy_sinusoids(2001, 32)[[3, 100, 2000]], atol=1e-5)
    long = model(input_ids=torch.randint(5, 99, (2, 300))).last_hidden_state
    assert long.shape == (2, 300, 32) and torch.isfinite(long).all()


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
@pytest.mark.parametrize("seed", range(4))
def test_attention_matches_numpy(implementation, seed):
    rng = np.random.default_rng(seed)
    heads = int(rng.choice([1, 2, 4]))
    dim = heads * int(rng.integers(1, 9))
    batch, seq = int(rng.integers(1, 4)), int(rng.integers(1, 12))
    config = tiny_config(hidden_size=dim, num_attention_heads=heads)
    config._attn_implementation = implementation
    attention = SineBertAttention(config, 0).eval().double()
    x = rng.standard_normal((batch, seq, dim))
    mask = (rng.random((batch, seq)) > 0.3).astype(np.int64)
    mask[0] = 0  # a fully padded row must give zeros, not NaN
    with torch.no_grad():
        ours, _ = attention(torch.from_numpy(x), padding_mask(torch.from_numpy(mask)))
    params = {n: p.detach().numpy() for n, p in attention.named_parameters()}
    expected = numpy_attention(
        x, mask, params["qkv_proj.weight"], params["qkv_proj.bias"], params["out_proj.weight"],
        params["out_proj.bias"], heads,
    )
    expected[0] = params["out_proj.bias"]  # zero attention output, then the output projection's bias
    np.testing.assert_allclose(ours.numpy(), expected, atol=1e-5)


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_rotary_attention_matches_numpy_at_any_positions(implementation):
    rng = np.random.default_rng(0)
    config = tiny_config(position_embedding_type="rotary")
    config._attn_implementation = implementation
    attention = SineBertAttention(config, 0).eval().double()
    x = rng.standard_normal((2, 9, 32))
    mask = np.ones((2, 9), dtype=np.int64)
    mask[1, 6:] = 0
    positions = np.stack([np.arange(9), np.array([0, 3, 4, 10, 11, 500, 2, 2, 7])])  # gaps, repeats, far
    with torch.no_grad():
        rotation = Rotation.of(torch.tensor(positions), attention.head_dim, config.rope_theta, torch.float64)
        ours, _ = attention(torch.from_numpy(x), padding_mask(torch.from_numpy(mask)), rotation=rotation)
    params = {n: p.detach().numpy() for n, p in attention.named_parameters()}
    expected = numpy_attention(x, mask, params["qkv_proj.weight"], params["qkv_proj.bias"],
                               params["out_proj.weight"], params["out_proj.bias"], 4, positions)
    np.testing.assert_allclose(ours.numpy(), expected, atol=1e-5)


def test_rotary_positions_are_relative_and_absolute_ones_are_not():
    """Shifting every position by the same amount leaves a rotary model's outputs as they were (scores depend on
    distances only), and an absolute one's not; the order of the tokens matters to both."""
    ids = torch.randint(5, 99, (2, 12))
    shifted = torch.arange(12)[None] + 37
    for kind, moves in (("rotary", False), ("absolute", True)):
        torch.manual_seed(0)
        # (mimetic: attention that is not uniform at the start, so that positions move the outputs visibly)
        model = SineBertModel(tiny_config(position_embedding_type=kind, attention_init="mimetic")).eval()
        with torch.no_grad():
            base = model(input_ids=ids).last_hidden_state
            moved = model(input_ids=ids, position_ids=shifted).last_hidden_state
            swapped = model(input_ids=ids[:, [1, 0, *range(2, 12)]]).last_hidden_state
        assert ((base - moved).abs().max() > 1e-3) == moves, kind
        assert (base[:, 5] - swapped[:, 5]).abs().max() > 1e-4, kind  # token 5 sees 0 and 1 at other distances


def test_rotary_model_adds_no_position_to_the_embeddings_and_round_trips(tmp_path):
    torch.manual_seed(0)
    model = SineBertForMaskedLM(tiny_config(position_embedding_type="rotary", rope_theta=500.0)).eval()
    ids = torch.randint(5, 99, (1, 6))
    embedded = model.sinebert.embeddings(input_ids=ids)
    at_other_positions = model.sinebert.embeddings(input_ids=ids, position_ids=torch.arange(6)[None] + 9)
    torch.testing.assert_close(embedded, at_other_positions)
    model.save_pretrained(tmp_path)
    loaded = SineBertForMaskedLM.from_pretrained(tmp_path).eval()
    assert (loaded.config.position_embedding_type, loaded.config.rope_theta) == ("rotary", 500.0)
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, model(input_ids=ids).logits)


def test_rotations_are_looked_up_bit_for_bit_in_a_table_that_loading_refills(tmp_path):
    """A rotary model keeps the rotation of positions up to max_position_embeddings (`rotary_table`, a cache that is
    not saved) and looks up those of inputs without position_ids: bit for bit what computing them gives, so the
    outputs equal those with the same positions given (computed); from_pretrained, which builds the model on the meta
    device, fills the table again."""
    positions = torch.randint(0, 64, (3, 5))
    table = Rotation.table(64, 8, 10000.0)
    for dtype in (torch.float32, torch.bfloat16):
        looked_up, computed = Rotation.look_up(table, positions, dtype), Rotation.of(positions, 8, 10000.0, dtype)
        assert all(torch.equal(a, b) for a, b in zip(looked_up, computed))
    torch.manual_seed(0)
    model = SineBertForMaskedLM(tiny_config(position_embedding_type="rotary", attention_init="mimetic")).eval()
    model.save_pretrained(tmp_path)
    loaded = SineBertForMaskedLM.from_pretrained(tmp_path).eval()
    assert "sinebert.rotary_table" not in load_file(tmp_path / "model.safetensors")
    assert torch.equal(loaded.sinebert.rotary_table, Rotation.table(64, 8, 10000.0))
    ids = torch.randint(5, 99, (2, 9))
    with torch.no_grad():
        given = model(input_ids=ids, position_ids=torch.arange(9)[None]).logits
        assert torch.equal(model(input_ids=ids).logits, given) and torch.equal(loaded(input_ids=ids).logits, given)


def test_turning_heads_in_place_of_the_projection_equals_turning_the_tokens_with_its_gradient():
    """`Rotation.turn_heads` (the fused TurnToHeads) on the strided per-head views of a fused projection gives, in a
    new contiguous tensor, what `Rotation.turn` gives on the tokens, the values copied: bit for bit in bf16, and with
    the gradient of the reference ops (gradcheck in float64), laid out as the projection is."""
    torch.manual_seed(0)
    batch, seq, heads, head_dim = 2, 7, 3, 8
    width = heads * head_dim
    positions = torch.randint(0, 300, (batch, seq))

    def grid(qkv):  # (batch, seq, 3 * width) -> the per-head views, (3, batch, heads, seq, head_dim)
        return qkv.view(batch, seq, 3, heads, head_dim).permute(2, 0, 3, 1, 4)

    for dtype in (torch.float64, torch.bfloat16):
        rotation = Rotation.of(positions, head_dim, 10000.0, dtype)  # (batch, seq, 1, head_dim)
        qkv = torch.randn(batch, seq, 3 * width, dtype=dtype)
        turned = rotation.turn_heads(grid(qkv), turned=2)
        reference = grid(torch.cat([rotation.turn(qkv[..., : 2 * width]), qkv[..., 2 * width :]], -1))
        assert turned.is_contiguous() and turned.dtype == dtype
        assert torch.equal(turned, reference)
        assert torch.equal(rotation.turn_heads(grid(qkv)[:1, :, :, :4])[0], reference[0, :, :, :4])  # a grid's queries
        rows = qkv.unflatten(-1, (3, heads, head_dim)).movedim(-3, 0)  # token-major, as the rows of a batch turn
        turned_rows = rotation.turn_parts(rows, turned=2)
        assert turned_rows.stride() == rows.stride() and torch.equal(turned_rows.permute(0, 1, 3, 2, 4), reference)
        for training in (False, True):  # serving keeps the values' view; training copies them with the rest
            parts = rotation.turn_projection(grid(qkv.clone().requires_grad_(training)))
            assert all(torch.equal(part, expected) for part, expected in zip(parts, reference.unbind(0)))
    rotation = Rotation.of(positions, head_dim, 10000.0, torch.float64)
    qkv = torch.randn(batch, seq, 3 * width, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: rotation.turn_heads(grid(x), turned=2), (qkv,))
    assert torch.autograd.gradcheck(
        lambda x: rotation.turn_parts(x.unflatten(-1, (3, heads, head_dim)).movedim(-3, 0), turned=2), (qkv,)
    )
    # The gradient comes back in the projection's layout: the view back to (batch, seq, 3 * width) copies nothing.
    views = grid(qkv)
    turned = rotation.turn_heads(views, turned=2)
    (gradient,) = torch.autograd.grad(turned, views, torch.randn_like(turned))
    assert gradient.stride() == views.stride()


def test_a_training_step_runs_none_of_pytorchs_python_references():
    """Every operation of a step is a call into PyTorch's C++ core. `torch._refs` (PyTorch's operations written in
    Python, which some calls fall back to, such as `empty_like` of a meta tensor onto a device) took about 75 us a
    call, once a layer: 2-5% of a tiny model's step, and a small model's step on a GPU waits on the host."""
    from_python = []

    def record(frame, event, arg):
        if event == "call" and any(part in frame.f_code.co_filename for part in ("torch/_refs", "torch/_prims")):
            from_python.append(frame.f_code.co_name)

    ids = torch.randint(5, 99, (3, 16), generator=torch.Generator().manual_seed(0))
    labels = torch.where(torch.arange(16) % 4 == 0, ids, -100)
    mask = (torch.arange(16) < torch.tensor([16, 9, 12])[:, None]).long()
    classifier = SineBertForSequenceClassification(tiny_config(num_labels=2, position_embedding_type="rotary"))
    steps = [(SineBertForMaskedLM(tiny_config(position_embedding_type="rotary", sparse_prediction=True)),
              dict(input_ids=ids, labels=labels)),
             (classifier, dict(input_ids=ids * mask, attention_mask=mask, labels=torch.tensor([0, 1, 1])))]
    for precision in (torch.float32, torch.bfloat16):
        for model, batch in steps:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == torch.bfloat16):
                sys.setprofile(record)
                try:
                    model(**batch).loss.backward()
                finally:
                    sys.setprofile(None)
            assert all(p.grad is not None for p in model.sinebert.layers.parameters())
    assert from_python == []


def test_glu_feed_forward_matches_numpy_and_round_trips(tmp_path):
    """mlp_type="glu": gelu(x W_gate + b_gate) * (x W_value + b_value), then the output projection."""
    torch.manual_seed(0)
    model = SineBertForMaskedLM(tiny_config(mlp_type="glu")).eval()
    mlp = model.sinebert.layers[0].mlp
    assert tuple(mlp.fc1.weight.shape) == (2 * 37, 32) and tuple(mlp.fc2.weight.shape) == (32, 37)
    x = torch.randn(3, 5, 32)
    w1, b1, w2, b2 = (t.detach().double().numpy() for t in (mlp.fc1.weight, mlp.fc1.bias, mlp.fc2.weight,
                                                             mlp.fc2.bias))
    inner = x.double().numpy() @ w1.T + b1
    gate, value = inner[..., :37], inner[..., 37:]
    gelu = 0.5 * gate * (1 + np.vectorize(math.erf)(gate / math.sqrt(2)))
    with torch.no_grad():
        np.testing.assert_allclose(mlp(x).double().numpy(), (gelu * value) @ w2.T + b2, atol=1e-5)
    model.save_pretrained(tmp_path)
    loaded = SineBertForMaskedLM.from_pretrained(tmp_path).eval()
    ids = torch.randint(5, 99, (2, 7))
    assert loaded.config.mlp_type == "glu"
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, model(input_ids=ids).logits)


def _masked_step_against_the_reference(**overrides):
    """A masked-LM training step of the eager reference and of the padding-free path with the last layer computing
    only the masked rows, from the same weights: the losses and every gradient must agree. Returns the fast model."""
    eager, fast = _model_pair(SineBertForMaskedLM, sparse_prediction=True, **overrides)
    inputs = _inputs(batch=3, seq=10)
    inputs["attention_mask"][0, 4:] = 0
    labels = torch.full_like(inputs["input_ids"], -100)
    labels[:, 1::3] = inputs["input_ids"][:, 1::3]
    labels[inputs["attention_mask"] == 0] = -100
    losses = []
    for model in (eager, fast):
        model.train()
        loss = model(**inputs, labels=labels).loss
        loss.backward()
        losses.append(loss)
    torch.testing.assert_close(losses[0], losses[1], atol=1e-5, rtol=1e-5)
    for (name, p), q in zip(eager.named_parameters(), fast.parameters()):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-5, rtol=1e-4, msg=name)
    return fast


def test_glu_masked_only_training_step_matches_the_reference_with_gradients():
    """The padding-free path with the last layer computing only the masked rows, through a gated feed-forward."""
    _masked_step_against_the_reference(mlp_type="glu")


def test_a_model_without_biases_has_none_in_its_encoder_and_its_fast_path_matches_the_reference(tmp_path):
    """bias=False (as ModernBERT): the encoder's linear layers and LayerNorms and the masked-LM transform have no bias,
    the decoder keeps its own; the padding-free training step, with rotary positions, the length buckets and the last
    layer's masked rows, equals the eager reference with gradients, and the model round-trips."""
    fast = _masked_step_against_the_reference(bias=False, position_embedding_type="rotary", norm_placement="pre")
    assert [name for name, _ in fast.named_parameters() if name.endswith("bias")] == ["decoder.bias"]
    fast.save_pretrained(tmp_path)
    loaded = SineBertForMaskedLM.from_pretrained(tmp_path).eval()
    assert loaded.config.bias is False and loaded.sinebert.layers[0].mlp.fc1.bias is None
    inputs = _inputs(batch=3, seq=10)
    with torch.no_grad():
        torch.testing.assert_close(loaded(**inputs).logits, fast.eval()(**inputs).logits)


def test_attention_float32_matches_numpy_and_empty_rows_are_zero():
    config = tiny_config()
    config._attn_implementation = "sdpa"
    attention = SineBertAttention(config, 0).eval()
    x = torch.randn(3, 9, 32)
    mask = torch.ones(3, 9, dtype=torch.long)
    mask[1, 5:] = 0
    mask[2] = 0
    with torch.no_grad():
        ours, _ = attention(x, padding_mask(mask))
    params = {n: p.detach().double().numpy() for n, p in attention.named_parameters()}
    expected = numpy_attention(
        x.double().numpy(), mask.numpy(), params["qkv_proj.weight"], params["qkv_proj.bias"],
        params["out_proj.weight"], params["out_proj.bias"], 4,
    )
    np.testing.assert_allclose(ours.numpy(), expected, atol=1e-5)
    assert torch.isfinite(ours).all()


def test_matmul_kernel_matches_numpy_with_padding_and_empty_rows():
    rng = np.random.default_rng(0)
    query, key, value = (rng.standard_normal((3, 2, 6, 4)) for _ in range(3))
    mask = np.ones((3, 6), dtype=np.int64)
    mask[1, 4:] = 0
    mask[2] = 0  # a fully padded row must give zeros, not NaN
    scores = query @ key.transpose(0, 1, 3, 2) * 0.5 + np.where(mask[:, None, None, :] == 1, 0.0, -1e30)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    expected = weights / weights.sum(-1, keepdims=True) @ value  # (batch, heads, seq, head_dim)
    expected[2] = 0.0
    module = torch.nn.Module().eval()
    ours, weights = matmul_attention_forward(
        module, *(torch.from_numpy(t) for t in (query, key, value)), padding_mask(torch.from_numpy(mask)), 0.5
    )
    assert weights is None
    np.testing.assert_allclose(ours.numpy(), expected.transpose(0, 2, 1, 3), atol=1e-6)


@pytest.mark.parametrize("mask_shape", [(3, 1, 5, 6), (3, 2, 5, 6)])
def test_matmul_kernel_takes_masks_per_query_and_per_head_as_eager_does(mask_shape):
    """The mask becomes a bias added inside the first product, one row per sequence and head for a mask of keys
    alone (above) and the whole (q_seq, k_seq) here; a query whose keys are all masked still gets zeros."""
    generator = torch.Generator().manual_seed(0)
    query = torch.randn(3, 2, 5, 4, generator=generator, dtype=torch.float64)
    key, value = (torch.randn(3, 2, 6, 4, generator=generator, dtype=torch.float64) for _ in range(2))
    mask = torch.rand(mask_shape, generator=generator) > 0.4
    mask[0, :, 2] = False  # a query with no key
    module = torch.nn.Module().eval()
    expected, _ = eager_attention_forward(module, query, key, value, mask, 0.5)
    ours, _ = matmul_attention_forward(module, query, key, value, mask, 0.5)
    torch.testing.assert_close(ours, expected)
    assert ours[0, 2].abs().max() == 0
    # The length buckets' promise that every query has a key spares only the zeroing: where it holds, the same.
    mask[0, :, 2, 0] = True
    expected, _ = eager_attention_forward(module, query, key, value, mask, 0.5)
    torch.testing.assert_close(matmul_attention_forward(module, query, key, value, mask, 0.5,
                                                        every_query_has_a_key=True)[0], expected)


def test_sdpa_runs_the_matmul_kernel_only_for_bf16_on_a_cpu_while_the_scores_fit_and_says_so(monkeypatch):
    cpu, bf16 = torch.device("cpu"), torch.bfloat16
    monkeypatch.setattr("sinebert.attention_sinebert.CPU_HAS_AMX", False)  # what this host has must not matter
    assert full_attention_kernel("sdpa", cpu, bf16, 2 * 4 * 16 * 16) == "matmul"
    assert full_attention_kernel("sdpa", cpu, torch.float32, 2 * 4 * 16 * 16) == "sdpa"
    assert full_attention_kernel("sdpa", torch.device("cuda"), bf16) == "sdpa"
    assert full_attention_kernel("eager", cpu, bf16) == "eager"
    with torch.no_grad():  # serving: small calls keep SDPA's one call, larger ones take the matmul kernel
        assert full_attention_kernel("sdpa", cpu, bf16, MATMUL_ATTENTION_MIN_SCORES - 1) == "sdpa"
        assert full_attention_kernel("sdpa", cpu, bf16, MATMUL_ATTENTION_MIN_SCORES) == "matmul"
    monkeypatch.setattr("sinebert.attention_sinebert.CPU_HAS_AMX", True)  # on AMX tiles, serving keeps SDPA throughout
    with torch.no_grad():
        assert full_attention_kernel("sdpa", cpu, bf16, MATMUL_ATTENTION_MIN_SCORES) == "sdpa"
        assert full_attention_kernel("sdpa", cpu, bf16, MATMUL_ATTENTION_MAX_SCORES) == "sdpa"
    assert full_attention_kernel("sdpa", cpu, bf16, MATMUL_ATTENTION_MIN_SCORES) == "matmul"  # training does not
    monkeypatch.setattr("sinebert.attention_sinebert.CPU_HAS_AMX", False)
    monkeypatch.setattr("sinebert.attention_sinebert.MATMUL_ATTENTION_MAX_SCORES", 2 * 4 * 16 * 16 - 1)
    assert full_attention_kernel("sdpa", cpu, bf16, 2 * 4 * 16 * 16) == "sdpa"  # long inputs keep SDPA's kernel
    model = SineBertModel(tiny_config())  # 4 heads
    assert model.attention_kernels() == ["full_attention via sdpa"] * 2
    with torch.autocast("cpu", dtype=bf16):
        assert model.attention_kernels() == ["full_attention via matmul"] * 2
        assert model.attention_kernels(input_shape=(2, 16)) == ["full_attention via sdpa"] * 2
    assert model.to(bf16).attention_kernels() == ["full_attention via matmul"] * 2
    ran = []  # and what is reported is what runs
    monkeypatch.setitem(SINEBERT_ATTENTION_FUNCTIONS._local_mapping, "matmul",
                        lambda *args, **kwargs: ran.append("matmul") or matmul_attention_forward(*args, **kwargs))
    model(input_ids=torch.randint(5, 99, (1, 8)))
    assert ran == ["matmul"] * 2
    with torch.no_grad():  # served, the same input is a small call
        assert model.attention_kernels(input_shape=(1, 8)) == ["full_attention via sdpa"] * 2
        model(input_ids=torch.randint(5, 99, (1, 8)))
    assert ran == ["matmul"] * 2


@pytest.mark.parametrize("cls", [SineBertForMaskedLM, SineBertForSequenceClassification])
def test_bf16_fast_path_matches_the_float32_reference_and_its_gradients(cls):
    """Under bf16 autocast on a CPU the "sdpa" model runs the matmul kernel (with unpadding and buckets); it must
    agree with the float32 eager reference to bf16's precision, outputs and gradients."""
    eager, sdpa = _model_pair(cls, num_labels=3)
    with torch.no_grad():  # sharper attention than the tiny init's near-uniform weights, so that errors show
        for model in (eager, sdpa):
            for layer in model.base_model.layers:
                layer.attention.qkv_proj.weight.mul_(8.0)
    inputs = _inputs(batch=4, seq=12)
    inputs["attention_mask"][1, 5:] = 0
    inputs["attention_mask"][3, 9:] = 0
    if cls is SineBertForMaskedLM:
        labels = torch.where(inputs["attention_mask"].bool(), inputs["input_ids"], -100)
    else:
        labels = torch.tensor([0, 1, 2, 1])
    losses = []
    for model, bf16 in ((eager, False), (sdpa, True)):
        model.train()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = model(**inputs, labels=labels).loss
        loss.backward()
        losses.append(loss)
    torch.testing.assert_close(losses[1], losses[0], atol=2e-2, rtol=2e-2)
    for (name, p), q in zip(eager.named_parameters(), sdpa.parameters()):
        if p.grad is not None:
            scale = p.grad.abs().max().clamp(min=1e-3)
            torch.testing.assert_close(q.grad / scale, p.grad / scale, atol=3e-2, rtol=0, msg=name)


def _model_pair(cls, **overrides):
    torch.manual_seed(0)
    eager = cls(tiny_config(**overrides)).eval()
    eager.config._attn_implementation = "eager"
    sdpa = cls(tiny_config(**overrides)).eval()
    sdpa.load_state_dict(eager.state_dict())
    sdpa.config._attn_implementation = "sdpa"
    return eager, sdpa


@pytest.mark.parametrize("positions", ["absolute", "rotary"])
@pytest.mark.parametrize("norm_placement", ["post", "pre"])
def test_eager_equals_sdpa_on_padded_batches(norm_placement, positions):
    eager, sdpa = _model_pair(SineBertModel, norm_placement=norm_placement, position_embedding_type=positions)
    ids = torch.randint(5, 99, (3, 17))
    mask = torch.ones_like(ids)
    mask[1, 9:] = 0
    mask[2, 3:] = 0
    with torch.no_grad():
        a = eager(input_ids=ids, attention_mask=mask, output_hidden_states=True)
        b = sdpa(input_ids=ids, attention_mask=mask, output_hidden_states=True)
    real = mask.bool()
    # The fast path drops the padding between layers (unpadding): equal at real tokens, zeros at padding.
    for reference, fast in zip(a.hidden_states, b.hidden_states):
        torch.testing.assert_close(reference[real], fast[real], atol=1e-5, rtol=1e-5)
    assert torch.equal(b.last_hidden_state[~real], torch.zeros_like(b.last_hidden_state[~real]))


def test_torch_compile_with_freezing_serves_padded_batches_of_new_lengths_as_the_eager_reference():
    """The serving setting that benchmarks/speed.py --compiled measures: dynamic shapes, weights frozen in, the
    cram's rotary positions (a compilation takes 30 to 50 s here, so one position type)."""
    import torch._inductor.config

    eager, sdpa = _model_pair(SineBertForSequenceClassification, num_labels=2, position_embedding_type="rotary")
    eager.eval()
    compiled = torch.compile(sdpa.eval(), dynamic=True)
    with torch.no_grad(), torch._inductor.config.patch(freezing=True):
        for batch, seq, cut in ((3, 17, 9), (4, 11, 2), (2, 23, 20)):  # new shapes and paddings after the first
            ids = torch.randint(5, 99, (batch, seq))
            mask = torch.ones_like(ids)
            mask[1:, cut:] = 0
            torch.testing.assert_close(compiled(input_ids=ids, attention_mask=mask).logits,
                                       eager(input_ids=ids, attention_mask=mask).logits, atol=1e-4, rtol=1e-4)


def test_compiled_serving_breaks_its_graph_only_where_it_reads_the_batch():
    """Under torch.compile a padded batch is read twice, each read a graph break: the ids' range (`_check_ids`) and
    the three totals of its rows (`compiled_totals`), whose first also says whether anything is padded. A third read
    (`mask.all()`, for the padding mask) broke the graph once more, and dynamo printed a warning with its stack for
    it. The classifier that fine-tuning makes, mean pooling; dynamo's capture alone (backend "eager")."""
    import torch._dynamo

    model = SineBertForSequenceClassification(
        tiny_config(num_labels=2, classifier_pooling="mean", position_embedding_type="rotary")
    ).eval()
    ids = torch.randint(5, 99, (3, 12))
    mask = (torch.arange(12) < torch.tensor([12, 7, 9])[:, None]).long()
    torch._dynamo.reset()
    with torch.no_grad():
        explained = torch._dynamo.explain(model)(input_ids=ids, attention_mask=mask)
    torch._dynamo.reset()
    assert {reason.user_stack[-1].name for reason in explained.break_reasons} == {"_check_ids", "compiled_totals"}


def _assert_compiled_steps_match_eager(model: torch.nn.Module, reference: torch.nn.Module, batches: list[dict]):
    """Runs `model` under torch.compile and `reference` eager, from the same weights, on `batches` with dynamo held to
    4 graphs a frame: a frame that compiles again for each batch fails. Their losses and gradients must match.
    Dynamo's capture alone (backend "eager"): inductor's code generation takes a minute here."""
    import torch._dynamo

    reference.load_state_dict(model.state_dict())
    torch._dynamo.reset()
    compiled = torch.compile(model.train(), backend="eager")
    with torch._dynamo.config.patch(recompile_limit=4, fail_on_recompile_limit_hit=True):
        for inputs in batches:
            loss, expected = compiled(**inputs).loss, reference.train()(**inputs).loss
            torch.testing.assert_close(loss, expected)
            (loss + expected).backward()
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad, msg=name)
    torch._dynamo.reset()


def test_compiled_pretraining_steps_compile_for_the_first_new_sizes_only_and_match_eager():
    """--torch_compile's training: each step masks a new number of tokens, which the masked-only head reads. The
    compiled model must take new counts as dynamic sizes (one recompile), not compile again for every count, as the
    head did while the chunked cross-entropy's loop fixed its trip count."""
    torch.manual_seed(0)
    model, reference = (SineBertForMaskedLM(tiny_config(sparse_prediction=True)) for _ in range(2))
    batches = []
    for count in (10, 13, 17, 21, 25, 30, 34, 41):
        ids = torch.randint(5, 99, (4, 16))
        labels = torch.full_like(ids, -100).flatten()
        labels[torch.randperm(64)[:count]] = 7
        batches.append(dict(input_ids=ids, attention_mask=torch.ones_like(ids), labels=labels.view(4, 16)))
    _assert_compiled_steps_match_eager(model, reference, batches)


@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_compiled_fine_tuning_compiles_once_for_new_padding_and_matches_eager(pooling):
    """--torch_compile's fine-tuning: each padded batch has new lengths. Under compile the unpadded rows read three
    totals and attend in one bucket, so a new batch takes them as dynamic sizes (one recompile); read one by one, as
    eager reads them to choose its buckets, dynamo guarded on every length and compiled again for each batch. The
    eager model (several buckets) is the reference."""
    config = tiny_config(num_labels=2, classifier_pooling=pooling, position_embedding_type="rotary")
    torch.manual_seed(0)
    model, reference = (SineBertForSequenceClassification(config) for _ in range(2))
    generator = torch.Generator().manual_seed(1)
    batches = []
    for seq in (13, 10, 11, 16, 9, 16, 12, 14):
        lengths = torch.randint(2, seq + 1, (6,), generator=generator)
        lengths[0] = seq  # (the batch is padded to its longest)
        batches.append(dict(input_ids=torch.randint(5, 99, (6, seq), generator=generator),
                            attention_mask=(torch.arange(seq)[None] < lengths[:, None]).long(),
                            labels=torch.tensor([0, 1, 1, 0, 1, 0])))
    _assert_compiled_steps_match_eager(model, reference, batches)


@pytest.mark.parametrize("positions", ["absolute", "rotary"])
@pytest.mark.parametrize("cls", ALL_HEADS[1:])
def test_unpadded_fast_path_matches_the_reference_in_every_head_and_its_gradients(cls, positions):
    eager, sdpa = _model_pair(cls, num_labels=3, position_embedding_type=positions)
    inputs = _inputs(batch=3, seq=10)
    inputs["attention_mask"][0, 4:] = 0
    real = inputs["attention_mask"].bool()
    def at_real_tokens(output):  # per-token outputs are compared at real tokens only
        return output[real] if output.shape[:2] == real.shape else output

    for model in (eager, sdpa):
        model.train()  # dropout is 0 in the tiny config: training mode changes nothing but must work
        at_real_tokens(model(**inputs, return_dict=False)[0]).float().sum().backward()
    a = at_real_tokens(eager(**inputs, return_dict=False)[0])
    b = at_real_tokens(sdpa(**inputs, return_dict=False)[0])
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    for (name, p), q in zip(eager.named_parameters(), sdpa.parameters()):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-5, rtol=1e-4, msg=name)


@pytest.mark.parametrize("positions", ["absolute", "rotary"])
@pytest.mark.parametrize("norm_placement", ["post", "pre"])
@pytest.mark.parametrize("padded", [True, False])
@pytest.mark.parametrize("cls", [SineBertForMaskedLM, SineBertForSequenceClassification])
def test_last_layer_computes_only_the_rows_the_head_reads_and_matches_the_reference(cls, padded, norm_placement,
                                                                                    positions):
    eager, sdpa = _model_pair(cls, num_labels=3, norm_placement=norm_placement, sparse_prediction=True,
                              position_embedding_type=positions)
    inputs = _inputs(batch=3, seq=10)
    if not padded:
        inputs["attention_mask"][:] = 1
    if cls is SineBertForMaskedLM:
        chosen = (torch.rand(3, 10, generator=torch.Generator().manual_seed(2)) < 0.3) & inputs["attention_mask"].bool()
        labels, read = torch.where(chosen, inputs["input_ids"], -100), int(chosen.sum())
    else:
        labels, read = torch.tensor([0, 2, 1]), 3  # "cls" pooling reads the first token of each row
    rows_seen = []
    sdpa.sinebert.layers[-1].mlp.fc1.register_forward_hook(lambda m, args, out: rows_seen.append(args[0].shape[0]))
    for model in (eager, sdpa):
        model(**inputs, labels=labels).loss.backward()
    a, b = eager(**inputs, labels=labels), sdpa(**inputs, labels=labels)
    assert rows_seen[-1] == read  # the feed-forward network of the last layer ran on the rows read, no others
    torch.testing.assert_close(a.logits, b.logits, atol=1e-5, rtol=1e-5)
    for (name, p), q in zip(eager.named_parameters(), sdpa.parameters()):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-5, rtol=1e-4, msg=name)


def buckets(lengths: list[int], key_multiple: int = 1, heads: int = 1, per_head=None):
    return attention_buckets(torch.tensor(lengths, dtype=torch.long), lengths, heads, key_multiple, per_head)


def test_attention_buckets_split_a_batch_only_where_it_saves_more_than_a_kernel_call():
    assert buckets([]) == buckets([0, 0]) == ()
    (same,) = buckets([50] * 8)
    assert (same.rows, same.grid.shape, same.q_seq, same.mask) == (slice(0, 400), (8, 50), 50, None)
    assert len(buckets([12, 11, 3, 2])) == 1  # too small to pay for a second call
    lengths = [100] * 4 + [5] * 4 + [0]
    long, short = buckets(lengths)
    assert 4 * 100**2 + 4 * 5**2 + 2 * BUCKET_COST < 8 * 100**2 + BUCKET_COST  # the premise: two calls cost less
    assert (long.rows, long.grid.shape, long.mask) == (slice(0, 400), (4, 100), None)
    assert (short.rows, short.grid.shape, short.q_seq) == (slice(400, 420), (4, 5), 5)


def test_a_bucket_grid_puts_each_sequence_at_the_front_of_its_row_and_repeats_a_real_row_past_its_end():
    ragged = buckets([100, 100, 100, 90, 5, 4, 4, 2], key_multiple=8)[1]
    assert ragged.rows == slice(390, 405) and ragged.q_seq == 5
    assert ragged.grid.tolist() == [[390, 391, 392, 393, 394, 390, 390, 390], [395, 396, 397, 398, 390, 390, 390, 390],
                                    [399, 400, 401, 402, 390, 390, 390, 390], [403, 404, 390, 390, 390, 390, 390, 390]]
    assert ragged.mask.shape == (4, 1, 1, 8) and ragged.mask[:, 0, 0].sum(1).tolist() == [5, 4, 4, 2]
    # The bucket's rows, in order, sit at these places of the grid's first q_seq columns.
    assert ragged.grid[:, :5].flatten()[ragged.slots].tolist() == list(range(390, 405))
    (rounded,) = buckets([50] * 8, key_multiple=32)
    assert rounded.grid.shape == (8, 64) and rounded.q_seq == 50 and rounded.mask[:, 0, 0].sum(1).tolist() == [50] * 8


def test_under_sdpa_a_buckets_mask_is_made_once_for_every_layer_as_its_kernels_add_it():
    """SDPA turns a boolean mask into an additive one in every call (three operations a layer and bucket, each a
    kernel launch on a GPU), and the matmul kernel into its bias: under "sdpa" each bucket's mask is that additive
    mask, made once in the dtype the layers compute in, and both kernels give what they give from the boolean one,
    bit for bit. Under other implementations the masks stay boolean."""
    generator = torch.Generator().manual_seed(0)
    lengths = [9, 9, 8, 3, 3, 2]
    mask = (torch.arange(9) < torch.tensor(lengths)[:, None]).long()
    config = tiny_config(attn_implementation="sdpa")
    for dtype in (torch.float32, torch.bfloat16):
        layout = TokenLayout(config, mask, None, None, None, mask.shape, mask.device, dtype, False)
        ragged = [bucket for bucket in layout.tokens.buckets if bucket.mask is not None][0]
        key_multiple = unpadded_multiples("sdpa", mask.device, dtype)[0]
        (boolean,) = [b for b in buckets(lengths, key_multiple, 4) if b.mask is not None and b.rows == ragged.rows]
        assert ragged.mask.dtype == dtype and torch.equal(ragged.mask == 0, boolean.mask)
        assert (ragged.mask[~boolean.mask] == torch.finfo(dtype).min).all()
        batch, k_seq = ragged.grid.shape
        query, key, value = (torch.randn(batch, 4, k_seq, 8, generator=generator).to(dtype) for _ in range(3))
        module = torch.nn.Module().eval()
        for kernel in (SINEBERT_ATTENTION_FUNCTIONS["sdpa"], matmul_attention_forward):
            outputs = [kernel(module, query, key, value, m, scaling=0.5, every_query_has_a_key=True)[0]
                       for m in (ragged.mask, boolean.mask)]
            assert torch.equal(*outputs)
    eager = tiny_config(attn_implementation="eager")
    assert TokenLayout(eager, mask, None, None, None, mask.shape, mask.device, torch.float32, False).tokens is None


def test_a_bucket_gathers_each_heads_queries_keys_and_values_and_puts_the_outputs_back_in_its_rows():
    heads, head_dim = 3, 2
    ragged = buckets([100, 100, 100, 90, 5, 4, 4, 2], key_multiple=8, heads=heads, per_head=lambda scores: True)[1]
    qkv = torch.randn(405, 3 * heads * head_dim)
    # Per head (for the matmul kernel): the same queries, keys and values as whole rows' strided views, contiguous.
    for ours, rows in zip(_gather_heads(qkv, ragged, heads, head_dim), _gather_rows(qkv, ragged, heads, head_dim)):
        assert ours.is_contiguous() and torch.equal(ours, rows)
    batch, q_seq = len(ragged.grid), ragged.q_seq
    output = torch.randn(batch, heads, q_seq, head_dim)
    picked = output.view(-1, head_dim)[ragged.head_slots].view(-1, heads * head_dim)
    assert torch.equal(picked, output.transpose(1, 2).reshape(-1, heads * head_dim)[ragged.slots])


def test_only_buckets_whose_kernel_reads_each_head_contiguous_get_rows_per_head(monkeypatch):
    """The layout asks the kernel a bucket of its size will run: the matmul kernel (bf16 on a CPU, scores up to
    MATMUL_ATTENTION_MAX_SCORES, served from MATMUL_ATTENTION_MIN_SCORES on where the CPU has no AMX) reads each head
    contiguous, SDPA reads whole rows' strided heads."""
    cpu = torch.device("cpu")
    monkeypatch.setattr("sinebert.attention_sinebert.CPU_HAS_AMX", False)
    matmul = per_head_kernel("sdpa", cpu, torch.bfloat16)
    assert matmul(MATMUL_ATTENTION_MAX_SCORES) and not matmul(MATMUL_ATTENTION_MAX_SCORES + 1) and matmul(1)
    with torch.no_grad():
        assert matmul(MATMUL_ATTENTION_MIN_SCORES) and not matmul(MATMUL_ATTENTION_MIN_SCORES - 1)
        monkeypatch.setattr("sinebert.attention_sinebert.CPU_HAS_AMX", True)
        assert not matmul(MATMUL_ATTENTION_MIN_SCORES)
    assert not per_head_kernel("sdpa", cpu, torch.float32)(1) and not per_head_kernel("eager", cpu, torch.bfloat16)(1)
    long, short = buckets([100] * 4 + [5] * 4, heads=2, per_head=lambda scores: scores <= 4 * 2 * 5 * 5)
    assert long.head_rows is None and long.head_slots is None  # 4 x 2 x 100 x 100 scores: whole rows
    assert short.head_rows is not None and len(short.head_slots) == 2 * 20


def test_unpadded_bf16_batches_round_keys_and_rows_up_only_on_a_cpu(monkeypatch):
    cpu, bf16 = torch.device("cpu"), torch.bfloat16
    monkeypatch.setattr("sinebert.attention_sinebert.CPU_HAS_AMX", False)
    assert unpadded_multiples("sdpa", cpu, torch.float32) == (1, 1)
    assert unpadded_multiples("sdpa", torch.device("cuda"), bf16) == (1, 1)
    assert unpadded_multiples("sdpa", cpu, bf16) == (MATMUL_KEY_MULTIPLE, CPU_BF16_ROW_MULTIPLE) == (32, 16)
    with torch.no_grad():  # served, the larger buckets still run the matmul kernel
        assert unpadded_multiples("sdpa", cpu, bf16) == (32, 16)
        monkeypatch.setattr("sinebert.attention_sinebert.CPU_HAS_AMX", True)  # but not on AMX: no keys rounded up
        assert unpadded_multiples("sdpa", cpu, bf16) == (1, 16)
    assert unpadded_multiples("sdpa", cpu, bf16) == (32, 16)  # training keeps the matmul kernel there
    assert unpadded_multiples("flex_attention", cpu, bf16) == (1, 16)  # no matmul kernel, no keys rounded up


def test_filler_rows_round_large_batches_up_and_are_dropped_when_the_batch_is_padded_again(monkeypatch):
    mask = (torch.arange(10) < torch.tensor([7, 3, 10])[:, None]).long()
    assert len(TokenRows.from_mask(mask, 1, row_multiple=8).rows) == 20  # too few rows to pay for fillers
    monkeypatch.setattr("sinebert.layout_sinebert.FILLED_MIN_ROWS", 20)
    unpadded = TokenRows.from_mask(mask, 1, row_multiple=8)
    assert unpadded.n_real == 20 and len(unpadded.rows) == 24
    assert unpadded.rows[20:].tolist() == [unpadded.rows[0].item()] * 4  # copies of the first row
    values = torch.arange(30, dtype=torch.float).view(3, 10, 1)
    rows = unpadded.unpad(values)
    assert rows.shape == (24, 1) and torch.equal(unpadded.pad(rows), values * mask[..., None])
    assert unpadded.with_fillers(rows[:20]).flatten().tolist()[20:] == [0.0] * 4


@pytest.mark.parametrize("positions", ["absolute", "rotary"])
@pytest.mark.parametrize("padded", [True, False])
def test_the_rows_a_masked_lm_head_reads_are_filled_up_to_the_row_multiple_and_match_the_reference(
        padded, positions, monkeypatch):
    """The masked tokens' count changes from batch to batch: the last layer's rows read and the head's rows carry
    fillers up to the row multiple (here 8, from 1 row on, in float32 so that it is exact), and the loss, the logits
    (one row per masked token) and every gradient equal the eager reference's."""
    monkeypatch.setattr("sinebert.layout_sinebert.unpadded_multiples", lambda *args: (1, 8))
    monkeypatch.setattr("sinebert.layout_sinebert.FILLED_MIN_ROWS", 1)
    eager, sdpa = _model_pair(SineBertForMaskedLM, sparse_prediction=True, position_embedding_type=positions,
                              norm_placement="pre")
    inputs = _dropping_inputs(padded)  # 4 x 30 tokens, a fifth of the real ones masked
    masked = int((inputs["labels"] != -100).sum())
    assert masked % 8
    rows = {}  # the rows that the last layer's feed-forward and the decoder take

    def counter(name):
        def hook(module, args):
            rows.setdefault(name, len(args[0]))
        return hook

    sdpa.sinebert.layers[-1].mlp.register_forward_pre_hook(counter("last layer"))
    sdpa.decoder.register_forward_pre_hook(counter("head"))
    outputs = []
    for model in (eager, sdpa):
        output = model(**inputs)
        output.loss.backward()
        outputs.append(output)
    assert rows == {"last layer": masked + -masked % 8, "head": masked + -masked % 8}
    assert outputs[1].logits.shape == (masked, 99)
    torch.testing.assert_close(outputs[0].loss, outputs[1].loss, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(outputs[0].logits, outputs[1].logits, atol=1e-5, rtol=1e-5)
    for (name, p), q in zip(eager.named_parameters(), sdpa.parameters()):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-5, rtol=1e-4, msg=name)
    with torch.no_grad():  # the encoder alone returns the rows read, without the fillers
        read = sdpa.sinebert(inputs["input_ids"], inputs["attention_mask"], output_mask=inputs["labels"] != -100)
    assert read.last_hidden_state.shape == (masked, 32)


@pytest.mark.parametrize("positions", ["absolute", "rotary"])
@pytest.mark.parametrize(("key_multiple", "row_multiple"), [(1, 1), (32, 16)])
@pytest.mark.parametrize("cls", [SineBertModel, SineBertForMaskedLM, SineBertForSequenceClassification])
def test_length_buckets_match_the_reference_with_left_padding_and_empty_rows(cls, key_multiple, row_multiple,
                                                                             positions, monkeypatch):
    """Batches whose lengths differ enough run full attention in several buckets; outputs and gradients equal the
    eager reference's, with left padding, an empty row (the bare encoder), the last layer's rows read, and the
    buckets' keys and the rows rounded up as for bf16 on a CPU (here in float32, so that it is exact)."""
    monkeypatch.setattr("sinebert.layout_sinebert.unpadded_multiples", lambda *args: (key_multiple, row_multiple))
    eager, sdpa = _model_pair(cls, num_labels=3, sparse_prediction=True, max_position_embeddings=128,
                              position_embedding_type=positions)
    lengths = torch.tensor([96, 7, 64, 3, 90, 12, 40, 0 if cls is SineBertModel else 5])
    mask = (torch.arange(96) < lengths[:, None]).long()
    mask[1] = mask[1].flip(0)  # left padding
    ids = torch.randint(5, 99, mask.shape, generator=torch.Generator().manual_seed(3))
    assert len(TokenRows.from_mask(mask, 1).buckets) > 1
    filled = TokenRows.from_mask(mask, 1, key_multiple, row_multiple)
    assert len(filled.rows) > mask.sum() or row_multiple == 1  # fillers
    inputs = {"input_ids": ids, "attention_mask": mask}
    if cls is SineBertForMaskedLM:
        chosen = (torch.rand(mask.shape, generator=torch.Generator().manual_seed(4)) < 0.2) & mask.bool()
        inputs["labels"] = torch.where(chosen, ids, -100)
    elif cls is SineBertForSequenceClassification:
        mask[1] = mask[1].flip(0)  # cls pooling reads the first token only where no row starts with padding
        inputs["labels"] = torch.tensor([0, 2, 1, 1, 0, 2, 2, 1])
    real = mask.bool()
    # A fixed random projection of the hidden states: their plain sum (or sum of squares) after a LayerNorm barely
    # depends on the inputs, and its gradients would be rounding noise.
    weights = torch.randn(int(real.sum()), 32, generator=torch.Generator().manual_seed(5))
    outputs = []
    for model in (eager, sdpa):
        output = model(**inputs, return_dict=False)
        values = output[1] if "labels" in inputs else output[0][real]
        (output[0] if "labels" in inputs else (values * weights).sum()).backward()
        outputs.append(values)
    torch.testing.assert_close(outputs[0], outputs[1], atol=1e-5, rtol=1e-5)
    for (name, p), q in zip(eager.named_parameters(), sdpa.parameters()):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-5, rtol=1e-4, msg=name)


def test_tokens_to_keep_keeps_every_predicted_token_and_a_random_share_of_the_others():
    lengths = torch.tensor([20, 9, 1, 0])
    real = torch.arange(20) < lengths[:, None]
    predicted = real & (torch.arange(20) % 3 == 0)
    predicted[1, :8] = True  # more predicted tokens than the share: all are kept anyway
    draws = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        kept = tokens_to_keep(predicted, real.long(), 0.5)
        assert not (kept & ~real).any() and (kept | ~predicted).all()
        assert kept.sum(1).tolist() == [10, 8, 1, 0]  # half of 20 (7 predicted), the 8 predicted, half of 1, none
        draws.append(kept)
    assert not torch.equal(*draws)  # the others are drawn at random
    torch.manual_seed(0)
    assert torch.equal(tokens_to_keep(predicted, None, 1.0), torch.ones_like(real))


def test_tokens_to_keep_ranks_the_others_by_importance_with_ties_at_random():
    real = torch.arange(8) < torch.tensor([8, 6])[:, None]
    predicted = torch.zeros(2, 8, dtype=torch.bool)
    predicted[0, 7] = predicted[1, 0] = True
    # Infinite importance (ids never predicted) ranks above every finite one, and still below the predicted tokens.
    importance = torch.tensor([[0.5, 3.0, 1.0, math.inf, 2.0, 0.1, 2.5, -9.0],
                               [math.inf, 1.0, 1.0, 1.0, 1.0, 0.0, 9.0, 9.0]])
    draws = set()
    for seed in range(20):
        torch.manual_seed(seed)
        kept = tokens_to_keep(predicted, real.long(), 0.5, importance)
        assert kept[0].nonzero().flatten().tolist() == [1, 3, 6, 7]  # 3.0, inf, 2.5 and the predicted one
        # Row 1: 6 real tokens, 3 kept: the predicted one first (its infinite importance does not matter), then two
        # of the four tied at 1.0 (in random order); never the padding at 6 and 7 however important.
        row = kept[1].nonzero().flatten().tolist()
        assert row[0] == 0 and len(row) == 3 and set(row[1:]) <= {1, 2, 3, 4}
        draws.add(tuple(row))
    assert len(draws) > 1  # the ties are broken at random
    torch.manual_seed(0)
    everything = tokens_to_keep(torch.ones(2, 8, dtype=torch.bool) & real, real.long(), 0.1, importance)
    assert torch.equal(everything, real)  # every predicted token is kept, whatever the share


def _dropping_inputs(padded: bool) -> dict:
    lengths = torch.tensor([30, 11, 30, 4] if padded else [30] * 4)
    mask = (torch.arange(30) < lengths[:, None]).long()
    ids = torch.randint(5, 99, mask.shape, generator=torch.Generator().manual_seed(3))
    chosen = (torch.rand(mask.shape, generator=torch.Generator().manual_seed(4)) < 0.2) & mask.bool()
    return {"input_ids": ids, "attention_mask": mask, "labels": torch.where(chosen, ids, -100)}


@pytest.mark.parametrize("positions", ["absolute", "rotary"])
@pytest.mark.parametrize(("key_multiple", "row_multiple"), [(1, 1), (32, 16)])
@pytest.mark.parametrize("padded", [True, False])
@pytest.mark.parametrize("norm_placement", ["post", "pre"])
def test_token_dropping_matches_the_reference_and_its_gradients(norm_placement, padded, key_multiple, row_multiple,
                                                                positions, monkeypatch):
    """While the masked-LM head trains, layers 1 and 2 of 4 compute only the kept tokens, on the fast path as in
    the eager reference (the same draw of tokens), with and without padding and with rows and keys rounded up."""
    monkeypatch.setattr("sinebert.layout_sinebert.unpadded_multiples", lambda *args: (key_multiple, row_multiple))
    monkeypatch.setattr("sinebert.layout_sinebert.FILLED_MIN_ROWS", 1)
    overrides = dict(num_hidden_layers=4, sparse_prediction=True, norm_placement=norm_placement,
                     token_dropping_layers=[1, 3], token_dropping_keep=0.4, position_embedding_type=positions)
    eager, sdpa = (model.train() for model in _model_pair(SineBertForMaskedLM, **overrides))
    inputs = _dropping_inputs(padded)
    rows = []
    sdpa.sinebert.layers[2].mlp.register_forward_hook(lambda module, args, output: rows.append(len(args[0])))
    outputs = []
    for model in (eager, sdpa):
        torch.manual_seed(5)  # the same tokens kept
        output = model(**inputs)
        output.loss.backward()
        outputs.append(output.logits)
    torch.testing.assert_close(outputs[0], outputs[1], atol=1e-5, rtol=1e-5)
    for (name, p), q in zip(eager.named_parameters(), sdpa.parameters()):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-5, rtol=1e-4, msg=name)
    torch.manual_seed(5)
    kept = tokens_to_keep(inputs["labels"] != -100, inputs["attention_mask"], 0.4)
    assert rows == [int(kept.sum()) + -int(kept.sum()) % row_multiple]  # the kept tokens' rows and their fillers
    eager.config.token_dropping_layers = None
    assert (eager(**inputs).logits - outputs[0]).abs().max() > 1e-5  # without dropping they differ


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_dropped_tokens_skip_the_dropping_layers_and_every_token_runs_the_others(implementation):
    config = tiny_config(num_hidden_layers=4, token_dropping_layers=[1, -1])  # layers 1 and 2, as [1, 3]
    config._attn_implementation = implementation
    torch.manual_seed(0)
    model = SineBertModel(config).eval()
    inputs = _dropping_inputs(padded=True)
    kept = inputs["attention_mask"].bool() & (torch.arange(30) % 2 == 0)
    del inputs["labels"]
    states = model(**inputs, kept_tokens=kept, output_hidden_states=True).hidden_states
    real, dropped = inputs["attention_mask"].bool(), inputs["attention_mask"].bool() & ~kept
    torch.testing.assert_close(states[3][dropped], states[1][dropped])  # unchanged through layers 1 and 2
    assert not torch.allclose(states[3][kept], states[1][kept])
    assert not torch.allclose(states[4][real], states[3][real], atol=1e-3)  # the last layer computes them all
    plain = model(**inputs, output_hidden_states=True).hidden_states
    torch.testing.assert_close(states[1], plain[1])  # before the dropping layers nothing changes


def test_token_dropping_applies_only_to_masked_lm_training_with_labels():
    torch.manual_seed(0)
    config = tiny_config(num_hidden_layers=4, sparse_prediction=True)
    plain = SineBertForMaskedLM(config)
    dropping = SineBertForMaskedLM(tiny_config(num_hidden_layers=4, sparse_prediction=True,
                                               token_dropping_layers=[1, 3], token_dropping_keep=0.3))
    dropping.load_state_dict(plain.state_dict())
    inputs = _dropping_inputs(padded=True)
    for model in (plain, dropping):
        model.eval()
    torch.testing.assert_close(dropping(**inputs).loss, plain(**inputs).loss)
    plain.train(), dropping.train()
    unlabelled = {k: v for k, v in inputs.items() if k != "labels"}
    torch.testing.assert_close(dropping(**unlabelled).logits, plain(**unlabelled).logits)
    assert (dropping(**inputs).logits - plain(**inputs).logits).abs().max() > 1e-5


def test_token_dropping_by_loss_keeps_the_tokens_of_the_highest_running_loss_and_tracks_it():
    config = tiny_config(num_hidden_layers=4, sparse_prediction=True, token_dropping_layers=[1, 3],
                         token_dropping_keep=0.4, token_dropping_policy="loss")
    torch.manual_seed(0)
    model = SineBertForMaskedLM(config).train()
    assert model.token_loss.running.isinf().all()  # nothing predicted yet
    running = torch.rand(config.vocab_size) * 5
    running[7] = math.inf
    model.token_loss.running.copy_(running)
    inputs = _dropping_inputs(padded=True)
    seen = []
    model.sinebert.register_forward_pre_hook(lambda m, args, kwargs: seen.append(kwargs["kept_tokens"]),
                                             with_kwargs=True)
    torch.manual_seed(5)
    output = model(**inputs)
    predicted, real = inputs["labels"] != -100, inputs["attention_mask"].bool()
    torch.manual_seed(5)
    expected = tokens_to_keep(predicted, inputs["attention_mask"], 0.4, running[inputs["input_ids"]])
    assert torch.equal(seen[0], expected)
    for row in range(4):  # every unpredicted token kept has a running loss at least that of every one dropped
        kept, dropped = (running[inputs["input_ids"][row][mask[row] & ~predicted[row]]]
                         for mask in (expected, real & ~expected))
        assert len(kept) and (not len(dropped) or kept.min() >= dropped.max())
    # The loss is the usual mean; each predicted id's running loss moved toward its mean loss in this batch.
    labels = inputs["labels"][predicted]
    losses = F.cross_entropy(output.logits.float(), labels, reduction="none")
    torch.testing.assert_close(output.loss, losses.mean())
    for token in labels.unique().tolist():
        mean = losses[labels == token].mean()
        want = mean if math.isinf(running[token]) else 0.9 * running[token] + 0.1 * mean
        torch.testing.assert_close(model.token_loss.running[token], want)
    untouched = torch.ones(config.vocab_size, dtype=torch.bool).index_fill(0, labels, False)
    assert torch.equal(model.token_loss.running[untouched], running[untouched])
    after = model.token_loss.running.clone()
    model.eval()(**inputs)  # evaluation neither drops tokens nor updates the table
    assert torch.equal(model.token_loss.running, after)
    with pytest.raises(ValueError, match="inputs_embeds"):
        model.train()(inputs_embeds=model.get_input_embeddings()(inputs["input_ids"]),
                      attention_mask=inputs["attention_mask"], labels=inputs["labels"])


def _update_in_process(rank: int, store: str, ids: torch.Tensor, losses: torch.Tensor, out: str):
    torch.distributed.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2,
                                         timeout=datetime.timedelta(seconds=60))  # a missed all-reduce fails, not hangs
    table = TokenLoss(6)
    table.running[2] = 1.0
    half = slice(rank * 3, rank * 3 + 3)  # each process predicted half of the tokens
    table.update(ids[half], losses[half])
    if rank == 0:  # then id 4's loss is NaN and id 5's is 0; process 1 sees a batch again, which must not count
        table.update(torch.tensor([4, 5]), torch.tensor([math.nan, 0.0]))
    else:
        with table.paused():
            table.update(torch.tensor([2]), torch.tensor([100.0]))
    save_file({"running": table.running}, f"{out}{rank}")
    torch.distributed.destroy_process_group()


def test_running_token_loss_is_one_table_across_processes_of_finite_losses_seen_once(tmp_path):
    ids, losses = torch.tensor([2, 4, 2, 2, 4, 5]), torch.tensor([3.0, 1.0, 5.0, 1.0, 2.0, 4.0])
    torch.multiprocessing.spawn(_update_in_process, args=(str(tmp_path / "store"), ids, losses, str(tmp_path / "t")),
                                nprocs=2)
    one = TokenLoss(6)
    one.running[2] = 1.0
    one.update(ids, losses)  # one process seeing the whole batch
    # id 2: 0.9 * 1 + 0.1 * mean(3, 5, 1); ids 4 and 5 first seen: their mean; ids 0, 1, 3 never predicted.
    assert one.running.tolist() == pytest.approx([math.inf, math.inf, 0.9 + 0.3, math.inf, 1.5, 4.0])
    one.update(torch.tensor([5]), torch.tensor([0.0]))  # the second round's only counted loss: 0.9 * 4 + 0.1 * 0
    assert one.running.tolist() == pytest.approx([math.inf, math.inf, 1.2, math.inf, 1.5, 3.6])
    for rank in (0, 1):
        assert torch.equal(load_file(tmp_path / f"t{rank}")["running"], one.running)


def test_a_training_step_folds_its_batch_into_the_running_loss_once(tmp_path):
    """The adversarial pass sees the batch a second time, and a streaming process's repeated batch (REPEATED) only
    keeps the processes in step: neither moves the table."""
    from sinebert.training.loop import REPEATED, Task, Trainer, _step_seed, setup_accelerator
    from sinebert.training.mlm import masked_token_count

    args = load_script("pretrain").parse_args(["--train_file", "unused.txt", "--output_dir", str(tmp_path),
                                               "--adversarial_epsilon", "0.5", "--max_train_steps", "2"])
    config = tiny_config(num_hidden_layers=4, sparse_prediction=True, token_dropping_layers=[1, 3],
                         token_dropping_keep=0.4, token_dropping_policy="loss")
    torch.manual_seed(0)
    model, reference = SineBertForMaskedLM(config), SineBertForMaskedLM(config)
    reference.load_state_dict(model.state_dict())
    batch = _dropping_inputs(padded=True)
    loader = torch.utils.data.DataLoader([batch], batch_size=None)
    trainer = Trainer(args, setup_accelerator(args), model, loader, Task(count=masked_token_count))
    gradients_at_optimizer_step(trainer, model, {**batch, REPEATED: True})
    assert model.token_loss.running.isinf().all()
    gradients_at_optimizer_step(trainer, model, dict(batch))
    torch.manual_seed(_step_seed(args.seed, trainer.state.step, 0, 0))
    reference.train()(**batch)  # the clean pass alone, with the step's draw of kept tokens
    assert model.token_loss.running.isfinite().any()
    assert torch.equal(model.token_loss.running, reference.token_loss.running)


def test_kept_tokens_need_the_dropping_layers_and_real_tokens():
    inputs = _dropping_inputs(padded=True)
    del inputs["labels"]
    model = SineBertModel(tiny_config(num_hidden_layers=4))
    with pytest.raises(ValueError, match="token_dropping_layers"):
        model(**inputs, kept_tokens=inputs["attention_mask"].bool())
    model = SineBertModel(tiny_config(num_hidden_layers=4, token_dropping_layers=[1, 3]))
    with pytest.raises(ValueError, match="padding"):
        model(**inputs, kept_tokens=torch.ones_like(inputs["input_ids"], dtype=torch.bool))
    with pytest.raises(ValueError, match=r"\(4, 30\), got \(4, 29\)"):
        model(**inputs, kept_tokens=inputs["attention_mask"][:, 1:].bool())
    # A checkpoint pretrained with token dropping loads with windows, but does not drop tokens in them.
    model = SineBertModel(tiny_config(num_hidden_layers=4, token_dropping_layers=[1, 3], sliding_window=4))
    model(**inputs)
    with pytest.raises(ValueError, match=r"sliding-window layers \[1, 2\]"):
        model(**inputs, kept_tokens=inputs["attention_mask"].bool())


@pytest.mark.parametrize("positions", ["absolute", "rotary"])
@pytest.mark.parametrize("inputs_given", ["position_ids", "one_row_of_position_ids", "inputs_embeds", "case_ids"])
def test_real_tokens_alone_are_embedded_as_the_reference_embeds_them_in_the_padded_batch(inputs_given, positions):
    eager, sdpa = _model_pair(SineBertModel, letter_case=inputs_given == "case_ids", position_embedding_type=positions)
    inputs = _inputs(batch=2, seq=12)  # the second row is padded from position 6 on
    inputs["token_type_ids"] = (torch.arange(12) >= 4).long().expand(2, 12)
    if inputs_given == "position_ids":
        inputs["position_ids"] = torch.arange(24).view(2, 12) + 3
    elif inputs_given == "one_row_of_position_ids":
        inputs["position_ids"] = torch.arange(12)[None] * 2
    elif inputs_given == "inputs_embeds":
        inputs["inputs_embeds"] = eager.embeddings.word_embeddings(inputs.pop("input_ids")) * 1.5
    else:
        inputs["case_ids"] = torch.randint(0, 3, (2, 12), generator=torch.Generator().manual_seed(6))
    real = inputs["attention_mask"].bool()
    with torch.no_grad():
        a, b = (model(**inputs).last_hidden_state for model in (eager, sdpa))
    torch.testing.assert_close(a[real], b[real], atol=1e-5, rtol=1e-5)


def test_keys_rounded_up_are_masked_even_where_every_sequence_has_the_same_length(monkeypatch):
    monkeypatch.setattr("sinebert.layout_sinebert.unpadded_multiples", lambda *args: (32, 16))
    eager, sdpa = _model_pair(SineBertModel)
    mask = (torch.arange(24) < 20).long().repeat(3, 1)  # one bucket of three sequences of 20: 12 keys added
    ids = torch.randint(5, 99, mask.shape, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        a, b = (model(input_ids=ids, attention_mask=mask).last_hidden_state for model in (eager, sdpa))
    torch.testing.assert_close(a[mask.bool()], b[mask.bool()], atol=1e-5, rtol=1e-5)


def test_output_mask_selects_rows_on_every_path_and_rejects_padding_and_wrong_shapes():
    eager, sdpa = _model_pair(SineBertModel)
    inputs = _inputs(batch=2, seq=12)  # the second row is padded from position 6 on
    read = torch.zeros(2, 12, dtype=torch.bool)
    read[0, 3], read[1, 1], read[1, 5] = True, True, True
    with torch.no_grad():
        full = eager(**inputs).last_hidden_state
        for model in (eager, sdpa):
            torch.testing.assert_close(model(**inputs, output_mask=read).last_hidden_state, full[read])
            hidden = model(**inputs, output_mask=read, output_hidden_states=True)
            torch.testing.assert_close(hidden.last_hidden_state, full[read])
            assert hidden.hidden_states[-1].shape == (2, 12, 32)
            with pytest.raises(ValueError, match=r"include padding \(attention_mask 0\); read real tokens only"):
                model(**inputs, output_mask=read.index_fill(1, torch.tensor([8]), True))
            with pytest.raises(ValueError, match=r"output_mask must have the shape of the input, \(batch, seq\)"):
                model(**inputs, output_mask=read[:, :5])


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
@pytest.mark.parametrize("norm_placement", ["post", "pre"])
def test_padding_does_not_change_real_tokens(implementation, norm_placement):
    model = SineBertModel(tiny_config(norm_placement=norm_placement)).eval()
    model.config._attn_implementation = implementation
    ids = torch.randint(5, 99, (1, 10))
    padded = torch.cat([ids, torch.zeros(1, 6, dtype=torch.long)], dim=1)
    mask = torch.cat([torch.ones(1, 10), torch.zeros(1, 6)], dim=1).long()
    with torch.no_grad():
        plain = model(input_ids=ids).last_hidden_state
        with_padding = model(input_ids=padded, attention_mask=mask).last_hidden_state[:, :10]
    torch.testing.assert_close(plain, with_padding, atol=1e-5, rtol=1e-5)


def test_zero_length_input_runs():
    model = SineBertForMaskedLM(tiny_config()).eval()
    out = model(input_ids=torch.zeros(2, 0, dtype=torch.long), attention_mask=torch.zeros(2, 0, dtype=torch.long))
    assert out.logits.shape == (2, 0, 99)


def _inputs(batch=2, seq=12):
    torch.manual_seed(1)
    ids = torch.randint(5, 99, (batch, seq))
    mask = torch.ones_like(ids)
    mask[-1, seq // 2 :] = 0
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}


def _first_output(model, inputs):
    with torch.no_grad():
        return model(**inputs, return_dict=False)[0]


@pytest.mark.parametrize("cls", ALL_HEADS)
def test_save_and_load_round_trip(cls, tmp_path):
    model = cls(tiny_config(num_labels=3)).eval()
    model.save_pretrained(tmp_path)
    loaded = cls.from_pretrained(tmp_path).eval()
    torch.testing.assert_close(
        loaded.sinebert.embeddings.position_table if cls is not SineBertModel else loaded.embeddings.position_table,
        sinusoidal_encoding(torch.arange(64), 32),
    )
    inputs = _inputs()
    torch.testing.assert_close(_first_output(model, inputs), _first_output(loaded, inputs), atol=0, rtol=0)
    assert (tmp_path / "model.safetensors").is_file()
    assert not list(tmp_path.glob("*.bin"))


def test_position_scale_defaults_match_word_vectors_and_older_checkpoints_load_as_they_were(tmp_path):
    import json
    import math

    assert tiny_config().position_scale == pytest.approx(math.sqrt(2) * 0.02)
    assert tiny_config(initializer_range=0.05).position_scale == pytest.approx(math.sqrt(2) * 0.05)
    assert tiny_config(scale_embeddings=True).position_scale == 1.0  # the original Transformer's sum
    model = SineBertModel(tiny_config(position_scale=1.0)).eval()
    model.save_pretrained(tmp_path)
    # A checkpoint saved before position_scale (and position_embedding_type) existed has no such key: it added the
    # sinusoid unscaled.
    config_file = tmp_path / "config.json"
    config_file.write_text(json.dumps({k: v for k, v in json.loads(config_file.read_text()).items()
                                       if k not in ("position_scale", "position_embedding_type")}))
    loaded = SineBertModel.from_pretrained(tmp_path).eval()
    assert (loaded.config.position_scale, loaded.config.position_embedding_type) == (1.0, "absolute")
    inputs = _inputs()
    torch.testing.assert_close(_first_output(model, inputs), _first_output(loaded, inputs), atol=0, rtol=0)
    with pytest.raises(ValueError, match="position_scale must be a non-negative number"):
        tiny_config(position_scale=-1.0)


def test_token_dropping_keeps_a_random_share_by_default_with_no_table():
    assert tiny_config().token_dropping_policy == "random"
    model = SineBertForMaskedLM(tiny_config(num_hidden_layers=4, token_dropping_layers=[1, 3]))
    assert model.token_loss is None and not any("token_loss" in k for k in model.state_dict())
    model.config.token_dropping_policy = "loss"  # after the model was built: no table to rank by, no silent draw
    with pytest.raises(ValueError, match="running-loss table"):
        model.train()(**_dropping_inputs(padded=True))


def test_auto_classes_load_every_head(tmp_path):
    from transformers import AutoConfig

    SineBertForMaskedLM(tiny_config()).save_pretrained(tmp_path)
    assert isinstance(AutoConfig.from_pretrained(tmp_path), SineBertConfig)
    for auto, cls in auto_heads():
        assert type(auto.from_pretrained(tmp_path)) is cls


@pytest.mark.parametrize("recipe", [{}, dict(position_embedding_type="rotary", norm_placement="pre",
                                             scale_embeddings=True, attention_init="mimetic", mlp_type="glu")],
                         ids=["defaults", "pretraining recipe"])
def test_bf16_weights_serve_every_head_as_float32_does(tmp_path, recipe):
    """`from_pretrained(..., dtype=torch.bfloat16)`, as a server loads a checkpoint in half the memory: every head
    computes in bf16 end to end (nothing promoted to float32 on the way, which would fail at the next bf16 matrix)
    and gives float32's outputs at the real tokens of a padded batch, to bf16's precision."""
    torch.manual_seed(0)
    SineBertForMaskedLM(tiny_config(**recipe)).save_pretrained(tmp_path)
    inputs = _inputs()
    real = inputs["attention_mask"].bool()
    for auto, _ in auto_heads():
        torch.manual_seed(1)  # the same fresh task head in both
        full = auto.from_pretrained(tmp_path).eval()
        torch.manual_seed(1)
        half = auto.from_pretrained(tmp_path, dtype=torch.bfloat16).eval()
        assert {p.dtype for p in half.parameters()} == {torch.bfloat16}, auto.__name__
        expected, served = _first_output(full, inputs), _first_output(half, inputs)
        assert served.dtype == torch.bfloat16, auto.__name__
        if served.dim() == 3:  # per token: the padding's outputs are not compared
            expected, served = expected[real], served[real]
        torch.testing.assert_close(served.float(), expected, atol=0.03, rtol=0.03, msg=auto.__name__)


def test_bf16_linear_serves_through_onednn_with_the_bias_fused_and_equals_f_linear():
    from sinebert.linear_sinebert import SineBertLinear

    torch.manual_seed(0)
    layer = SineBertLinear(32, 48).to(torch.bfloat16)
    x = torch.randn(3, 5, 32, dtype=torch.bfloat16)
    with torch.no_grad(), torch.profiler.profile() as trace:
        served = layer(x)
    ran = {event.key for event in trace.key_averages()}
    assert "mkldnn::_linear_pointwise" in ran and "aten::addmm" not in ran
    assert torch.equal(served, F.linear(x, layer.weight, layer.bias))  # bit for bit, the bias rounded once as there
    # With a gradient, in float32, or on a strided input, F.linear runs, so autograd and every other case are its.
    for inputs, grad in ((x, True), (x.float(), False), (torch.randn(3, 64, 32, dtype=torch.bfloat16)[:, ::2], False)):
        layer.to(inputs.dtype)
        with torch.set_grad_enabled(grad), torch.profiler.profile() as trace:
            out = layer(inputs)
        assert "mkldnn::_linear_pointwise" not in {event.key for event in trace.key_averages()}
        assert torch.equal(out, F.linear(inputs, layer.weight, layer.bias))
        if grad:
            out.sum().backward()
            assert layer.weight.grad is not None


def test_masked_lm_decoder_is_tied_and_sparse_prediction_gives_the_same_loss():
    model = SineBertForMaskedLM(tiny_config()).eval()
    assert model.decoder.weight is model.sinebert.embeddings.word_embeddings.weight
    inputs = _inputs()
    labels = torch.full_like(inputs["input_ids"], -100)
    labels[0, 2], labels[1, 4], labels[0, 7] = 11, 12, 13
    with torch.no_grad():
        dense = model(**inputs, labels=labels)
        model.config.sparse_prediction = True
        sparse = model(**inputs, labels=labels)
        unlabelled = model(**inputs)
    assert dense.logits.shape == (2, 12, 99) and sparse.logits.shape == (3, 99)
    assert unlabelled.logits.shape == (2, 12, 99)
    torch.testing.assert_close(dense.loss, sparse.loss)
    torch.testing.assert_close(sparse.logits, dense.logits[labels != -100])


def test_sequence_classification_problem_types():
    inputs = _inputs()
    regression = SineBertForSequenceClassification(tiny_config(num_labels=1))
    assert regression(**inputs, labels=torch.tensor([0.5, 1.5])).loss > 0
    assert regression.config.problem_type == "regression"
    single = SineBertForSequenceClassification(tiny_config(num_labels=3))
    assert single(**inputs, labels=torch.tensor([0, 2])).loss > 0
    assert single.config.problem_type == "single_label_classification"
    multi = SineBertForSequenceClassification(tiny_config(num_labels=3, problem_type="multi_label_classification"))
    assert multi(**inputs, labels=torch.tensor([[1.0, 0.0, 1.0], [0.0, 1.0, 0.0]])).loss > 0


def test_mean_pooling_ignores_padding():
    model = SineBertForSequenceClassification(tiny_config(classifier_pooling="mean")).eval()
    ids = torch.randint(5, 99, (1, 8))
    padded = torch.cat([ids, torch.zeros(1, 4, dtype=torch.long)], dim=1)
    mask = torch.cat([torch.ones(1, 8), torch.zeros(1, 4)], dim=1).long()
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids).logits, model(input_ids=padded, attention_mask=mask).logits)


def test_question_answering_loss_ignores_out_of_range_positions():
    model = SineBertForQuestionAnswering(tiny_config())
    inputs = _inputs()
    loss = model(**inputs, start_positions=torch.tensor([1, 50]), end_positions=torch.tensor([3, 50])).loss
    assert torch.isfinite(loss)


def test_hidden_states_attentions_and_tuples():
    model = SineBertModel(tiny_config()).eval()
    inputs = _inputs()
    with pytest.raises(ValueError, match="attn_implementation='eager'"):
        model(**inputs, output_attentions=True)
    model.config._attn_implementation = "eager"
    out = model(**inputs, output_attentions=True, output_hidden_states=True)
    assert len(out.hidden_states) == 3 and len(out.attentions) == 2
    assert out.attentions[0].shape == (2, 4, 12, 12)
    real = inputs["attention_mask"].bool()
    torch.testing.assert_close(out.attentions[0].sum(-1)[real[:, None, :].expand(-1, 4, -1)], torch.ones(2 * 4 * 12 - 4 * 6))
    as_tuple = model(**inputs, return_dict=False)
    assert isinstance(as_tuple, tuple)
    torch.testing.assert_close(as_tuple[0], out.last_hidden_state)


def test_gradient_checkpointing_gives_the_same_gradients():
    torch.manual_seed(0)
    model = SineBertForMaskedLM(tiny_config()).train()
    inputs = _inputs()
    labels = inputs["input_ids"].clone()

    def grads():
        model.zero_grad()
        model(**inputs, labels=labels).loss.backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    plain = grads()
    model.activation_checkpointing_enable()
    assert model.sinebert.layers[0].gradient_checkpointing
    checkpointed = grads()
    model.activation_checkpointing_disable()
    with pytest.warns(FutureWarning):
        model.gradient_checkpointing_enable()  # the transformers 4 name keeps working
    assert model.sinebert.layers[0].gradient_checkpointing
    assert plain.keys() == checkpointed.keys()
    for name in plain:
        torch.testing.assert_close(plain[name], checkpointed[name], atol=1e-6, rtol=1e-5)


def test_bf16_autocast_forward_and_backward_on_cpu():
    model = SineBertForMaskedLM(tiny_config()).train()
    inputs = _inputs()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(**inputs, labels=inputs["input_ids"])
    out.loss.backward()
    assert torch.isfinite(out.loss)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


@pytest.mark.parametrize(
    ("overrides", "shown"),
    [
        (dict(hidden_size=30, num_attention_heads=4), "hidden_size=30"),
        (dict(hidden_dropout_prob=1.0), "1.0"),
        (dict(attention_probs_dropout_prob=-0.1), "-0.1"),
        (dict(classifier_dropout=1.5), "1.5"),
        (dict(norm_placement="middle"), "middle"),
        (dict(classifier_pooling="max"), "max"),
        (dict(attention_init="identity"), "identity"),
        (dict(position_embedding_type="relative_key"), "relative_key"),
        (dict(position_embedding_type="rotary", hidden_size=36, num_attention_heads=4), "odd head size"),
        (dict(position_embedding_type="rotary", rope_theta=1.0), "rope_theta"),
        (dict(hidden_act="swishy"), "swishy"),
        (dict(mlp_type="swiglu"), "swiglu"),
        (dict(bias="no"), "bias must be true or false"),
        (dict(num_hidden_layers=0), "num_hidden_layers"),
        (dict(vocab_size=-5), "-5"),
        (dict(intermediate_size=0), "intermediate_size"),
        (dict(pad_token_id=500), "500"),
        (dict(token_dropping_layers=[0, 2]), "of the 2 layers"),
        (dict(token_dropping_layers=[1, -1]), r"\[1, -1\]"),  # empty with 2 layers
        (dict(token_dropping_layers=[1]), "token_dropping_layers"),
        (dict(token_dropping_layers=[0, 1], token_dropping_keep=0.0), "token_dropping_keep"),
        (dict(token_dropping_layers=[0, 1], token_dropping_policy="first"), "token_dropping_policy must be one of"),
    ],
)
def test_invalid_configurations_raise(overrides, shown):
    with pytest.raises(ValueError, match=shown):
        tiny_config(**overrides)


def _query_key_and_value_out(attention: SineBertAttention) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Per head W_q^T W_k `(hidden, hidden)` (the logits are x W_q^T W_k x'^T), and W_v^T W_o^T of all heads."""
    hidden, heads = attention.out_proj.in_features, attention.num_heads
    query, key, value = attention.qkv_proj.weight.detach().split(hidden)
    head_rows = [slice(h * hidden // heads, (h + 1) * hidden // heads) for h in range(heads)]
    return [query[r].T @ key[r] for r in head_rows], value.T @ attention.out_proj.weight.detach().T


def test_mimetic_init_makes_attention_start_near_the_identity():
    torch.manual_seed(0)
    config = tiny_config(hidden_size=64, num_attention_heads=4, attention_init="mimetic")
    model = SineBertForMaskedLM(config)
    for layer in model.base_model.layers:
        query_key, value_out = _query_key_and_value_out(layer.attention)
        for product in query_key:  # rank-16 part of 0.7 Z + 0.7 I: a positive diagonal over small off-diagonal terms
            off_diagonal = product - product.diagonal().diag()
            assert product.diagonal().mean() > 0.2 > 2 * off_diagonal.std()
        # full rank: exactly 0.4 Z - 0.4 I, Z of 1/hidden variance
        assert value_out.diagonal().mean() == pytest.approx(-0.4, abs=0.05)
        assert (value_out + 0.4 * torch.eye(64)).std() == pytest.approx(0.4 / 8, rel=0.1)
        assert not layer.attention.qkv_proj.bias.any() and not layer.attention.out_proj.bias.any()
    normal = SineBertForMaskedLM(tiny_config(hidden_size=64, num_attention_heads=4))
    query_key, value_out = _query_key_and_value_out(normal.base_model.layers[0].attention)
    assert abs(value_out.diagonal().mean()) < 0.01 and all(abs(p.diagonal().mean()) < 0.01 for p in query_key)
    torch.manual_seed(0)
    again = SineBertForMaskedLM(config)
    assert torch.equal(again.base_model.layers[1].attention.out_proj.weight,
                       model.base_model.layers[1].attention.out_proj.weight)


def test_mimetic_checkpoint_loads_unchanged_under_every_head(tmp_path):
    """Loading never reinitialises the attention weights it reads, whichever head the checkpoint is loaded under."""
    torch.manual_seed(0)
    model = SineBertForMaskedLM(tiny_config(attention_init="mimetic"))
    with torch.no_grad():  # weights no initialisation could produce
        for parameter in model.parameters():
            parameter.add_(0.5)
    model.save_pretrained(tmp_path)
    saved = model.base_model.state_dict()
    for cls in ALL_HEADS:
        loaded = cls.from_pretrained(tmp_path)
        for name, value in loaded.base_model.state_dict().items():
            assert torch.equal(value, saved[name]), (cls.__name__, name)


def test_cross_segment_match_marks_shared_tokens_and_starts_as_the_model_without_it(tmp_path):
    #                      [CLS] q:  a   b   c  [SEP] c:  b   d   a   a  [SEP]
    ids = torch.tensor([[2, 10, 11, 12, 3, 11, 13, 10, 10, 3]])
    types = torch.tensor([[0, 0, 0, 0, 0, 1, 1, 1, 1, 1]])
    assert cross_segment_matches(ids, types, 99).tolist() == [[0, 1, 1, 0, 1, 1, 0, 1, 1, 1]]
    assert not cross_segment_matches(ids, torch.zeros_like(types), 99).any()
    SineBertForQuestionAnswering(tiny_config()).save_pretrained(tmp_path / "plain")
    plain = SineBertForQuestionAnswering.from_pretrained(tmp_path / "plain").eval()
    matched = SineBertForQuestionAnswering.from_pretrained(tmp_path / "plain", cross_segment_match=True).eval()
    pair = {"input_ids": ids, "token_type_ids": types}
    torch.testing.assert_close(_first_output(matched, pair), _first_output(plain, pair), atol=0, rtol=0)
    with torch.no_grad():
        matched.sinebert.embeddings.segment_match.normal_()
    assert not torch.allclose(_first_output(matched, pair), _first_output(plain, pair))
    single = {"input_ids": ids}  # no token types: one segment, nothing matches
    torch.testing.assert_close(_first_output(matched, single), _first_output(plain, single), atol=0, rtol=0)
    matched.save_pretrained(tmp_path / "matched")
    loaded = SineBertForQuestionAnswering.from_pretrained(tmp_path / "matched").eval()
    assert loaded.config.cross_segment_match
    torch.testing.assert_close(_first_output(loaded, pair), _first_output(matched, pair), atol=0, rtol=0)


def test_letter_case_starts_as_the_model_without_it_and_is_required_once_on(tmp_path):
    ids = torch.tensor([[2, 10, 11, 12, 3]])
    case = torch.tensor([[0, 1, 1, 2, 0]])
    SineBertForTokenClassification(tiny_config()).save_pretrained(tmp_path / "plain")
    plain = SineBertForTokenClassification.from_pretrained(tmp_path / "plain").eval()
    cased = SineBertForTokenClassification.from_pretrained(tmp_path / "plain", letter_case=True).eval()
    torch.testing.assert_close(_first_output(cased, {"input_ids": ids, "case_ids": case}),
                               _first_output(plain, {"input_ids": ids}), atol=0, rtol=0)
    with pytest.raises(ValueError, match="reads the letter case .* from case_ids; tokenize with"):
        cased(input_ids=ids)
    with pytest.raises(ValueError, match="case_ids contains 3, outside \\[0, 3\\)"):
        cased(input_ids=ids, case_ids=case + 1)
    with torch.no_grad():
        cased.sinebert.embeddings.case_embeddings.normal_()
    changed = _first_output(cased, {"input_ids": ids, "case_ids": case})
    assert not torch.allclose(changed, _first_output(plain, {"input_ids": ids}))
    cased.save_pretrained(tmp_path / "cased")
    loaded = SineBertForTokenClassification.from_pretrained(tmp_path / "cased").eval()
    assert loaded.config.letter_case
    torch.testing.assert_close(_first_output(loaded, {"input_ids": ids, "case_ids": case}), changed, atol=0, rtol=0)


def test_out_of_range_token_ids_get_a_clear_error():
    model = SineBertModel(tiny_config())
    with pytest.raises(ValueError, match="contains 120, outside \\[0, 99\\)"):
        model(input_ids=torch.tensor([[1, 120]]))
    with pytest.raises(ValueError, match="token_type_ids contains 2, outside \\[0, 2\\) of the model's type_vocab"):
        model(input_ids=torch.tensor([[1, 12]]), token_type_ids=torch.tensor([[0, 2]], dtype=torch.int32))
