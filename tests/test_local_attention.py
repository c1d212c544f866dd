"""Sliding-window (local) attention: the blocked kernel against eager attention under the written-out band mask, the
mixed local/global model through both paths, locality itself, memory that never holds a (seq, seq) matrix, the config
checks, and checkpoints that reload under every Auto class."""

import subprocess
import sys
import textwrap

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from sinebert import SineBertConfig, SineBertForMaskedLM, SineBertForSequenceClassification, SineBertModel
from sinebert.attention_sinebert import local_attention_forward, local_attention_mask, local_dense_limit
from sinebert.layout_sinebert import padding_mask
from sinebert.modeling_sinebert import eager_attention_forward
from tests.conftest import auto_heads, tiny_config

MIXED = dict(num_hidden_layers=4, sliding_window=3, global_attn_every_n_layers=2, global_attention_positions=[0])

# (seq, window, global positions): windows below, at and above the kernel's minimum block (64), windows wider than
# the sequence, a sequence that is not a multiple of the block, global positions at the ends and past the end.
KERNEL_CASES = [
    (1, 1, ()),
    (10, 2, ()),
    (37, 3, (0,)),
    (150, 5, (0, 7, 149)),
    (130, 64, (0,)),
    (200, 70, (3, 500)),
    (9, 100, (0, 8)),
    (257, 128, ()),
]


def _padded_batch_mask(batch: int, seq: int) -> torch.Tensor:
    """1/0 `(batch, seq)`: row 0 full, row 1 half padded, row 2 (if any) fully padded."""
    mask = torch.ones(batch, seq, dtype=torch.long)
    if batch > 1:
        mask[1, max(1, seq // 2) :] = 0
    if batch > 2:
        mask[2] = 0
    return mask


@pytest.mark.parametrize(("seq", "window", "global_positions"), KERNEL_CASES)
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("blocks_kernel", ["sdpa", "matmul"])
def test_local_kernel_equals_eager_with_band_mask_and_gradients_match(seq, window, global_positions, padded,
                                                                      blocks_kernel, monkeypatch):
    """Through either kernel of the blocks (SDPA, or the matmul kernel's products and softmax)."""
    monkeypatch.setattr("sinebert.attention_sinebert.full_attention_kernel", lambda *args: blocks_kernel)
    torch.manual_seed(seq + window)
    module = nn.Module().eval()
    leaves = [torch.randn(3, 2, seq, 8, requires_grad=True) for _ in range(3)]  # (batch, heads, seq, head_dim)
    padding = padding_mask(_padded_batch_mask(3, seq)) if padded else None
    band = local_attention_mask(seq, window, global_positions, padding, torch.device("cpu"))
    reference, _ = eager_attention_forward(module, *leaves, band, scaling=0.35)
    blocked, weights = local_attention_forward(
        module, *leaves, padding, scaling=0.35, sliding_window=window, global_positions=global_positions
    )
    assert weights is None and blocked.shape == reference.shape == (3, seq, 2, 8)
    torch.testing.assert_close(blocked, reference, atol=1e-5, rtol=1e-5)
    upstream = torch.randn_like(reference)
    expected = torch.autograd.grad(reference, leaves, upstream)
    actual = torch.autograd.grad(blocked, leaves, upstream)
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a, e, atol=1e-5, rtol=1e-5)
    if padded:  # the fully padded row has no key to attend to: zeros, not NaN
        assert torch.count_nonzero(blocked[2]) == 0


def test_the_blocks_attend_through_the_kernel_full_attention_would_run_on_as_many_scores(monkeypatch):
    """SDPA in float32, the matmul kernel's products for bf16 on a CPU while training, and served only where the CPU
    has no AMX tiles (`full_attention_kernel`); the same outputs to bf16's rounding."""
    import sinebert.attention_sinebert as attention

    ran = []
    for helper in ("_blocks_through_sdpa", "_blocks_through_matmul"):
        original = getattr(attention, helper)
        monkeypatch.setattr(attention, helper, lambda *args, original=original, helper=helper: ran.append(helper)
                            or original(*args))
    module = nn.Module().eval()
    query, key, value = (torch.randn(2, 2, 300, 8) for _ in range(3))
    padding = padding_mask(_padded_batch_mask(2, 300))

    def attend(dtype, grad: bool, amx: bool) -> tuple[str, torch.Tensor]:
        monkeypatch.setattr(attention, "CPU_HAS_AMX", amx)
        ran.clear()
        with torch.set_grad_enabled(grad):
            output, _ = local_attention_forward(module, *(x.to(dtype) for x in (query, key, value)), padding,
                                                scaling=0.35, sliding_window=70, global_positions=(0,))
        return ran[0], output.float()

    assert attend(torch.float32, True, False)[0] == attend(torch.float32, False, False)[0] == "_blocks_through_sdpa"
    kernel, trained = attend(torch.bfloat16, True, True)
    assert kernel == "_blocks_through_matmul"
    kernel, served = attend(torch.bfloat16, False, False)
    assert kernel == "_blocks_through_matmul"
    kernel, served_on_amx = attend(torch.bfloat16, False, True)
    assert kernel == "_blocks_through_sdpa"
    torch.testing.assert_close(served_on_amx, served, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(trained, served)


def test_band_mask_is_the_band_plus_global_rows_and_columns():
    mask = local_attention_mask(6, 1, [0], None, torch.device("cpu"))[0, 0].long()
    expected = torch.tensor([
        [1, 1, 1, 1, 1, 1],
        [1, 1, 1, 0, 0, 0],
        [1, 1, 1, 1, 0, 0],
        [1, 0, 1, 1, 1, 0],
        [1, 0, 0, 1, 1, 1],
        [1, 0, 0, 0, 1, 1],
    ])
    torch.testing.assert_close(mask, expected)


def _model_pair(cls, **overrides):
    torch.manual_seed(0)
    values = {**MIXED, **overrides}  # one config each: the attn_implementation is stored on the config
    eager = cls._from_config(tiny_config(**values), attn_implementation="eager").eval()
    fast = cls._from_config(tiny_config(**values), attn_implementation="sdpa").eval()
    fast.load_state_dict(eager.state_dict())
    return eager, fast


def _blocked_at_every_length(monkeypatch):
    """The blocked kernel however short the input (SDPA over the band runs up to `local_dense_limit`)."""
    monkeypatch.setattr("sinebert.attention_sinebert.LOCAL_DENSE_RATIO", 0.0)
    monkeypatch.setattr("sinebert.attention_sinebert.LOCAL_DENSE_RATIO_CPU_BF16", 0.0)


@pytest.mark.parametrize("kernel", ["local_blocked", "sdpa"])
@pytest.mark.parametrize("positions", ["absolute", "rotary"])
@pytest.mark.parametrize("norm_placement", ["post", "pre"])
def test_mixed_local_global_model_is_identical_through_eager_and_fast_paths(norm_placement, positions, kernel,
                                                                             monkeypatch):
    if kernel == "local_blocked":
        _blocked_at_every_length(monkeypatch)
    eager, fast = _model_pair(SineBertForMaskedLM, norm_placement=norm_placement, position_embedding_type=positions)
    assert eager.attention_kernels() == [
        "full_attention via eager",
        "sliding_attention(window=3, global=[0]) via eager",
        "full_attention via eager",
        "sliding_attention(window=3, global=[0]) via eager",
    ]
    assert fast.attention_kernels(input_shape=(3, 29))[:2] == [
        "full_attention via sdpa",
        f"sliding_attention(window=3, global=[0]) via {kernel}",
    ]
    torch.manual_seed(1)
    ids = torch.randint(5, 99, (3, 29))
    mask = _padded_batch_mask(3, 29)
    labels = torch.where((torch.rand(3, 29) < 0.3) & mask.bool(), ids, -100)
    results = []
    for model in (eager, fast):
        model.zero_grad()
        out = model(input_ids=ids, attention_mask=mask, labels=labels)
        out.loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        results.append((out.logits.detach(), out.loss.detach(), grads))
    (logits_a, loss_a, grads_a), (logits_b, loss_b, grads_b) = results
    real = mask.bool()  # the fast path drops padding between layers: outputs there are not compared
    torch.testing.assert_close(logits_a[real], logits_b[real], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(loss_a, loss_b, atol=1e-6, rtol=1e-6)
    assert grads_a.keys() == grads_b.keys() and grads_a
    for name in grads_a:
        torch.testing.assert_close(grads_a[name], grads_b[name], atol=1e-5, rtol=1e-4)


def test_eager_reference_returns_banded_weights():
    eager, _ = _model_pair(SineBertModel, global_attention_positions=None)
    out = eager(input_ids=torch.randint(5, 99, (1, 12)), output_attentions=True)
    full, local = out.attentions[0][0], out.attentions[1][0]  # (heads, seq, seq)
    distance = (torch.arange(12)[:, None] - torch.arange(12)[None, :]).abs()
    assert bool((full[:, distance > 3] > 0).all())
    assert bool((local[:, distance > 3] == 0).all()) and bool((local[:, distance <= 3] > 0).all())
    torch.testing.assert_close(local.sum(-1), torch.ones(4, 12))


def test_fast_path_refuses_to_return_weights():
    _, fast = _model_pair(SineBertModel)
    for seq, kernel in ((5, "sdpa"), (local_dense_limit(3, fast.device, torch.float32) + 1, "local_blocked")):
        with pytest.raises(ValueError, match=f"needs the eager attention kernel, but this layer runs '{kernel}'"):
            fast.layers[1].attention(torch.randn(1, seq, 32), None, output_attentions=True)


def test_short_inputs_run_sdpa_over_the_band_written_out_once_and_long_ones_the_blocked_kernel(monkeypatch):
    """Up to `local_dense_limit` tokens SDPA's one call over every pair beats the blocked kernel's three blocks of
    keys per block (the ratios in attention_sinebert.py); the layout writes that band out once for every layer, as
    the additive mask SDPA adds. Above it, the padding mask, from which the blocked kernel makes its own."""
    from sinebert.layout_sinebert import TokenLayout

    cpu = torch.device("cpu")
    monkeypatch.setattr("sinebert.attention_sinebert.CPU_HAS_AMX", False)
    assert local_dense_limit(3, cpu, torch.float32) == 2 * 3 * 64  # (the block is at least 64)
    assert local_dense_limit(128, cpu, torch.float32) == 768 and local_dense_limit(128, cpu, torch.bfloat16) == 480
    monkeypatch.setattr("sinebert.attention_sinebert.CPU_HAS_AMX", True)  # SDPA's bf16 on the tiles: as fp32's
    assert local_dense_limit(128, cpu, torch.bfloat16) == 768
    _, fast = _model_pair(SineBertModel)
    for seq, kernel in ((384, "sdpa"), (385, "local_blocked")):
        assert fast.attention_kernels(input_shape=(2, seq))[1].endswith(f"via {kernel}")
        mask = torch.ones(2, seq, dtype=torch.long)
        mask[1, seq // 2 :] = 0
        layout = TokenLayout(fast.config, mask, None, None, None, mask.shape, cpu, torch.float32, False)
        written = layout.mask(1, "sliding_attention")
        if kernel == "sdpa":
            band = local_attention_mask(seq, 3, [0], padding_mask(mask), cpu)
            assert written.dtype == torch.float32 and torch.equal(written == 0, band)
        else:
            assert written.dtype == torch.bool and written.shape == (2, 1, 1, seq)


def test_a_window_that_covers_every_sequence_is_full_attention_on_the_padding_free_rows(monkeypatch):
    """A window that reaches every key of a batch's longest sequence attends as full attention does: on the fast path
    such layers take the padding-free rows, full attention's kernel and mask instead of the band, and still match the
    eager reference, which keeps its band. The longest real sequence decides, not the length padded to."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    from sinebert.attention_sinebert import SINEBERT_ATTENTION_FUNCTIONS, matmul_attention_forward

    ran = []
    for name, function in (("matmul", matmul_attention_forward), ("sdpa", ALL_ATTENTION_FUNCTIONS["sdpa"])):
        monkeypatch.setitem(SINEBERT_ATTENTION_FUNCTIONS._local_mapping, name,
                            lambda *args, name=name, function=function, **kwargs: ran.append(name) or function(*args,
                                                                                                            **kwargs))
    eager, fast = _model_pair(SineBertForMaskedLM, sliding_window=8)
    covered = "sliding_attention(window=8, global=[0]) via {} (the window covers the input: full attention)"
    assert fast.attention_kernels(input_shape=(3, 9))[1] == covered.format("sdpa")
    assert fast.attention_kernels(input_shape=(3, 10))[1] == "sliding_attention(window=8, global=[0]) via sdpa"
    torch.manual_seed(1)
    ids = torch.randint(5, 99, (3, 16))
    for longest, local_kernel in ((9, "matmul"), (10, "sdpa")):  # bf16 on a CPU: full attention runs "matmul"
        mask = (torch.arange(16) < torch.tensor([longest, 4, 6])[:, None]).long()  # padded to 16 tokens
        ran.clear()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            fast(input_ids=ids, attention_mask=mask).logits.sum().backward()
        assert ran == ["matmul", local_kernel] * 2
    mask[0, 9:] = 0  # every window covers again: fp32 gradients and outputs against the band of the reference
    labels = torch.where(mask.bool(), ids, -100)
    results = []
    for model in (eager, fast):
        model.zero_grad()
        out = model(input_ids=ids, attention_mask=mask, labels=labels)
        out.loss.backward()
        results.append((out.logits.detach()[mask.bool()], {n: p.grad.clone() for n, p in model.named_parameters()}))
    torch.testing.assert_close(results[0][0], results[1][0], atol=1e-5, rtol=1e-5)
    for name, grad in results[0][1].items():
        torch.testing.assert_close(grad, results[1][1][name], atol=1e-5, rtol=1e-4)


def _changed_positions(model, ids, position):
    """Which output positions move when the token at `position` changes."""
    other = ids.clone()
    other[0, position] = 5 if ids[0, position] != 5 else 6
    with torch.no_grad():
        a, b = model(input_ids=ids).last_hidden_state, model(input_ids=other).last_hidden_state
    return ((a - b).abs().amax(-1)[0] > 0).nonzero().flatten().tolist()


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_information_travels_one_window_per_local_layer(implementation):
    config = tiny_config(num_hidden_layers=2, sliding_window=4)
    model = SineBertModel._from_config(config, attn_implementation=implementation).eval()
    ids = torch.randint(7, 99, (1, 150))
    assert _changed_positions(model, ids, 70) == list(range(62, 79))  # two layers of +-4 tokens
    config = tiny_config(num_hidden_layers=1, sliding_window=4, global_attention_positions=[0])
    model = SineBertModel._from_config(config, attn_implementation=implementation).eval()
    assert _changed_positions(model, ids, 140) == [0, *range(136, 145)]  # the global [CLS] sees it too
    assert _changed_positions(model, ids, 0) == list(range(150))  # and every token sees [CLS]


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_padding_does_not_change_real_tokens(implementation):
    model = SineBertModel._from_config(tiny_config(**MIXED), attn_implementation=implementation).eval()
    ids = torch.randint(5, 99, (1, 20))
    padded = torch.cat([ids, torch.zeros(1, 9, dtype=torch.long)], dim=1)
    mask = torch.cat([torch.ones(1, 20), torch.zeros(1, 9)], dim=1).long()
    with torch.no_grad():
        plain = model(input_ids=ids).last_hidden_state
        with_padding = model(input_ids=padded, attention_mask=mask).last_hidden_state[:, :20]
    torch.testing.assert_close(plain, with_padding, atol=1e-5, rtol=1e-5)


class LargestTensor(TorchDispatchMode):
    """Records the element count of the largest tensor any operation produces."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(tensor, torch.Tensor):
                self.largest = max(self.largest, tensor.numel())
        return out


def test_local_model_never_builds_a_seq_by_seq_tensor():
    seq = 4096
    model = SineBertModel._from_config(
        tiny_config(num_hidden_layers=2, sliding_window=16, global_attention_positions=[0]), attn_implementation="sdpa"
    ).eval()
    ids = torch.randint(5, 99, (1, seq))
    mask = torch.ones(1, seq, dtype=torch.long)
    mask[0, -100:] = 0
    with torch.no_grad(), LargestTensor() as tracker:
        out = model(input_ids=ids, attention_mask=mask).last_hidden_state
    assert torch.isfinite(out).all()
    # heads x seq x (3 blocks of 64 + 1 global) scores; a (seq, seq) matrix would be 4096 times 4096.
    assert tracker.largest <= 4 * seq * (3 * 64 + 1)


def test_long_inputs_run_far_past_the_position_table():
    values = dict(max_position_embeddings=64, sliding_window=8, global_attn_every_n_layers=2)
    eager = SineBertModel._from_config(tiny_config(**values), attn_implementation="eager").eval()
    fast = SineBertModel._from_config(tiny_config(**values), attn_implementation="sdpa").eval()
    fast.load_state_dict(eager.state_dict())
    ids = torch.randint(5, 99, (1, 1024))  # 16x the table
    with torch.no_grad():
        torch.testing.assert_close(
            fast(input_ids=ids).last_hidden_state, eager(input_ids=ids).last_hidden_state, atol=1e-5, rtol=1e-5
        )


def test_bf16_autocast_forward_and_backward():
    model = SineBertForMaskedLM._from_config(tiny_config(**MIXED), attn_implementation="sdpa").train()
    ids = torch.randint(5, 99, (2, 40))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(input_ids=ids, attention_mask=_padded_batch_mask(2, 40), labels=ids)
    out.loss.backward()
    assert torch.isfinite(out.loss)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_an_implementation_without_a_local_kernel_raises_instead_of_attending_everywhere():
    model = SineBertModel(tiny_config(**MIXED))
    model.config._attn_implementation = "flex_attention"
    with pytest.raises(ValueError, match="'flex_attention' has no sliding-window kernel"):
        model.attention_kernels()
    for seq in (8, 4):  # also where the window (3) covers the input
        with pytest.raises(ValueError, match="'flex_attention' has no sliding-window kernel"):
            model.attention_kernels(input_shape=(1, seq))
        with pytest.raises(ValueError, match="'flex_attention' has no sliding-window kernel"):
            model(input_ids=torch.randint(5, 99, (1, seq)))


def test_default_config_stays_full_attention():
    config = tiny_config()
    assert config.layer_types == ["full_attention", "full_attention"]
    assert SineBertModel(config).attention_kernels() == ["full_attention via sdpa"] * 2
    assert tiny_config(num_hidden_layers=3, sliding_window=5).layer_types == ["sliding_attention"] * 3
    assert tiny_config(num_hidden_layers=7, sliding_window=5, global_attn_every_n_layers=3).layer_types == [
        "full_attention", "sliding_attention", "sliding_attention", "full_attention", "sliding_attention",
        "sliding_attention", "full_attention",
    ]


@pytest.mark.parametrize(
    ("overrides", "shown"),
    [
        (dict(sliding_window=0), "sliding_window must be a positive integer.*got 0"),
        (dict(sliding_window=2.5), "got 2.5"),
        (dict(sliding_window=True), "got True"),
        (dict(global_attn_every_n_layers=3), "global_attn_every_n_layers=3 only applies"),
        (dict(global_attention_positions=[0]), r"global_attention_positions=\[0\] only applies"),
        (dict(sliding_window=4, global_attn_every_n_layers=0), "got 0"),
        (dict(sliding_window=4, global_attn_every_n_layers=1), "global_attn_every_n_layers=1 makes every layer"),
        (dict(sliding_window=4, global_attention_positions=[-1]), r"\[-1\]"),
        (dict(sliding_window=4, global_attention_positions=0), "got 0"),
        (dict(sliding_window=4, global_attention_positions=[0, 0]), r"repeated positions: \[0, 0\]"),
    ],
)
def test_invalid_local_attention_settings_raise(overrides, shown):
    with pytest.raises(ValueError, match=shown):
        tiny_config(**overrides)


def test_checkpoint_reloads_under_every_auto_class_and_keeps_its_kernels(tmp_path):
    from transformers import AutoConfig, AutoModelForMaskedLM

    torch.manual_seed(0)
    model = SineBertForMaskedLM(tiny_config(**MIXED)).eval()
    model.save_pretrained(tmp_path)
    config = AutoConfig.from_pretrained(tmp_path)
    assert isinstance(config, SineBertConfig) and config.layer_types == model.config.layer_types
    assert (config.sliding_window, config.global_attn_every_n_layers, config.global_attention_positions) == (3, 2, [0])
    ids = torch.randint(5, 99, (2, 33))
    for auto, _ in auto_heads():
        loaded = auto.from_pretrained(tmp_path).eval()
        assert loaded.attention_kernels() == model.attention_kernels()
        with torch.no_grad():
            assert torch.isfinite(loaded(input_ids=ids, return_dict=False)[0]).all()
    with torch.no_grad():
        torch.testing.assert_close(AutoModelForMaskedLM.from_pretrained(tmp_path)(input_ids=ids).logits,
                                   model(input_ids=ids).logits, atol=0, rtol=0)


def test_a_full_attention_checkpoint_can_be_read_with_a_sliding_window(tmp_path):
    """Length extrapolation of a model pretrained with full attention: load it with local layers instead."""
    torch.manual_seed(0)
    SineBertForSequenceClassification(tiny_config()).save_pretrained(tmp_path)
    local = SineBertForSequenceClassification.from_pretrained(
        tmp_path, sliding_window=8, global_attention_positions=[0]
    ).eval()
    kernel = "sliding_attention(window=8, global=[0]) via local_blocked (full attention up to 9 tokens, sdpa up to 384)"
    assert local.attention_kernels() == [kernel] * 2
    with torch.no_grad():
        assert torch.isfinite(local(input_ids=torch.randint(5, 99, (1, 700))).logits).all()


def test_local_checkpoint_runs_without_the_package_via_remote_code(tmp_path):
    torch.manual_seed(0)
    model = SineBertModel(tiny_config(**MIXED)).eval()
    model.save_pretrained(tmp_path / "model")
    ids = torch.randint(5, 99, (1, 40))
    with torch.no_grad():
        expected = model(input_ids=ids).last_hidden_state
    torch.save({"ids": ids, "expected": expected}, tmp_path / "io.pt")
    script = f"""
        import sys
        sys.modules["sinebert"] = None  # the package must not be importable here
        import torch
        from transformers import AutoModel
        model = AutoModel.from_pretrained({str(tmp_path / "model")!r}, trust_remote_code=True).eval()
        assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
        io = torch.load({str(tmp_path / "io.pt")!r})
        with torch.no_grad():
            torch.testing.assert_close(model(input_ids=io["ids"]).last_hidden_state, io["expected"], atol=0, rtol=0)
        print(model.attention_kernels()[1])
    """
    env = {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf_home"), "PATH": "/usr/bin:/bin"}
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == (
        "sliding_attention(window=3, global=[0]) via local_blocked (full attention up to 4 tokens, sdpa up to 384)")
