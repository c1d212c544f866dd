"""sinebert's fast attention kernels, registered by name beside transformers' own, and the choice among them.

Every kernel has the signature of transformers' attention functions: `(module, query, key, value, attention_mask,
scaling, dropout, **kwargs) -> (output, weights)`, with query/key/value `(batch, heads, seq, head_dim)`, a boolean
mask (True where a query may attend) and an output `(batch, q_seq, heads, head_dim)`. The reference they must equal,
`eager_attention_forward`, lives in `modeling_sinebert.py`.

    kernel         what it runs                                        where
    varlen         FlashAttention over the sequences packed in a row   full attention under "sdpa", bf16/fp16 on CUDA
    sdpa           PyTorch's scaled_dot_product_attention              full attention under "sdpa" elsewhere
    matmul         two batched matmuls and a softmax in the dtype      the same, for bf16 on a CPU (served: from
                                                                       2^15 scores on, and not on AMX)
    local_blocked  sliding windows in O(seq * window) memory           sliding-window layers under "sdpa"
    eager          the reference, with weights (the band as a mask)    every layer under "eager"; sliding-window
                                                                       layers in an exported graph

"varlen" takes the padding-free layout's rows as they are, all sequences one after another in one row (as
transformers' flash_attention_2 takes packed sequences): query/key/value `(1, heads, total, head_dim)` and the
sequences' boundaries `cu_seq_lens_q` / `cu_seq_lens_k`. The other kernels take a `(batch, seq)` grid and a mask.
"""

import torch
import torch.nn.functional as F
from torch import nn
from transformers.modeling_utils import AttentionInterface

# PyTorch's fused SDPA kernel for the CPU is slow in bf16: at 128 tokens (batch 32, 8 heads of 64) its forward and
# backward took 8.3 + 36.0 ms where two batched matmuls and a softmax took 3.5 + 7.2 ms, and at 2,048 tokens still
# 49 + 74 against 34 + 52 ms (`python benchmarks/speed.py --kernels`, AMD EPYC with AVX512-BF16, torch 2.13). In
# float32 SDPA is as fast at 128 tokens and faster beyond, so it stays.
# The matmul kernel writes out the (q_seq, k_seq) scores, which SDPA never does, so it runs only while they are at
# most this many entries per call (64 MiB in bf16): long inputs keep SDPA's memory-linear kernel.
MATMUL_ATTENTION_MAX_SCORES = 2**25
# Serving small inputs, the matmul kernel's several operations (the mask's bias, a product, the softmax, a product)
# cost more than SDPA's one call: for one sentence of 24 tokens (4 heads of 64, bf16, no gradient) 104 against 34 us,
# level at 16,384 to 32,768 scores (`python benchmarks/speed.py --kernels`, AMD EPYC with AVX512-BF16, torch 2.13), so
# where no gradient is taken smaller calls keep SDPA. Training keeps the matmul kernel at every size: with the
# backward, SDPA took 1.1 to 3.4 times as long from 16,384 scores on, and saved a fifth only on the smallest calls.
# On a CPU with AMX tiles (CPU_HAS_AMX) SDPA's bf16 forward runs its products on them, and serving keeps it at every
# size: the matmul kernel took 1.1 to 1.8 times as long on the shapes of SST-2 dev's length buckets, 1.0 to 1.3 times
# at 32 x 128 tokens, 1.3 to 3.3 at 8 x 384 and 3.5 to 3.9 at 2 x 2,048 (four runs of `python benchmarks/speed.py
# --kernels`, Intel Xeon with AMX, torch 2.13). With the backward it stays ahead there up to 512 tokens.
MATMUL_ATTENTION_MIN_SCORES = 2**15
# Whether this CPU has AMX tiles that this process may use (Intel Xeon from Sapphire Rapids on), as PyTorch's own
# kernels decide to use them: what the CPU is, never a timing.
CPU_HAS_AMX = torch.cpu._is_amx_tile_supported()
# PyTorch's bf16 softmax on a CPU is fast along a last dimension that is a multiple of 32 and runs a slow loop over
# the rest: over 40 keys it took 1.9 times as long as over 64, over 63 keys 4.5 times (`python benchmarks/speed.py
# --kernels`, AMD EPYC, torch 2.13). Where full attention runs the matmul kernel, the padding-free layout rounds each
# bucket's keys up to this multiple; the keys added are masked, so the result is the same.
MATMUL_KEY_MULTIPLE = 32
# Sliding-window layers split the sequence into blocks of at least this many queries: smaller blocks (tiny windows)
# would make each block's matmul too small to run efficiently, and larger blocks than the window stay exact because
# the band mask still removes the keys out of reach.
MIN_LOCAL_BLOCK = 64
# On inputs short against its blocks, the blocked kernel scores more pairs than the band needs (each block scores three
# blocks of keys) in several calls; there SDPA over the band written out, in one call, is the faster: sliding-window
# layers run it where seq <= ratio * 3 * block. The ratios are the crossovers measured with the backward on a CPU (2
# threads, 4 heads of 64, windows of 64 and 128): fp32 x0.78 of the blocked kernel's time at 512 tokens, x1.39 at
# 1,024 (w=128); bf16 on a CPU, whose blocked products run at bf16 speed, x0.86 at 384, x1.06 at 512. With AMX tiles,
# where SDPA's bf16 runs on them, the fp32 ratio: x0.61 to x0.80 at 512 to 768 tokens, x0.86 and x0.92 at 1,024,
# x1.08 at 1,536 (w=128, batch 4, one global token; ad-hoc probes, Intel Xeon with AMX, 2026-12-07). On a GPU the
# fp32 ratio, not measured there.
LOCAL_DENSE_RATIO = 2.0
LOCAL_DENSE_RATIO_CPU_BF16 = 1.25


def additive_mask(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean mask (True where a query may attend) as the bias that kernels add to the scores: 0 where True, the
    dtype's minimum elsewhere, so that those keys' softmax weights underflow to zero."""
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, torch.finfo(dtype).min)


def matmul_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    every_query_has_a_key: bool = False,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """softmax(Q K^T * scaling) V by two batched matmuls in the inputs' dtype, without returning the weights.

    The eager kernel's result with fewer passes over the scores: the scaling and the mask (as a bias of the dtype's
    minimum, added where the product is written) go into the first product, and the softmax keeps the scores' dtype
    (it accumulates in float32 for bf16 inputs, as eager's float32 softmax does, and rounds once). Writing the mask
    into bf16 scores with `masked_fill_` took longer than the product itself (170 against 180 us for a bucket of 16
    sequences of 64 tokens, 4 heads); the bias adds 30. `every_query_has_a_key`: the caller's word that no query has
    every key masked (the length buckets), which spares the pass that zeroes such queries' outputs, as eager does;
    then the mask may be that bias already (`AttentionBucket.mask`, made once for every layer).
    """
    batch, heads, q_seq, head_dim = query.shape
    k_seq = key.shape[2]
    # (batch, heads, seq, head_dim) -> (batch * heads, seq, head_dim): a view of inputs laid out so, else a copy
    query, key, value = (x.reshape(batch * heads, -1, head_dim) for x in (query, key, value))
    if attention_mask is None:
        bias = query.new_zeros(())  # broadcast
    else:
        rows = attention_mask.shape[2]  # 1 for a mask of keys alone: the bias stays one row per sequence and head
        bias = attention_mask
        if attention_mask.dtype == torch.bool:
            bias = additive_mask(attention_mask, query.dtype)
        elif not every_query_has_a_key:
            raise ValueError("An additive attention mask needs every_query_has_a_key=True; pass a boolean mask.")
        bias = bias.expand(batch, heads, rows, k_seq).reshape(batch * heads, rows, k_seq)
    scores = torch.baddbmm(bias, query, key.transpose(1, 2), alpha=scaling)  # (batch * heads, q_seq, k_seq)
    weights = F.dropout(scores.softmax(dim=-1), p=dropout, training=module.training)
    output = torch.bmm(weights, value).view(batch, heads, q_seq, head_dim)
    if attention_mask is not None and not every_query_has_a_key:  # fully masked rows: zeros, as eager
        output = output.masked_fill(~attention_mask.any(dim=-1, keepdim=True), 0.0)
    return output.transpose(1, 2), None  # (batch, q_seq, heads, head_dim)


def _turn_into(out: torch.Tensor, x: torch.Tensor, cos: torch.Tensor, sin_first: torch.Tensor,
               sin_second: torch.Tensor) -> torch.Tensor:
    """out = x turned: x cos, then x2 sin_first added to the first half and x1 sin_second to the second (x1, x2 the
    halves of the last dimension; the tables broadcast to them), each pass writing into `out`. (One product over
    both halves: 18% faster in fp32 and 6% in bf16 than a product per half, in an ad-hoc probe.)"""
    half = x.shape[-1] // 2
    torch.mul(x, cos, out=out)
    out[..., :half].addcmul_(x[..., half:], sin_first)
    out[..., half:].addcmul_(x[..., :half], sin_second)
    return out


class TurnToHeads(torch.autograd.Function):
    """Rotary positions turning strided per-head views of the fused projection, `(parts, ..., head_dim)`, into a new
    tensor: contiguous, the layout the kernels take without a copy, or with `keep_layout` in x's own (the token-major
    rows of a padding-free batch, which the length buckets gather next). The first `turned` parts (the queries and keys)
    are turned, the rest (the values) copied. The reference (`Rotation.turn`: a product, a roll and a fused
    multiply-add, then the queries, keys and values joined again, and copied per head by the kernel) writes five tensors
    where this writes one. The same arithmetic in the same order, so the forward is bit for bit the reference's.
    Backward turns the gradient back by the opposite angle (the sine table's halves swap), written in the input's own
    layout, so that the gradient of the projection it is a view of needs no copy either."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, turned: int, keep_layout: bool):
        ctx.save_for_backward(cos, sin)
        layout = torch.empty_like(x, device="meta")  # x's strides where it is dense, else packed in x's order
        ctx.turned, ctx.layout = turned, (layout.shape, layout.stride())
        return TurnToHeads.turn(x, cos, sin, turned, keep_layout)

    @staticmethod
    def turn(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, turned: int, keep_layout: bool) -> torch.Tensor:
        """The forward alone, which serving calls directly: without a gradient to come, the autograd function's
        bookkeeping added a third to the turn of one sentence (35 against 26 us for 24 tokens, hidden 256)."""
        # cos (..., head_dim): cos twice; sin (..., head_dim): -sin then sin; both broadcast to x[i]
        half = x.shape[-1] // 2
        dtype = torch.result_type(x, cos)
        out = torch.empty_like(x, dtype=dtype) if keep_layout else torch.empty(x.shape, dtype=dtype, device=x.device)
        return _turn_parts(out, x, turned, cos, sin[..., :half], sin[..., half:])

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        cos, sin = ctx.saved_tensors
        half = grad.shape[-1] // 2
        # (empty_like of a meta tensor onto a device runs PyTorch's Python reference, about 75 us a call: 2-5% of a
        # tiny model's step on a CPU, all of it host time, which a GPU's host pays too)
        result = torch.empty_strided(*ctx.layout, dtype=grad.dtype, device=grad.device)
        return _turn_parts(result, grad, ctx.turned, cos, sin[..., half:], sin[..., :half]), None, None, None, None


def _turn_parts(out: torch.Tensor, x: torch.Tensor, turned: int, cos, sin_first, sin_second) -> torch.Tensor:
    """`out[:turned]` = x[:turned] turned (see `_turn_into`), `out[turned:]` = x[turned:]."""
    _turn_into(out[:turned], x[:turned], cos, sin_first, sin_second)
    if turned < len(x):
        out[turned:].copy_(x[turned:])
    return out


def _global_index(global_positions, seq: int, device: torch.device) -> torch.Tensor:
    """`(n_global,)` long tensor of the global positions that exist in a sequence of length `seq`."""
    return torch.tensor([p for p in global_positions or () if p < seq], dtype=torch.long, device=device)


def local_attention_mask(
    seq: int, sliding_window: int, global_positions, padding_mask: torch.Tensor | None, device: torch.device
) -> torch.Tensor:
    """The mask of a sliding-window layer, written out: boolean `(batch or 1, 1, seq, seq)`, True where query i may
    attend key j: |i - j| <= sliding_window, or i or j is a global position, and key j is not padding.

    With `eager_attention_forward` this is the exact O(seq^2) reference that `local_attention_forward` must equal.
    """
    positions = torch.arange(seq, device=device)
    allowed = (positions[:, None] - positions[None, :]).abs() <= sliding_window  # (seq, seq)
    is_global = torch.zeros(seq, dtype=torch.bool, device=device)
    is_global[_global_index(global_positions, seq, device)] = True
    allowed = (allowed | is_global[:, None] | is_global[None, :])[None, None]  # (1, 1, seq, seq)
    return allowed if padding_mask is None else allowed & padding_mask


def _neighbour_blocks(tensor: torch.Tensor, dim: int, block: int, tail: int, extra: torch.Tensor) -> torch.Tensor:
    """For each block of `block` positions along `dim` (the sequence, of length blocks * block - tail): the block
    before it, the block itself and the block after it (zeros past the ends), then `extra` (the global tokens).

    `tensor` `(..., seq, ...)`, `extra` `(..., n_extra, ...)` -> `(..., blocks, 3 * block + n_extra, ...)`, gathered
    by one copy in the input's own memory order.
    """
    padded = F.pad(tensor, (0, 0) * (tensor.dim() - 1 - dim) + (block, tail + block))
    shape = padded.shape
    blocks = shape[dim] // block - 2
    split = padded.view(*shape[:dim], blocks + 2, block, *shape[dim + 1 :])  # (..., blocks + 2, block, ...)
    # The previous, own and next block of each block: 3 x (..., blocks, block, ...)
    pieces = [split.narrow(dim, offset, blocks) for offset in range(3)]
    pieces.append(extra.unsqueeze(dim).expand(*shape[:dim], blocks, *extra.shape[dim:]))
    return torch.cat(pieces, dim=dim + 1)


def local_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    sliding_window: int | None = None,
    global_positions=(),
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """Sliding-window attention in O(seq * sliding_window) memory: the fast kernel of the local layers.

    It equals `eager_attention_forward` under `local_attention_mask`, without forming a (seq, seq) matrix. The queries
    are cut into blocks of `block >= sliding_window` tokens; each block scores the keys of its own and its two
    neighbouring blocks (all keys within reach of the band) plus the global keys, and the band and padding masks
    remove the rest. The blocks attend through the kernel full attention would run on as many scores under "sdpa"
    (`full_attention_kernel`: SDPA, with the masks as its bias, or the matmul kernel's products and softmax). Global
    queries attend to every key through the matmul kernel, `(n_global, seq)` scores per head.

    attention_mask: the boolean padding mask `(batch, 1, 1, seq)` (True = may attend) or None. Returns no weights:
    for weights, run the model with `attn_implementation="eager"`.
    """
    if sliding_window is None:
        raise ValueError("local_attention_forward needs sliding_window, the number of tokens seen on each side.")
    batch, heads, seq, head_dim = query.shape
    block = max(1, min(local_block(sliding_window), seq))  # no block longer than the sequence
    blocks = -(-seq // block)
    tail = blocks * block - seq  # padding that fills the last block
    glob = _global_index(global_positions, seq, query.device)  # (n_global,)
    keys = _neighbour_blocks(key, 2, block, tail, key[:, :, glob])  # (batch, heads, blocks, k, head_dim)
    values = _neighbour_blocks(value, 2, block, tail, value[:, :, glob])  # k = 3 * block + n_global
    # (batch or 1, 1, blocks, block, k): True where a query may attend a key
    allowed = _local_block_mask(attention_mask, glob, seq, block, tail, sliding_window)
    queries = F.pad(query, (0, 0, 0, tail)).view(batch, heads, blocks, block, head_dim)
    dropout = dropout if module.training else 0.0
    scores = batch * heads * blocks * block * keys.shape[-2]
    if full_attention_kernel("sdpa", query.device, query.dtype, scores) == "sdpa":
        output = _blocks_through_sdpa(queries, keys, values, allowed, scaling, dropout)
    else:
        output = _blocks_through_matmul(queries, keys, values, allowed, scaling, dropout)
    output = output.reshape(batch, heads, blocks * block, head_dim)
    if glob.numel():
        global_output, _ = matmul_attention_forward(
            module, query[:, :, glob], key, value, attention_mask, scaling=scaling, dropout=dropout
        )  # (batch, n_global, heads, head_dim)
        output.index_copy_(2, glob, global_output.transpose(1, 2))
    return output[:, :, :seq].transpose(1, 2).contiguous(), None  # (batch, seq, heads, head_dim)


def _blocks_through_matmul(queries, keys, values, allowed, scaling: float, dropout: float) -> torch.Tensor:
    """The blocks' attention by two products and a softmax: queries `(batch, heads, blocks, block, head_dim)`, keys
    and values `(batch, heads, blocks, k, head_dim)`, allowed `(batch or 1, 1, blocks, block, k)` True where a query
    may attend -> `(batch, heads, blocks, block, head_dim)`, zeros where a query has no key in reach (as the eager
    kernel gives them: their softmax was uniform over masked keys)."""
    blocked = ~allowed
    # Scaling the queries costs seq * head_dim multiplications; scaling the scores would cost seq * k.
    scores = torch.matmul(queries * scaling, keys.transpose(-1, -2))  # (batch, heads, blocks, block, k)
    # In place: the largest tensor here is written once more, not copied. Keys out of reach get finfo.min, so their
    # softmax weights underflow to exactly zero wherever a row has any key in reach.
    scores.masked_fill_(blocked, torch.finfo(scores.dtype).min)
    # float32 at least (as in the eager kernel), float64 stays float64 so that its finfo.min stays finite.
    weights = F.softmax(scores, dim=-1, dtype=torch.promote_types(scores.dtype, torch.float32)).to(queries.dtype)
    del scores  # free it before the output is made
    output = torch.matmul(F.dropout(weights, p=dropout, training=dropout > 0), values)
    return output.masked_fill_(blocked.all(dim=-1, keepdim=True), 0.0)  # (in place: the product is not saved)


def _blocks_through_sdpa(queries, keys, values, allowed, scaling: float, dropout: float) -> torch.Tensor:
    """The same through SDPA, every block a sequence of its own: `(batch * blocks, heads, block or k, head_dim)`,
    the masks as the bias `(batch * blocks, 1, block, k)`."""
    batch, heads, blocks, k, head_dim = keys.shape
    queries, keys, values = (x.transpose(1, 2).flatten(0, 1) for x in (queries, keys, values))
    allowed = allowed.transpose(1, 2)  # (batch or 1, blocks, 1, block, k)
    bias = additive_mask(allowed, queries.dtype).expand(batch, blocks, 1, -1, k).flatten(0, 1)
    output = F.scaled_dot_product_attention(queries, keys, values, attn_mask=bias, dropout_p=dropout, scale=scaling)
    # (not in place: SDPA's backward reads its output)
    output = output.view(batch, blocks, heads, -1, head_dim).masked_fill(~allowed.any(dim=-1, keepdim=True), 0.0)
    return output.transpose(1, 2)  # (batch, heads, blocks, block, head_dim)


def local_block(sliding_window: int) -> int:
    """The blocked kernel's block of queries on long inputs: the window, at least MIN_LOCAL_BLOCK."""
    return max(sliding_window, MIN_LOCAL_BLOCK)


def local_dense_limit(sliding_window: int, device: torch.device, dtype: torch.dtype) -> int:
    """The longest input on which sliding-window layers run SDPA over the written-out band (see LOCAL_DENSE_RATIO)."""
    cpu_bf16 = device.type == "cpu" and dtype == torch.bfloat16
    ratio = LOCAL_DENSE_RATIO_CPU_BF16 if cpu_bf16 and not CPU_HAS_AMX else LOCAL_DENSE_RATIO
    return int(ratio * 3 * local_block(sliding_window))


def _local_block_mask(
    padding_mask: torch.Tensor | None, glob: torch.Tensor, seq: int, block: int, tail: int, sliding_window: int
) -> torch.Tensor:
    """Boolean `(batch or 1, 1, blocks, block, 3 * block + n_global)`: which of a block's keys each query may attend.

    A global key is masked where it falls in a query's neighbouring blocks and scored in its own column instead, so
    that it counts once.
    """
    device = glob.device
    key_ok = torch.ones(1, seq, dtype=torch.bool, device=device) if padding_mask is None else padding_mask[:, 0, 0]
    # (batch or 1, blocks, 3 * block + n_global)
    key_ok = _neighbour_blocks(key_ok.index_fill(1, glob, False), 1, block, tail, key_ok[:, glob])
    # Key column c of a block starting at query b0 holds position b0 - block + c; query row r is position b0 + r.
    offsets = torch.arange(3 * block, device=device)[None, :] - block - torch.arange(block, device=device)[:, None]
    in_band = torch.cat(
        [offsets.abs() <= sliding_window, torch.ones(block, glob.numel(), dtype=torch.bool, device=device)], dim=-1
    )  # (block, 3 * block + n_global)
    return in_band & key_ok[:, None, :, None, :]


def _varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k) -> torch.Tensor:
    """PyTorch's variable-length FlashAttention (CUDA, bf16 or fp16): `(total, heads, head_dim)` in and out."""
    from torch.nn.attention.varlen import varlen_attn

    return varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k)


def varlen_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    cu_seq_lens_q: torch.Tensor | None = None,
    cu_seq_lens_k: torch.Tensor | None = None,
    max_length_q: int | None = None,
    max_length_k: int | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """Full attention within each of the sequences packed one after another: query/key/value `(1, heads, total,
    head_dim)`, sequence i at rows cu_seq_lens[i]:cu_seq_lens[i + 1], no mask. Returns `(1, total, heads, head_dim)`.

    The kernel scales by head_dim**-0.5, sinebert's scaling; it has no dropout, so layers that drop attention
    weights (training with attention_probs_dropout_prob > 0) run the length buckets instead (`packed_attention`)."""
    if dropout:
        raise ValueError(f"The varlen kernel has no attention dropout, got {dropout}; see packed_attention.")
    # (total, heads, head_dim); squeeze, not [0]: the gradient of a view is a view, select's is zeros around a copy
    query, key, value = (tensor.squeeze(0).transpose(0, 1) for tensor in (query, key, value))
    output = _varlen_attn(query, key, value, cu_seq_lens_q, cu_seq_lens_k, max_length_q, max_length_k)
    return output[None], None


# sinebert's own registry: transformers' kernels (sdpa, flash_attention_2, ...) and these three, without adding them
# to transformers' global one.
SINEBERT_ATTENTION_FUNCTIONS = AttentionInterface()
SINEBERT_ATTENTION_FUNCTIONS["matmul"] = matmul_attention_forward
SINEBERT_ATTENTION_FUNCTIONS["local_blocked"] = local_attention_forward
SINEBERT_ATTENTION_FUNCTIONS["varlen"] = varlen_attention_forward

# The kernel of sliding-window layers under each attn_implementation. "eager" stays the exact reference: eager
# attention with the band written out as a (seq, seq) mask, which returns the weights. Any other implementation has no
# local kernel and raises instead of quietly attending to everything.
LOCAL_ATTENTION_KERNELS = {"eager": "eager", "sdpa": "local_blocked"}


def is_tracing() -> bool:
    """Whether the model runs under an exporter (`torch.export`, `torch.onnx.export` old or new): then the graph may
    depend on the input's shapes only, so every choice made from its values (padding, ids, lengths) is left out."""
    return torch.compiler.is_exporting() or torch.jit.is_tracing()


def varlen_available(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether PyTorch's varlen FlashAttention runs here: a CUDA GPU of compute capability 8 or more, bf16 or fp16."""
    if device.type != "cuda" or dtype not in (torch.bfloat16, torch.float16):
        return False
    try:
        from torch.nn.attention import varlen  # noqa: F401  (torch 2.9 and later)
    except ImportError:
        return False
    return torch.cuda.get_device_capability(device)[0] >= 8


def packed_attention(
    attn_implementation: str | None, device: torch.device, dtype: torch.dtype, dropout: float
) -> bool:
    """Whether full attention runs "varlen" on the sequences packed in one row: under "sdpa" where
    `varlen_available`, and without attention dropout. Elsewhere the length buckets run the other kernels (on a
    GPU in float32, or while training with attention dropout, that is "sdpa" on each bucket)."""
    return attn_implementation == "sdpa" and not dropout and varlen_available(device, dtype)


def full_attention_kernel(
    attn_implementation: str | None, device: torch.device, dtype: torch.dtype, scores: int = 0, packed: bool = False
) -> str:
    """The kernel that full attention runs under `attn_implementation` for inputs of `dtype` on `device` whose scores
    have `scores` entries (batch * heads * q_seq * k_seq): "varlen" on `packed` rows; "sdpa" becomes "matmul" for
    bf16 on a CPU while the scores fit in MATMUL_ATTENTION_MAX_SCORES and, where no gradient is taken (grad mode off,
    as serving runs), number at least MATMUL_ATTENTION_MIN_SCORES on a CPU without AMX (never with it)."""
    if packed:
        return "varlen"
    implementation = attn_implementation or "eager"
    cpu_bf16 = device.type == "cpu" and dtype == torch.bfloat16
    if implementation == "sdpa" and cpu_bf16 and scores <= MATMUL_ATTENTION_MAX_SCORES:
        if torch.is_grad_enabled() or scores >= MATMUL_ATTENTION_MIN_SCORES and not CPU_HAS_AMX:
            return "matmul"
    return implementation


def window_covers(attn_implementation: str | None, sliding_window: int, seq: int | None) -> bool:
    """Whether a sliding window of `sliding_window` reaches every key of inputs of `seq` tokens (None: long inputs),
    so that its layers run as full attention: on the fast path, where they then take the padding-free rows and full
    attention's kernel. The eager reference keeps its band written out, an exported graph, which must hold for any
    length, its window, and an implementation without a local kernel raises at every length."""
    fast = LOCAL_ATTENTION_KERNELS.get(attn_implementation or "eager", "eager") != "eager" and not is_tracing()
    return fast and seq is not None and seq - 1 <= sliding_window


def local_attention_kernel(
    attn_implementation: str | None, seq: int | None, sliding_window: int, device: torch.device, dtype: torch.dtype
) -> str:
    """The kernel that sliding-window layers of `sliding_window` run under `attn_implementation` on inputs of `seq`
    tokens computing in `dtype` on `device`: "local_blocked", or "sdpa" over the band written out where `seq` is at
    most `local_dense_limit` (None: long inputs); ValueError where there is none."""
    implementation = attn_implementation or "eager"
    if implementation not in LOCAL_ATTENTION_KERNELS:
        raise ValueError(
            f"attn_implementation={implementation!r} has no sliding-window kernel; load the model with "
            f"attn_implementation='sdpa' (blocked local kernel) or 'eager' (the reference), or set sliding_window=None."
        )
    if is_tracing():  # the blocked kernel's blocks depend on the length; an exported graph writes the band out
        return "eager"
    kernel = LOCAL_ATTENTION_KERNELS[implementation]
    if kernel == "local_blocked" and seq is not None and seq <= local_dense_limit(sliding_window, device, dtype):
        return "sdpa"
    return kernel
