"""SineBERT: a BERT-style encoder with fixed sinusoidal positions and its own multi-head attention.

This file and `configuration_sinebert.py` are what a saved checkpoint carries for `trust_remote_code=True`, so they
import only torch, transformers and each other.
"""

import math
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import (
    BaseModelOutput,
    MaskedLMOutput,
    QuestionAnsweringModelOutput,
    SequenceClassifierOutput,
    TokenClassifierOutput,
)
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.utils.generic import can_return_tuple

from .configuration_sinebert import SineBertConfig


def sinusoidal_encoding(positions: torch.Tensor, dim: int) -> torch.Tensor:
    """PE[pos, 2k] = sin(pos / 10000^(2k/d)), PE[pos, 2k+1] = cos(pos / 10000^(2k/d)) (Vaswani et al., 2017).

    positions: any shape `(...)` of integer or float positions. Returns float32 `(..., dim)`. Angles are computed in
    float64: at position 32k a float32 angle is already off by ~1e-3.
    """
    exponents = torch.arange(0, dim, 2, dtype=torch.float64, device=positions.device) / dim  # (ceil(d/2),)
    angles = positions.to(torch.float64)[..., None] / torch.pow(10000.0, exponents)  # (..., ceil(d/2))
    encoding = torch.empty(*positions.shape, dim, dtype=torch.float64, device=positions.device)
    encoding[..., 0::2] = torch.sin(angles)
    encoding[..., 1::2] = torch.cos(angles[..., : dim // 2])  # odd d: one cosine fewer than sines
    return encoding.to(torch.float32)


class SineBertEmbeddings(nn.Module):
    """Word (+ token-type) embeddings plus the fixed sinusoidal encoding of `position_ids`, then LayerNorm."""

    def __init__(self, config: SineBertConfig):
        super().__init__()
        self.config = config
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.token_type_embeddings = (
            nn.Embedding(config.type_vocab_size, config.hidden_size) if config.type_vocab_size > 0 else None
        )
        self.embedding_scale = math.sqrt(config.hidden_size) if config.scale_embeddings else 1.0
        self.segment_match = nn.Parameter(torch.zeros(config.hidden_size)) if config.cross_segment_match else None
        # One vector per letter case of `case_ids` (lower, capitalised, all capitals; see tokenization_sinebert).
        self.case_embeddings = nn.Parameter(torch.zeros(3, config.hidden_size)) if config.letter_case else None
        # A cache, not a weight: non-persistent, and refilled by `_init_weights` because transformers 5 builds
        # models on the meta device, where a table filled in `__init__` would come back empty.
        self.register_buffer(
            "position_table",
            sinusoidal_encoding(torch.arange(config.max_position_embeddings), config.hidden_size),
            persistent=False,
        )
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def position_encoding(self, position_ids: torch.LongTensor | None, seq_length: int) -> torch.Tensor:
        """`(batch or 1, seq, hidden)` encodings; positions past the cached table are computed on the fly."""
        table = self.position_table
        if position_ids is None:
            if seq_length <= table.shape[0]:
                return table[None, :seq_length]
            position_ids = torch.arange(seq_length, device=table.device)[None]
        if position_ids.numel() == 0 or int(position_ids.max()) < table.shape[0]:
            return F.embedding(position_ids, table)
        return sinusoidal_encoding(position_ids, self.config.hidden_size)

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        case_ids: torch.LongTensor | None = None,
    ) -> torch.Tensor:
        if inputs_embeds is None:
            _check_ids(input_ids, self.config.vocab_size, "input_ids", "vocab_size")
            inputs_embeds = self.word_embeddings(input_ids)  # (batch, seq, hidden)
        if self.segment_match is not None and token_type_ids is not None:
            if input_ids is None:
                raise ValueError(
                    "cross_segment_match finds the tokens a pair shares by their ids; pass input_ids instead of "
                    "inputs_embeds, or load the model with cross_segment_match=False."
                )
            # Added in word-embedding units, so it grows at the pace of the word vectors (x embedding_scale below).
            matches = cross_segment_matches(input_ids, token_type_ids, self.config.vocab_size)[..., None]  # (b, s, 1)
            inputs_embeds = inputs_embeds + matches.to(inputs_embeds.dtype) * self.segment_match
        if self.case_embeddings is not None:
            if case_ids is None:
                raise ValueError(
                    "This model reads the letter case of each token (letter_case=True) from case_ids; tokenize with "
                    "the model's SineBertTokenizer, which returns them (`import sinebert` before "
                    "AutoTokenizer.from_pretrained, or trust_remote_code=True)."
                )
            _check_ids(case_ids, self.case_embeddings.shape[0], "case_ids", "letter case classes")
            inputs_embeds = inputs_embeds + F.embedding(case_ids, self.case_embeddings)  # as segment_match
        embeddings = inputs_embeds * self.embedding_scale
        embeddings = embeddings + self.position_encoding(position_ids, embeddings.shape[1]).to(embeddings.dtype)
        if self.token_type_embeddings is not None:
            if token_type_ids is None:
                embeddings = embeddings + self.token_type_embeddings.weight[0]
            else:
                _check_ids(token_type_ids, self.config.type_vocab_size, "token_type_ids", "type_vocab_size")
                embeddings = embeddings + self.token_type_embeddings(token_type_ids)
        return self.dropout(self.LayerNorm(embeddings))


def cross_segment_matches(
    input_ids: torch.LongTensor, token_type_ids: torch.LongTensor, vocab_size: int
) -> torch.Tensor:
    """`(batch, seq)` bool, True where a token's id also occurs in the same row in the other segment (token type 0
    against the rest). A lookup of sorted keys, O(batch * seq) memory, so long inputs cost no (seq, seq) table."""
    rows = torch.arange(input_ids.shape[0], device=input_ids.device)[:, None]  # (batch, 1)
    keys = (rows * vocab_size + input_ids) * 2 + (token_type_ids != 0)  # (batch, seq)
    return torch.isin(keys ^ 1, keys)  # the same row and id, the other segment


def _check_ids(ids: torch.Tensor, size: int, name: str, config_name: str):
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= size):
        bad = ids[(ids < 0) | (ids >= size)][0].item()
        raise ValueError(
            f"{name} contains {bad}, outside [0, {size}) of the model's {config_name}; use the tokenizer this model "
            f"was trained with, or a config whose {config_name} covers it."
        )


def eager_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference kernel: softmax(Q K^T * scaling) V, returning the attention weights too.

    query/key/value: `(batch, heads, seq, head_dim)`; attention_mask: boolean, True where a query may attend,
    broadcastable to `(batch, heads, q_seq, k_seq)`. A query with no key to attend to gets zero weights and output.
    """
    scores = torch.matmul(query, key.transpose(-1, -2)) * scaling  # (batch, heads, q_seq, k_seq)
    if attention_mask is not None:
        scores = scores.masked_fill(~attention_mask, torch.finfo(scores.dtype).min)
    weights = F.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    if attention_mask is not None:
        weights = weights.masked_fill(~attention_mask, 0.0)  # fully masked rows: uniform -> zeros
    weights = F.dropout(weights, p=dropout, training=module.training)
    output = torch.matmul(weights, value).transpose(1, 2).contiguous()  # (batch, q_seq, heads, head_dim)
    return output, weights


def matmul_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """softmax(Q K^T * scaling) V by two batched matmuls in the inputs' dtype, without returning the weights.

    The eager kernel's result with fewer copies: the queries are scaled instead of the scores, the mask is written
    into the scores in place, and the softmax keeps the scores' dtype (it accumulates in float32 for bf16 inputs, as
    eager's float32 softmax does, and rounds once). Shapes as in `eager_attention_forward`; returns `(batch, q_seq,
    heads, head_dim)` and no weights.
    """
    scores = torch.matmul(query * scaling, key.transpose(-1, -2))  # (batch, heads, q_seq, k_seq)
    if attention_mask is not None:
        scores.masked_fill_(~attention_mask, torch.finfo(scores.dtype).min)
    weights = F.dropout(scores.softmax(dim=-1), p=dropout, training=module.training)
    output = torch.matmul(weights, value)  # (batch, heads, q_seq, head_dim)
    if attention_mask is not None:
        output.masked_fill_(~attention_mask.any(dim=-1, keepdim=True), 0.0)  # fully masked rows: zeros, as eager
    return output.transpose(1, 2), None


# PyTorch's fused SDPA kernel for the CPU is slow in bf16: at 128 tokens (batch 32, 8 heads of 64) its forward and
# backward took 8.3 + 36.0 ms where two batched matmuls and a softmax took 3.5 + 7.2 ms, and at 2,048 tokens still
# 49 + 74 against 34 + 52 ms (`python benchmarks/speed.py --kernels`, AMD EPYC with AVX512-BF16, torch 2.13). In
# float32 SDPA is as fast at 128 tokens and faster beyond, so it stays.
# The matmul kernel writes out the (q_seq, k_seq) scores, which SDPA never does, so it runs only while they are at
# most this many entries per call (64 MiB in bf16): long inputs keep SDPA's memory-linear kernel.
MATMUL_ATTENTION_MAX_SCORES = 2**25


def sdpa_backend(query: torch.Tensor, key: torch.Tensor) -> str:
    """Which kernel the "sdpa" implementation runs for these inputs: "matmul" for bf16 on a CPU while the scores fit
    in MATMUL_ATTENTION_MAX_SCORES, else "sdpa" (PyTorch's scaled_dot_product_attention)."""
    batch, heads, q_seq, _ = query.shape
    scores = batch * heads * q_seq * key.shape[2]
    if query.device.type == "cpu" and query.dtype == torch.bfloat16 and scores <= MATMUL_ATTENTION_MAX_SCORES:
        return "matmul"
    return "sdpa"


def sdpa_attention_forward(
    module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
    attention_mask: torch.Tensor | None, scaling: float, dropout: float = 0.0, **kwargs,
) -> tuple[torch.Tensor, None]:
    """Full attention under `attn_implementation="sdpa"`: PyTorch's scaled_dot_product_attention through transformers'
    wrapper, or the same product by `matmul_attention_forward` where that is faster (`sdpa_backend`)."""
    if sdpa_backend(query, key) == "matmul":
        return matmul_attention_forward(module, query, key, value, attention_mask, scaling, dropout)
    return ALL_ATTENTION_FUNCTIONS["sdpa"](module, query, key, value, attention_mask, scaling=scaling, dropout=dropout)


# Sliding-window layers split the sequence into blocks of at least this many queries: smaller blocks (tiny windows)
# would make each block's matmul too small to run efficiently, and larger blocks than the window stay exact because
# the band mask still removes the keys out of reach.
MIN_LOCAL_BLOCK = 64


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
    remove the rest. Global queries attend to every key through the eager kernel, `(n_global, seq)` scores per head.

    query/key/value: `(batch, heads, seq, head_dim)`; attention_mask: the boolean padding mask `(batch, 1, 1, seq)`
    (True = may attend) or None. Returns `(batch, seq, heads, head_dim)` and no weights: for weights, run the model
    with `attn_implementation="eager"`.
    """
    if sliding_window is None:
        raise ValueError("local_attention_forward needs sliding_window, the number of tokens seen on each side.")
    batch, heads, seq, head_dim = query.shape
    block = max(1, min(max(sliding_window, MIN_LOCAL_BLOCK), seq))  # no block longer than the sequence
    blocks = -(-seq // block)
    tail = blocks * block - seq  # padding that fills the last block
    glob = _global_index(global_positions, seq, query.device)  # (n_global,)
    keys = _neighbour_blocks(key, 2, block, tail, key[:, :, glob])  # (batch, heads, blocks, k, head_dim)
    values = _neighbour_blocks(value, 2, block, tail, value[:, :, glob])  # k = 3 * block + n_global
    # (batch or 1, 1, blocks, block, k): True where a query may not attend a key
    blocked = ~_local_block_mask(attention_mask, glob, seq, block, tail, sliding_window)
    # Scaling the queries costs seq * head_dim multiplications; scaling the scores would cost seq * k.
    queries = F.pad(query * scaling, (0, 0, 0, tail)).view(batch, heads, blocks, block, head_dim)
    scores = torch.matmul(queries, keys.transpose(-1, -2))  # (batch, heads, blocks, block, k)
    # In place: the largest tensor here is written once more, not copied. Keys out of reach get finfo.min, so their
    # softmax weights underflow to exactly zero wherever a row has any key in reach.
    scores.masked_fill_(blocked, torch.finfo(scores.dtype).min)
    # float32 at least (as in the eager kernel), float64 stays float64 so that its finfo.min stays finite.
    weights = F.softmax(scores, dim=-1, dtype=torch.promote_types(scores.dtype, torch.float32)).to(query.dtype)
    del scores  # free it before the output is made
    weights = F.dropout(weights, p=dropout, training=module.training)
    output = torch.matmul(weights, values)  # (batch, heads, blocks, block, head_dim)
    # Rows with no key in reach got uniform weights over masked keys; like the eager kernel they must give zeros.
    output.masked_fill_(blocked.all(dim=-1, keepdim=True), 0.0)
    output = output.view(batch, heads, blocks * block, head_dim)
    if glob.numel():
        global_output, _ = eager_attention_forward(
            module, query[:, :, glob], key, value, attention_mask, scaling=scaling, dropout=dropout
        )  # (batch, n_global, heads, head_dim)
        output.index_copy_(2, glob, global_output.transpose(1, 2))
    return output[:, :, :seq].transpose(1, 2).contiguous(), None  # (batch, seq, heads, head_dim)


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


# Sliding-window layers under each attn_implementation of the model. "eager" stays the exact reference: eager attention
# with the band written out as a (seq, seq) mask, which returns the weights. "sdpa" (the fast choice) runs the blocked
# kernel. Any other implementation has no local kernel and raises instead of quietly attending to everything.
LOCAL_ATTENTION_KERNELS = {"eager": "eager", "sdpa": "local_blocked"}


def attention_kernel(attn_implementation: str | None, layer_type: str) -> str:
    """The name of the kernel a layer of `layer_type` ("full_attention" or "sliding_attention") runs."""
    implementation = attn_implementation or "eager"
    if layer_type == "full_attention":
        return implementation
    if implementation not in LOCAL_ATTENTION_KERNELS:
        raise ValueError(
            f"attn_implementation={implementation!r} has no sliding-window kernel; load the model with "
            f"attn_implementation='sdpa' (blocked local kernel) or 'eager' (the reference), or set sliding_window=None."
        )
    return LOCAL_ATTENTION_KERNELS[implementation]


def _kernel_function(name: str) -> Callable:
    if name == "local_blocked":
        return local_attention_forward
    if name == "sdpa":
        return sdpa_attention_forward
    return ALL_ATTENTION_FUNCTIONS.get_interface(name, eager_attention_forward)


class SineBertAttention(nn.Module):
    """Multi-head self-attention with one fused QKV projection; the kernel is looked up by name."""

    def __init__(self, config: SineBertConfig, layer_idx: int):
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.num_heads = config.num_attention_heads
        self.head_dim = config.hidden_size // config.num_attention_heads
        self.scaling = self.head_dim**-0.5
        self.is_causal = False  # transformers' SDPA wrapper treats a module without it as causal when mask is None
        self.layer_type = config.layer_types[layer_idx]
        local = self.layer_type == "sliding_attention"
        self.sliding_window = config.sliding_window if local else None
        self.global_positions = tuple(config.global_attention_positions or ()) if local else ()
        self.qkv_proj = nn.Linear(config.hidden_size, 3 * config.hidden_size)
        self.out_proj = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        output_attentions: bool = False,
        unpadded: "Unpadded | None" = None,
        output_rows: "OutputRows | None" = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """hidden_states: `(batch, seq, hidden)`, or the `(n_real + fillers, hidden)` rows of `unpadded`. With
        `output_rows`, the output is `(n_rows, hidden)`: every token is still a key and a value, but only those rows
        are queries (under full attention) and are projected out."""
        if output_rows is not None and self.layer_type == "full_attention":
            return self._attend_output_rows(hidden_states, attention_mask, unpadded, output_rows), None
        qkv = self.qkv_proj(hidden_states)  # (batch, seq, 3 * hidden) or (n_real + fillers, 3 * hidden)
        hidden = qkv.shape[-1] // 3
        if unpadded is not None and self.layer_type == "full_attention":
            output = unpadded.with_fillers(self._attend_buckets(qkv, unpadded.buckets, output_attentions))
            weights = None  # output: (n_real + fillers, hidden)
        elif unpadded is not None:  # sliding windows need the batch's own positions; padding keys are masked
            output, weights = self._attend(unpadded.pad(qkv), attention_mask, output_attentions)
            output = unpadded.with_fillers(unpadded.layout.unpad(output))  # (n_real + fillers, hidden)
        else:
            output, weights = self._attend(qkv, attention_mask, output_attentions)
        if output_rows is not None:
            output = output.reshape(-1, hidden).index_select(0, output_rows.index)  # (n_rows, hidden)
        return self.out_proj(output), weights

    def _attend_output_rows(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None,
        unpadded: "Unpadded | None",
        output_rows: "OutputRows",
    ) -> torch.Tensor:
        """Full attention with only the rows read as queries -> `(n_rows, hidden)` after the output projection."""
        hidden = self.out_proj.in_features
        weight, bias = self.qkv_proj.weight, self.qkv_proj.bias  # (3 * hidden, hidden): query, key, value
        rows = hidden_states.reshape(-1, hidden_states.shape[-1]).index_select(0, output_rows.index)
        query = output_rows.layout.pad(F.linear(rows, weight[:hidden], bias[:hidden]))  # (batch, queries, hidden)
        key_value = F.linear(hidden_states, weight[hidden:], bias[hidden:])  # (..., 2 * hidden) for every token
        if unpadded is not None:
            key_value = unpadded.pad(key_value)  # (batch, seq, 2 * hidden); padding keys are masked
        batch, seq = key_value.shape[:2]
        query = query.view(batch, -1, self.num_heads, self.head_dim).transpose(1, 2)  # (batch, heads, queries, dim)
        key, value = key_value.view(batch, seq, 2, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        output, _ = self._kernel(query, key, value, attention_mask)  # (batch, queries, heads, head_dim)
        return self.out_proj(output_rows.layout.unpad(output).flatten(1))

    def _attend_buckets(
        self, qkv: torch.Tensor, buckets: tuple["AttentionBucket", ...], output_attentions: bool = False
    ) -> torch.Tensor:
        """qkv: `(n_real + fillers, 3 * hidden)` -> `(n_real, hidden)`, full attention within each bucket."""
        hidden = qkv.shape[-1] // 3
        parts = []
        for bucket in buckets:
            batch, k_seq = bucket.grid.shape
            # One gather fills the grid: no zeroing, as places past a sequence's end hold a real row (see the bucket).
            grid = qkv.index_select(0, bucket.grid.flatten()).view(batch, k_seq, 3, self.num_heads, self.head_dim)
            query, key, value = grid.permute(2, 0, 3, 1, 4).unbind(0)  # (batch, heads, k_seq, head_dim) each
            attended, _ = self._kernel(query[:, :, : bucket.q_seq], key, value, bucket.mask, output_attentions)
            parts.append(attended[bucket.places].flatten(1))  # (batch, q_seq, heads, head_dim) -> (its rows, hidden)
        return torch.cat(parts) if parts else qkv.new_zeros(0, hidden)

    def _attend(
        self, qkv: torch.Tensor, attention_mask: torch.Tensor | None, output_attentions: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """qkv: `(batch, seq, 3 * hidden)` -> the heads' outputs `(batch, seq, hidden)`, and the weights under eager."""
        batch, seq = qkv.shape[:2]
        # (batch, seq, 3 * hidden) -> (3, batch, heads, seq, head_dim)
        query, key, value = qkv.view(batch, seq, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        output, weights = self._kernel(query, key, value, attention_mask, output_attentions)
        return output.flatten(2), weights  # (batch, seq, hidden)

    def _kernel(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        output_attentions: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """query `(batch, heads, q_seq, head_dim)`, key and value `(batch, heads, seq, head_dim)` -> `(batch, q_seq,
        heads, head_dim)` through the kernel of this layer's attn_implementation, and the weights under eager."""
        batch, q_seq = query.shape[0], query.shape[2]
        if q_seq == 0 or key.shape[2] == 0:  # nothing to compute, and SDPA rejects empty sequences
            return query.new_zeros(batch, q_seq, self.num_heads, self.head_dim), None
        kernel = attention_kernel(self.config._attn_implementation, self.layer_type)
        if output_attentions and kernel != "eager":
            raise ValueError(
                f"output_attentions=True needs the eager attention kernel, but this layer runs {kernel!r}; "
                "load the model with attn_implementation='eager' (or call model.set_attn_implementation('eager'))."
            )
        output, weights = _kernel_function(kernel)(
            self,
            query,
            key,
            value,
            attention_mask,
            scaling=self.scaling,
            dropout=self.config.attention_probs_dropout_prob if self.training else 0.0,
            sliding_window=self.sliding_window,
            global_positions=self.global_positions,
        )
        return output, weights

    def kernel_description(self) -> str:
        """What this layer attends to and which kernel runs it, e.g. `sliding_attention(window=128, global=[0]) via
        local_blocked`; raises ValueError where the model's attn_implementation has no kernel for it."""
        kernel = attention_kernel(self.config._attn_implementation, self.layer_type)
        if self.layer_type == "full_attention":
            return f"full_attention via {kernel}"
        return f"sliding_attention(window={self.sliding_window}, global={list(self.global_positions)}) via {kernel}"

    def extra_repr(self) -> str:
        if self.layer_type == "full_attention":
            return "layer_type=full_attention"
        window, positions = self.sliding_window, list(self.global_positions)
        return f"layer_type=sliding_attention, sliding_window={window}, global={positions}"


class SineBertMLP(nn.Module):
    """Position-wise feed-forward network: Linear(d, ffn) -> activation -> Linear(ffn, d)."""

    def __init__(self, config: SineBertConfig):
        super().__init__()
        self.fc1 = nn.Linear(config.hidden_size, config.intermediate_size)
        self.act = ACT2FN[config.hidden_act]
        self.fc2 = nn.Linear(config.intermediate_size, config.hidden_size)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(hidden_states)))


class SineBertLayer(GradientCheckpointingLayer):
    """Attention and feed-forward sub-layers, each with a residual connection and LayerNorm (post- or pre-LN)."""

    def __init__(self, config: SineBertConfig, layer_idx: int):
        super().__init__()
        self.pre_norm = config.norm_placement == "pre"
        self.attention = SineBertAttention(config, layer_idx)
        self.attention_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.mlp = SineBertMLP(config)
        self.mlp_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        output_attentions: bool = False,
        unpadded: "Unpadded | None" = None,
        output_rows: "OutputRows | None" = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """hidden_states: `(batch, seq, hidden)`, or the `(n_real + fillers, hidden)` rows of `unpadded`. With
        `output_rows`, the layer returns only those rows, `(n_rows, hidden)`, and computes its residual, norms and
        feed-forward network on them alone (the rows a head reads, in the last layer)."""
        attended, weights = self.attention(
            self.attention_norm(hidden_states) if self.pre_norm else hidden_states,
            attention_mask, output_attentions, unpadded, output_rows,
        )
        if output_rows is not None:
            hidden_states = hidden_states.reshape(-1, hidden_states.shape[-1]).index_select(0, output_rows.index)
        if self.pre_norm:
            hidden_states = hidden_states + self.dropout(attended)
            hidden_states = hidden_states + self.dropout(self.mlp(self.mlp_norm(hidden_states)))
        else:
            hidden_states = self.attention_norm(hidden_states + self.dropout(attended))
            hidden_states = self.mlp_norm(hidden_states + self.dropout(self.mlp(hidden_states)))
        return hidden_states, weights


class SineBertPreTrainedModel(PreTrainedModel):
    config_class = SineBertConfig
    config: SineBertConfig
    base_model_prefix = "sinebert"
    supports_gradient_checkpointing = True
    _supports_sdpa = True
    _supports_attention_backend = False
    _no_split_modules = ["SineBertLayer"]

    def attention_kernels(self) -> list[str]:
        """Per encoder layer, its attention and the kernel that runs it under the current attn_implementation, e.g.
        `["full_attention via sdpa", "sliding_attention(window=128, global=[0]) via local_blocked", ...]`. Raises
        ValueError where a layer has no kernel, exactly as a forward pass would. (Under "sdpa", full attention in bf16
        on a CPU runs as two batched matmuls where that is faster: `sdpa_backend`.)"""
        return [layer.attention.kernel_description() for layer in self.base_model.layers]

    def _init_weights(self, module: nn.Module):
        super()._init_weights(module)
        if isinstance(module, SineBertEmbeddings):
            positions = torch.arange(module.position_table.shape[0], device=module.position_table.device)
            init.copy_(module.position_table, sinusoidal_encoding(positions, self.config.hidden_size))
            if module.segment_match is not None:
                init.zeros_(module.segment_match)  # starts as the model without the feature
            if module.case_embeddings is not None:
                init.zeros_(module.case_embeddings)

    @torch.no_grad()
    def initialize_weights(self):
        # After the per-module init: the mimetic init spans two Linear children of an attention module, and
        # transformers skips `_init_weights` for modules of custom code that own no parameters themselves.
        super().initialize_weights()
        if self.config.attention_init != "mimetic":
            return
        for attention in (m for m in self.modules() if isinstance(m, SineBertAttention)):
            projections = (attention.qkv_proj, attention.out_proj)
            if all(getattr(p.weight, "_is_hf_initialized", False) for p in projections):
                continue  # loaded from a checkpoint: no SVDs, no change
            qkv, out = mimetic_attention_weights(self.config.hidden_size, self.config.num_attention_heads)
            for projection, weight in zip(projections, (qkv, out)):
                init.copy_(projection.weight, weight)  # init.* leave loaded tensors alone
                init.zeros_(projection.bias)


# Trockman and Kolter (2023): the query-key and value-output products of attention layers of trained transformers
# look like a positive (QK) or negative (VO) multiple of the identity plus noise; starting there saves the steps a
# random initialisation needs to find it. (alpha, beta) of each product, the paper's values.
MIMETIC_QUERY_KEY = (0.7, 0.7)
MIMETIC_VALUE_OUT = (0.4, -0.4)


def _low_rank_factors(alpha: float, beta: float, dim: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A, B of shape `(rank, dim)` with A^T B the best rank-`rank` approximation of alpha * Z + beta * I, Z with
    N(0, 1/dim) entries (from torch's global generator, so torch.manual_seed makes it reproducible)."""
    target = alpha * torch.randn(dim, dim) / math.sqrt(dim) + beta * torch.eye(dim)
    left, singular, right_t = torch.linalg.svd(target)
    root = singular[:rank].sqrt()
    return (left[:, :rank] * root).T, root[:, None] * right_t[:rank]


def mimetic_attention_weights(hidden_size: int, num_heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Mimetic initial weights of one attention layer: the fused QKV projection's `(3 * hidden, hidden)` and the
    output projection's `(hidden, hidden)`. nn.Linear computes x W^T, so head h's attention logits are
    x W_q,h^T W_k,h x'^T: each head gets its own rank-`head_dim` factors of a query-key target, and the value and
    output projections (all heads together) the full-rank factors of a value-output target."""
    head_dim = hidden_size // num_heads
    query_key = [_low_rank_factors(*MIMETIC_QUERY_KEY, hidden_size, head_dim) for _ in range(num_heads)]
    value, out_t = _low_rank_factors(*MIMETIC_VALUE_OUT, hidden_size, hidden_size)
    query = torch.cat([q for q, _ in query_key])  # (hidden, hidden): heads stacked as the QKV view splits them
    key = torch.cat([k for _, k in query_key])
    return torch.cat([query, key, value]), out_t.T


def _padding_mask(attention_mask: torch.Tensor | None) -> torch.Tensor | None:
    """`(batch, seq)` 1/0 padding mask -> boolean `(batch, 1, 1, seq)`, or None when nothing is padded (which
    lets SDPA take its unmasked fast path)."""
    if attention_mask is None:
        return None
    if attention_mask.dim() != 2:
        raise ValueError(
            f"attention_mask must have shape (batch, seq) with 1 for tokens and 0 for padding, got shape "
            f"{tuple(attention_mask.shape)}."
        )
    mask = attention_mask.bool()
    if bool(mask.all()):
        return None
    return mask[:, None, None, :]


class PaddedLayout(NamedTuple):
    """Where `n` rows go in a padded `(batch, seq)` grid: `slots`, their places in the flattened grid, and `padding`,
    the other places."""

    slots: torch.Tensor  # (n,)
    padding: torch.Tensor  # (batch * seq - n,)
    batch: int
    seq: int

    @classmethod
    def of(cls, real: torch.Tensor, slots: torch.Tensor | None = None) -> "PaddedLayout":
        """real: `(batch, seq)` bool, True where a row goes; the rows fill those places in row-major order unless
        `slots` gives another order."""
        if slots is None:
            slots = real.flatten().nonzero().squeeze(-1)
        return cls(slots, (~real).flatten().nonzero().squeeze(-1), *real.shape)

    def pad(self, values: torch.Tensor) -> torch.Tensor:
        """`(n, ...)` -> `(batch, seq, ...)`, zeros at the padding."""
        # Every place written once: zeroing the whole grid first would write it twice.
        padded = values.new_empty(self.batch * self.seq, *values.shape[1:])
        padded.index_copy_(0, self.slots, values).index_fill_(0, self.padding, 0)
        return padded.view(self.batch, self.seq, *values.shape[1:])

    def unpad(self, values: torch.Tensor) -> torch.Tensor:
        """`(batch, seq, ...)` -> `(n, ...)`."""
        return values.flatten(0, 1).index_select(0, self.slots)


class AttentionBucket(NamedTuple):
    """Sequences of similar length whose full attention runs in one kernel call, on a `(batch, k_seq)` grid of keys and
    values with each sequence's tokens at the front of its own row; the queries are the grid's first `q_seq` columns,
    `q_seq` being the longest sequence."""

    rows: slice  # their rows in the `(n_real, ...)` layout of Unpadded
    # (batch, k_seq) the row of `(n_real, ...)` at each place of the grid. Places past a sequence's end repeat a real
    # row of the bucket: they are masked as keys and dropped as queries, so nothing needs zeroing.
    grid: torch.Tensor
    places: tuple[torch.Tensor, torch.Tensor]  # (its rows,) twice: grid row and column of each of the bucket's rows
    q_seq: int
    mask: torch.Tensor | None  # (batch, 1, 1, k_seq) True at real tokens, or None when every place is one


# A bucket of its own costs a kernel call and its copies, counted as the attention work of one sequence of 128 tokens:
# a batch is split only where that saves more. On the SST-2 dev batches of benchmarks/speed.py (2 CPU cores, bf16),
# costs of 64**2 to 192**2 and 2 to 4 buckets ran within 4% of each other, 128**2 among the fastest; in float32 all
# within 1%. Long inputs of mixed lengths still split, since their attention work grows with the square of the length.
BUCKET_COST = 128 * 128
MAX_BUCKETS = 4
# PyTorch's bf16 softmax on a CPU is fast along a last dimension that is a multiple of 32 and runs a slow loop over
# the rest: over 40 keys it took 1.9 times as long as over 64, over 63 keys 4.5 times (`python benchmarks/speed.py
# --kernels`, AMD EPYC, torch 2.13). Where full attention runs the matmul kernel, each bucket's keys are therefore
# rounded up to this multiple; the keys added are masked, so the result is the same.
MATMUL_KEY_MULTIPLE = 32
# bf16 matrix products on a CPU (oneDNN) run slower when their rows are not a multiple of 16 and change from call to
# call, as the real-token counts of unpadded batches do: over 28 such counts from 950 to 1,139 a (rows, 256) x (256,
# 1024) product made 635 GFLOP/s, and 687 (counting only the real rows) with its rows rounded up to a multiple of 16
# (same command and machine; float32 is not affected). Unpadded bf16 batches therefore carry filler rows up to it,
# from FILLED_MIN_ROWS rows on: below them the rounding gained nothing over changing row counts and, at a fixed count,
# cost up to a fifth more time (20 rows rounded up to 32).
CPU_BF16_ROW_MULTIPLE = 16
FILLED_MIN_ROWS = 256


def attention_buckets(lengths: list[int], device: torch.device, key_multiple: int = 1) -> tuple[AttentionBucket, ...]:
    """Splits sequences of `lengths` (longest first; their rows follow one another in that order) into at most
    MAX_BUCKETS runs of equal count, as many as make the padded attention work, sum(batch * q_seq * k_seq), plus
    BUCKET_COST per bucket smallest; each bucket's keys are its longest rounded up to a multiple of `key_multiple`.
    Sequences without tokens join no bucket."""
    lengths = [n for n in lengths if n]
    if not lengths:
        return ()

    def runs(count: int) -> list[list[int]]:
        size = -(-len(lengths) // count)
        return [lengths[i : i + size] for i in range(0, len(lengths), size)]

    def keys(run: list[int]) -> int:
        return -(-run[0] // key_multiple) * key_multiple

    def cost(split: list[list[int]]) -> int:
        return sum(len(run) * run[0] * keys(run) + BUCKET_COST for run in split)

    splits = [runs(count) for count in range(1, MAX_BUCKETS + 1)]
    costs = [cost(split) for split in splits]  # (not min(key=...), which torch.compile warns about)
    buckets, start = [], 0
    for run in splits[costs.index(min(costs))]:
        # Each sequence's tokens move to the front of its row: full attention does not see positions (the sinusoids
        # were added to the embeddings), so where the padding was (left or right) does not matter.
        counts = torch.tensor(run, device=device)[:, None]  # (batch, 1)
        starts = start + counts.cumsum(0) - counts  # (batch, 1) the row of each sequence's first token
        columns = torch.arange(keys(run), device=device)  # (k_seq,)
        real = columns < counts  # (batch, k_seq)
        grid = torch.where(real, starts + columns, start)
        mask = None if run[-1] == keys(run) else real[:, None, None, :]  # (the shortest fills every key)
        places = real[:, : run[0]].nonzero().unbind(1)
        buckets.append(AttentionBucket(slice(start, start + sum(run)), grid, places, run[0], mask))
        start += sum(run)
    return tuple(buckets)


class Unpadded(NamedTuple):
    """Where the real tokens of a padded `(batch, seq)` batch sit once the padding is taken out.

    Embeddings, projections, feed-forward layers and LayerNorms then run on these rows only (Portes et
    al., 2023, MosaicBERT; ModernBERT): with mixed-length batches most of the work is no longer spent on padding. The
    rows hold the sequences longest first, so that full attention can run on buckets of similar length, each padded
    only to about its own longest (`buckets`); sliding-window attention puts the rows back into the `(batch, seq)`
    batch (`layout`). After the real tokens' rows may come filler rows, copies of the first, up to a multiple of
    `row_multiple` rows: every layer computes them, but no token attends to them and no output keeps them.
    """

    layout: PaddedLayout  # of the real tokens' rows in the batch
    buckets: tuple[AttentionBucket, ...]
    rows: torch.Tensor  # (n_real + fillers,) the place in the flattened batch each row comes from

    @classmethod
    def from_mask(cls, attention_mask: torch.Tensor, key_multiple: int = 1, row_multiple: int = 1) -> "Unpadded":
        """`key_multiple`: the buckets' keys are rounded up to a multiple of it (see `attention_buckets`);
        `row_multiple`: the rows, with fillers, where there are at least FILLED_MIN_ROWS."""
        real = attention_mask.bool()
        lengths = real.sum(1)  # (batch,)
        order = torch.argsort(lengths, descending=True, stable=True)
        positions = order[:, None] * real.shape[1] + torch.arange(real.shape[1], device=real.device)  # (batch, seq)
        layout = PaddedLayout.of(real, slots=positions[real[order]])
        fillers = -len(layout.slots) % row_multiple if len(layout.slots) >= FILLED_MIN_ROWS else 0
        rows = torch.cat([layout.slots, layout.slots[:1].expand(fillers)]) if fillers else layout.slots
        return cls(layout, attention_buckets(lengths[order].tolist(), real.device, key_multiple), rows)

    @property
    def n_real(self) -> int:
        return len(self.layout.slots)

    def unpad(self, values: torch.Tensor) -> torch.Tensor:
        """`(batch, seq, ...)` -> `(n_real + fillers, ...)`."""
        return values.flatten(0, 1).index_select(0, self.rows)

    def pad(self, values: torch.Tensor) -> torch.Tensor:
        """`(n_real + fillers, ...)` -> `(batch, seq, ...)`, zeros at the padding; the fillers are dropped."""
        return self.layout.pad(values[: self.n_real])

    def with_fillers(self, values: torch.Tensor) -> torch.Tensor:
        """`(n_real, ...)` -> `(n_real + fillers, ...)`, zeros at the fillers."""
        fillers = len(self.rows) - self.n_real
        return torch.cat([values, values.new_zeros(fillers, *values.shape[1:])]) if fillers else values

    def real_tokens(self, *inputs: torch.Tensor | None) -> list[torch.Tensor | None]:
        """Each of the embeddings' inputs (ids `(batch, seq)` or `inputs_embeds` `(batch, seq, hidden)`, or None) at
        each row, as one row: `(1, n_real + fillers, ...)`. position_ids (the third), when None, become each token's
        column, the position it has in the padded batch."""
        grid = self.layout.batch, self.layout.seq  # (position_ids may come as one row for every sequence)
        taken = [None if x is None else x.expand(*grid, *x.shape[2:]).flatten(0, 1)[self.rows][None] for x in inputs]
        if taken[2] is None:
            taken[2] = (self.rows % self.layout.seq)[None]
        return taken

    def rows_of(self, positions: torch.Tensor) -> torch.Tensor:
        """Flattened `(batch * seq)` positions of real tokens -> their rows in the `(n_real, ...)` layout."""
        slots = self.layout.slots
        row = torch.full((self.layout.batch * self.layout.seq,), -1, dtype=torch.long, device=slots.device)
        row[slots] = torch.arange(len(slots), device=slots.device)
        return row[positions]


class OutputRows(NamedTuple):
    """The rows a head reads, which alone the last layer computes: `index` into the rows of its input, and `layout`,
    the same rows as queries in a `(batch, queries)` grid, each sequence's in its own row."""

    index: torch.Tensor  # (n_rows,)
    layout: PaddedLayout

    @classmethod
    def from_mask(cls, output_mask: torch.Tensor, unpadded: "Unpadded | None") -> "OutputRows":
        read = output_mask.bool()
        positions = read.flatten().nonzero().squeeze(-1)  # (n_rows,) in the flattened batch, row-major
        counts = read.sum(1)  # (batch,)
        queries = torch.arange(int(counts.max()) if counts.numel() else 0, device=read.device) < counts[:, None]
        return cls(positions if unpadded is None else unpadded.rows_of(positions), PaddedLayout.of(queries))


def tokens_to_keep(predicted: torch.Tensor, attention_mask: torch.Tensor | None, keep: float) -> torch.Tensor:
    """`(batch, seq)` bool, the tokens that token dropping's layers compute: every `predicted` one and, drawn at
    random, as many others as make up `keep` of each sequence's tokens (rounded up)."""
    real = torch.ones_like(predicted) if attention_mask is None else attention_mask.bool()
    predicted = predicted & real
    # Predicted tokens rank first (score 2), the others in random order (scores in [0, 1)), padding last (-1).
    scores = torch.rand(predicted.shape, device=predicted.device)
    scores = torch.where(predicted, 2.0, torch.where(real, scores, -1.0))
    counts = torch.maximum((real.sum(1) * keep).ceil().long(), predicted.sum(1))  # (batch,)
    ranks = scores.argsort(1, descending=True).argsort(1)
    return ranks < counts[:, None]


class DroppedTokens(NamedTuple):
    """How the layers of token dropping (`config.token_dropping_layers`) compute only the `kept` tokens. The fast
    path gives them only the kept tokens' rows. The eager reference computes every token but masks the others as keys,
    and gives them back the state they entered with when the last of those layers is done."""

    kept: torch.Tensor  # (batch, seq) bool
    unpadded: Unpadded | None  # of the kept tokens, which those layers get as their rows; None under eager
    index: torch.Tensor | None  # (n_kept + fillers,) each of those rows in the hidden states entering them

    @classmethod
    def of(cls, kept: torch.Tensor, outer: Unpadded | None, multiples: tuple[int, int] | None) -> "DroppedTokens":
        """`outer`: the unpadded batch the other layers compute, if any; `multiples` (those of `Unpadded.from_mask`),
        None for the eager reference."""
        if multiples is None:
            return cls(kept, None, None)
        unpadded = Unpadded.from_mask(kept, *multiples)
        return cls(kept, unpadded, unpadded.rows if outer is None else outer.rows_of(unpadded.rows))

    @property
    def mask(self) -> torch.Tensor:
        """`(batch, 1, 1, seq)`: the keys of those layers under the eager reference."""
        return self.kept[:, None, None, :]

    def enter(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """The hidden states before the first dropping layer -> its input: `(n_kept + fillers, hidden)` rows."""
        if self.unpadded is None:
            return hidden_states
        return hidden_states.reshape(-1, hidden_states.shape[-1]).index_select(0, self.index)

    def leave(self, entered: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        """`entered` (the states before the first dropping layer) with the kept tokens' states replaced by
        `hidden_states`, those after the last dropping layer."""
        if self.unpadded is None:
            return torch.where(self.kept[..., None], hidden_states, entered)
        n_kept, width = self.unpadded.n_real, entered.shape[-1]
        flat = entered.reshape(-1, width).index_copy(0, self.index[:n_kept], hidden_states[:n_kept])
        return flat.view_as(entered)


class SineBertModel(SineBertPreTrainedModel):
    """The bare encoder: `last_hidden_state` of shape `(batch, seq, hidden)`."""

    def __init__(self, config: SineBertConfig):
        super().__init__(config)
        self.embeddings = SineBertEmbeddings(config)
        self.layers = nn.ModuleList([SineBertLayer(config, i) for i in range(config.num_hidden_layers)])
        # Pre-LN leaves the residual stream unnormalised; the final LayerNorm gives heads a normalised input.
        self.final_norm = (
            nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps) if config.norm_placement == "pre" else None
        )
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embeddings.word_embeddings

    def set_input_embeddings(self, value: nn.Embedding):
        self.embeddings.word_embeddings = value

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        case_ids: torch.LongTensor | None = None,
        output_mask: torch.Tensor | None = None,
        kept_tokens: torch.Tensor | None = None,
    ) -> BaseModelOutput:
        r"""
        output_mask (`torch.BoolTensor` of shape `(batch, seq)`): True where the caller reads the output. Then
            `last_hidden_state` holds only those positions, `(num_true, hidden)` in row-major order, and (except
            under the eager reference or with `output_hidden_states`) the last layer computes its queries, residual,
            norms and feed-forward network only there; keys and values still come from every token. The masked-LM head
            passes the masked positions, the classifier with `classifier_pooling="cls"` the first token.
        kept_tokens (`torch.BoolTensor` of shape `(batch, seq)`): token dropping: True at the real tokens that the
            layers of `config.token_dropping_layers` compute (see the config); the others skip those layers. The
            masked-LM head passes them while it trains.
        """
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("Pass exactly one of input_ids or inputs_embeds.")
        output_attentions = self.config.output_attentions if output_attentions is None else output_attentions
        if output_hidden_states is None:
            output_hidden_states = self.config.output_hidden_states
        inputs = input_ids if input_ids is not None else inputs_embeds
        if output_mask is not None:
            self._check_token_mask("output_mask", output_mask, attention_mask, inputs.shape[:2],
                                   "The positions to read (output_mask, or masked-LM labels other than -100) include "
                                   "padding (attention_mask 0); read real tokens only.")
        masks = self._layer_masks(attention_mask, inputs.shape[1], inputs.device)
        # Padded batches drop their padding before the layers, except under the eager reference, which computes
        # every position as written. The outputs at padding are then zeros instead of values nobody should read.
        unpadded = None
        if masks["full_attention"] is not None and self.config._attn_implementation != "eager":
            unpadded = Unpadded.from_mask(attention_mask, *self._unpadded_multiples(inputs.device))
        if unpadded is not None and self.embeddings.segment_match is None and not torch.compiler.is_compiling():
            # Only the rows are embedded, as one sequence; cross-segment matches need the batch's own rows.
            # (Not under torch.compile: with freezing and dynamic shapes, torch 2.13's inductor generates code for
            # this path that names an undefined size and fails.)
            hidden_states = self.embeddings(*unpadded.real_tokens(input_ids, token_type_ids, position_ids,
                                                                  inputs_embeds, case_ids)).squeeze(0)
        else:
            hidden_states = self.embeddings(input_ids, token_type_ids, position_ids, inputs_embeds, case_ids)
            if unpadded is not None:
                hidden_states = unpadded.unpad(hidden_states)  # (n_real + fillers, hidden)
        output_rows = None
        if output_mask is not None and not output_hidden_states and self.config._attn_implementation != "eager":
            output_rows = OutputRows.from_mask(output_mask, unpadded)
        dropped, dropping = None, self.config.token_dropping_range
        if kept_tokens is not None:
            dropped = self._dropped_tokens(kept_tokens, attention_mask, unpadded, inputs)
        all_hidden_states, all_attentions = [], []
        for index, layer in enumerate(self.layers):
            inside = dropped is not None and index in dropping
            if inside and index == dropping[0]:
                entered, hidden_states = hidden_states, dropped.enter(hidden_states)
            all_hidden_states.append(dropped.leave(entered, hidden_states) if inside else hidden_states)
            last = index == len(self.layers) - 1
            hidden_states, weights = layer(
                hidden_states, dropped.mask if inside else masks[layer.attention.layer_type], output_attentions,
                dropped.unpadded if inside else unpadded, output_rows if last else None,
            )
            all_attentions.append(weights)
            if inside and index == dropping[-1]:
                hidden_states = dropped.leave(entered, hidden_states)
        if self.final_norm is not None:
            hidden_states = self.final_norm(hidden_states)
        all_hidden_states.append(hidden_states)
        if unpadded is not None and output_rows is None:
            hidden_states = unpadded.pad(hidden_states)
            all_hidden_states = [unpadded.pad(h) for h in all_hidden_states] if output_hidden_states else []
        if output_mask is not None and output_rows is None:  # the reference: every position computed, then selected
            hidden_states = hidden_states[output_mask.bool()]
        return BaseModelOutput(
            last_hidden_state=hidden_states,
            hidden_states=tuple(all_hidden_states) if output_hidden_states else None,
            attentions=tuple(all_attentions) if output_attentions else None,
        )

    def _unpadded_multiples(self, device: torch.device) -> tuple[int, int]:
        """(key_multiple, row_multiple) of `Unpadded.from_mask`: MATMUL_KEY_MULTIPLE where full attention will run
        the matmul kernel and CPU_BF16_ROW_MULTIPLE for the projections, both for bf16 on a CPU, else 1. The
        projections compute in the autocast dtype where autocast is on, else in the weights'."""
        device = device.type
        weights = self.embeddings.word_embeddings.weight.dtype
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else weights
        if device != "cpu" or dtype != torch.bfloat16:
            return 1, 1
        return MATMUL_KEY_MULTIPLE if self.config._attn_implementation == "sdpa" else 1, CPU_BF16_ROW_MULTIPLE

    def _dropped_tokens(
        self, kept: torch.Tensor, attention_mask: torch.Tensor | None, unpadded: Unpadded | None, inputs: torch.Tensor
    ) -> DroppedTokens:
        if self.config.token_dropping_layers is None:
            raise ValueError("kept_tokens needs config.token_dropping_layers, the layers that compute only them.")
        # Checked here, not in the config: a checkpoint pretrained with token dropping may be read with windows.
        local = [i for i in self.config.token_dropping_range if self.config.layer_types[i] != "full_attention"]
        if local:
            raise ValueError(
                f"token_dropping_layers={list(self.config.token_dropping_layers)} includes sliding-window layers "
                f"{local}, whose windows count positions that dropping tokens would shift; drop tokens in "
                "full-attention layers only (or set token_dropping_layers=None)."
            )
        self._check_token_mask("kept_tokens", kept, attention_mask, inputs.shape[:2],
                               "kept_tokens includes padding (attention_mask 0); keep real tokens only.")
        multiples = None if self.config._attn_implementation == "eager" else self._unpadded_multiples(inputs.device)
        return DroppedTokens.of(kept.bool(), unpadded, multiples)

    @staticmethod
    def _check_token_mask(
        name: str, mask: torch.Tensor, attention_mask: torch.Tensor | None, shape: torch.Size, on_padding: str
    ):
        """`mask`, the `(batch, seq)` input `name`, has the input's `shape` and is True at real tokens only (else
        ValueError(`on_padding`))."""
        if mask.shape != shape:
            raise ValueError(
                f"{name} must have the shape of the input, (batch, seq) = {tuple(shape)}, got {tuple(mask.shape)}."
            )
        if attention_mask is not None and bool((mask.bool() & ~attention_mask.bool()).any()):
            raise ValueError(on_padding)


    def _layer_masks(self, attention_mask: torch.Tensor | None, seq: int, device: torch.device) -> dict:
        """The masks of one forward pass, built once and keyed by layer type: the padding mask `(batch, 1, 1, seq)`
        (or None) for full attention; for sliding-window layers the written-out band `(batch or 1, 1, seq, seq)` under
        the eager reference, else the padding mask, from which the blocked kernel builds its O(seq * window) masks."""
        padding = _padding_mask(attention_mask)
        masks = {"full_attention": padding}
        if "sliding_attention" in self.config.layer_types:
            masks["sliding_attention"] = padding
            if attention_kernel(self.config._attn_implementation, "sliding_attention") == "eager":
                masks["sliding_attention"] = local_attention_mask(
                    seq, self.config.sliding_window, self.config.global_attention_positions, padding, device
                )
        return masks


class SineBertPredictionHead(nn.Module):
    """The masked-LM transform before the tied decoder: dense -> activation -> LayerNorm."""

    def __init__(self, config: SineBertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.act = ACT2FN[config.hidden_act]
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.act(self.dense(hidden_states)))


class SineBertForMaskedLM(SineBertPreTrainedModel):
    _tied_weights_keys = {"decoder.weight": "sinebert.embeddings.word_embeddings.weight"}

    def __init__(self, config: SineBertConfig):
        super().__init__(config)
        self.sinebert = SineBertModel(config)
        self.head = SineBertPredictionHead(config)
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size)
        self.post_init()

    def get_output_embeddings(self) -> nn.Linear:
        return self.decoder

    def set_output_embeddings(self, new_embeddings: nn.Linear):
        self.decoder = new_embeddings

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        case_ids: torch.LongTensor | None = None,
    ) -> MaskedLMOutput:
        r"""
        labels (`torch.LongTensor` of shape `(batch, seq)`): token ids to predict, -100 where nothing is predicted.
            With `config.sparse_prediction`, only those positions are projected onto the vocabulary and the logits
            have shape `(num_predicted, vocab_size)`, in row-major order of the labelled positions.
        """
        predicted = labels != -100 if labels is not None and self.config.sparse_prediction else None
        kept = None
        if self.training and labels is not None and self.config.token_dropping_layers is not None:
            kept = tokens_to_keep(labels != -100, attention_mask, self.config.token_dropping_keep)
        outputs = self.sinebert(
            input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds,
            output_attentions=output_attentions, output_hidden_states=output_hidden_states, case_ids=case_ids,
            output_mask=predicted, kept_tokens=kept,
        )
        hidden_states = outputs.last_hidden_state  # (batch, seq, hidden), or (num_predicted, hidden)
        if predicted is not None:
            labels = labels[predicted]
        logits = self.decoder(self.head(hidden_states))
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1))
        return MaskedLMOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )


class SineBertForSequenceClassification(SineBertPreTrainedModel):
    """Pools the sequence (`config.classifier_pooling`), then dense + tanh, dropout and a linear classifier."""

    def __init__(self, config: SineBertConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.sinebert = SineBertModel(config)
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        dropout = config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    def pool(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
        """`(batch, seq, hidden)` -> `(batch, hidden)`."""
        if self.config.classifier_pooling == "cls":
            return hidden_states[:, 0]
        if attention_mask is None:
            return hidden_states.mean(dim=1)
        weights = attention_mask.to(hidden_states.dtype)[..., None]  # (batch, seq, 1)
        return (hidden_states * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1.0)

    def _first_token_mask(self, inputs: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor | None:
        """`(batch, seq)` True at the first token of `inputs` (ids or embeddings), for the encoder to compute only
        there under "cls" pooling; None with mean pooling, or where a row starts with padding (left-padded batches)."""
        if self.config.classifier_pooling != "cls":
            return None
        if attention_mask is not None and not bool(attention_mask[:, 0].all()):
            return None
        mask = torch.zeros(inputs.shape[:2], dtype=torch.bool, device=inputs.device)
        mask[:, 0] = True
        return mask

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        case_ids: torch.LongTensor | None = None,
    ) -> SequenceClassifierOutput:
        r"""
        labels: class ids `(batch,)` for single-label, floats `(batch,)` or `(batch, 1)` for regression
            (`num_labels == 1`), multi-hot floats `(batch, num_labels)` for `problem_type="multi_label_classification"`.
        """
        first_token = self._first_token_mask(input_ids if input_ids is not None else inputs_embeds, attention_mask)
        outputs = self.sinebert(
            input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds,
            output_attentions=output_attentions, output_hidden_states=output_hidden_states, case_ids=case_ids,
            output_mask=first_token,
        )
        if first_token is None:
            pooled = self.pool(outputs.last_hidden_state, attention_mask)
        else:
            pooled = outputs.last_hidden_state  # (batch, hidden): the first token of each row
        pooled = torch.tanh(self.dense(pooled))
        logits = self.classifier(self.dropout(pooled))  # (batch, num_labels)
        loss = self._loss(logits, labels) if labels is not None else None
        return SequenceClassifierOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )

    def _loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        if self.config.problem_type is None:
            if self.num_labels == 1:
                self.config.problem_type = "regression"
            elif labels.dtype in (torch.long, torch.int):
                self.config.problem_type = "single_label_classification"
            else:
                self.config.problem_type = "multi_label_classification"
        if self.config.problem_type == "regression":
            return F.mse_loss(logits.squeeze(-1).float(), labels.reshape(-1).float())
        if self.config.problem_type == "single_label_classification":
            return F.cross_entropy(logits.float(), labels.reshape(-1))
        return F.binary_cross_entropy_with_logits(logits.float(), labels.float())


class SineBertForTokenClassification(SineBertPreTrainedModel):
    def __init__(self, config: SineBertConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.sinebert = SineBertModel(config)
        dropout = config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        case_ids: torch.LongTensor | None = None,
    ) -> TokenClassifierOutput:
        r"""labels: tag ids `(batch, seq)`, -100 on positions that are not scored (special tokens, sub-words)."""
        outputs = self.sinebert(
            input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds,
            output_attentions=output_attentions, output_hidden_states=output_hidden_states, case_ids=case_ids,
        )
        logits = self.classifier(self.dropout(outputs.last_hidden_state))  # (batch, seq, num_labels)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.reshape(-1, self.num_labels).float(), labels.reshape(-1))
        return TokenClassifierOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )


class SineBertForQuestionAnswering(SineBertPreTrainedModel):
    """Extractive QA: start and end logits over the tokens. Served by the `extractive-question-answering`
    pipeline that `import sinebert` registers (transformers 5 removed its own `question-answering` pipeline)."""

    def __init__(self, config: SineBertConfig):
        super().__init__(config)
        self.sinebert = SineBertModel(config)
        self.qa_outputs = nn.Linear(config.hidden_size, 2)
        self.post_init()

    def save_pretrained(self, save_directory, *args, **kwargs):
        """Also ships the QA pipeline, so `pipeline("question-answering", model=..., trust_remote_code=True)`
        serves the checkpoint where sinebert is not installed."""
        pipeline_file = Path(__file__).with_name("pipeline_sinebert.py")
        if not pipeline_file.is_file():
            raise FileNotFoundError(
                f"{pipeline_file} is missing, so this question-answering checkpoint could not carry its pipeline; "
                "install sinebert (pip install sinebert) and save again."
            )
        self.config.custom_pipelines = {
            "question-answering": {
                "impl": "pipeline_sinebert.ExtractiveQuestionAnsweringPipeline",
                "pt": ["AutoModelForQuestionAnswering"],
            }
        }
        super().save_pretrained(save_directory, *args, **kwargs)
        if kwargs.get("is_main_process", True):
            shutil.copyfile(pipeline_file, Path(save_directory) / pipeline_file.name)

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        start_positions: torch.LongTensor | None = None,
        end_positions: torch.LongTensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        case_ids: torch.LongTensor | None = None,
    ) -> QuestionAnsweringModelOutput:
        r"""start_positions / end_positions: `(batch,)` token indices of the answer span (0, the [CLS] token, for
        "no answer"); indices past the sequence are ignored."""
        outputs = self.sinebert(
            input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds,
            output_attentions=output_attentions, output_hidden_states=output_hidden_states, case_ids=case_ids,
        )
        start_logits, end_logits = self.qa_outputs(outputs.last_hidden_state).unbind(-1)  # 2 x (batch, seq)
        loss = None
        if start_positions is not None and end_positions is not None:
            seq = start_logits.shape[1]
            start = start_positions.reshape(-1).clamp(0, seq)  # seq is out of range: ignored below
            end = end_positions.reshape(-1).clamp(0, seq)
            loss = (
                F.cross_entropy(start_logits.float(), start, ignore_index=seq)
                + F.cross_entropy(end_logits.float(), end, ignore_index=seq)
            ) / 2
        return QuestionAnsweringModelOutput(
            loss=loss,
            start_logits=start_logits.contiguous(),
            end_logits=end_logits.contiguous(),
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )


for _cls, _auto in (
    (SineBertModel, "AutoModel"),
    (SineBertForMaskedLM, "AutoModelForMaskedLM"),
    (SineBertForSequenceClassification, "AutoModelForSequenceClassification"),
    (SineBertForTokenClassification, "AutoModelForTokenClassification"),
    (SineBertForQuestionAnswering, "AutoModelForQuestionAnswering"),
):
    _cls.register_for_auto_class(_auto)

__all__ = [
    "SineBertPreTrainedModel",
    "SineBertModel",
    "SineBertForMaskedLM",
    "SineBertForSequenceClassification",
    "SineBertForTokenClassification",
    "SineBertForQuestionAnswering",
]
