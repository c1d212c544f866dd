"""SineBERT: a BERT-style encoder with fixed sinusoidal positions and its own multi-head attention.

This file reads as BERT: embeddings, attention, feed-forward network, layers, the encoder, the heads, and the eager
reference kernel. Sibling files hold the fast machinery: `attention_sinebert.py` the kernels, registered by name,
`layout_sinebert.py` the padding-free layout of a batch, `loss_sinebert.py` the masked-LM loss over the vocabulary in
chunks, and `linear_sinebert.py` the linear layer's bf16 serving path. With `configuration_sinebert.py` they are what a
saved checkpoint carries for `trust_remote_code=True` (transformers copies a model file's relative imports), so they
import only torch, transformers and each other.
"""

import math
import shutil
from dataclasses import dataclass
from functools import partial
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
from transformers.utils import ModelOutput
from transformers.utils.generic import can_return_tuple

from .attention_sinebert import (
    SINEBERT_ATTENTION_FUNCTIONS,
    TurnToHeads,
    full_attention_kernel,
    is_tracing,
    local_attention_kernel,
    local_dense_limit,
    packed_attention,
    window_covers,
)
from .configuration_sinebert import SineBertConfig
from .layout_sinebert import LayerRows, TokenLayout, TokenLoss, nonzero, tokens_to_keep, with_prediction_fillers
from .linear_sinebert import SineBertLinear
from .loss_sinebert import vocabulary_cross_entropy


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


class Rotation(NamedTuple):
    """Rotary positions (RoFormer, Su et al., 2021) of a set of tokens: each head's dimensions i and i + head_dim/2
    turned by the angle position * theta^(-2i/head_dim), so that a turned query and key have a dot product that
    depends on their positions' difference only. Computed once per forward pass for every layer that turns those
    tokens (a pass of 4 layers ran ~40 operations fewer than computing the angles in each), in the layers' dtype."""

    cos: torch.Tensor  # (..., 1, head_dim): cos twice
    sin: torch.Tensor  # (..., 1, head_dim): -sin for the first half, sin for the second

    @classmethod
    def of(cls, positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype) -> "Rotation":
        """The rotation of tokens at `positions` `(...)`. Angles in float32 (not float64 as in `sinusoidal_encoding`:
        this runs every forward, on any device)."""
        exponents = torch.arange(head_dim // 2, dtype=torch.float32, device=positions.device) * (2 / head_dim)
        angles = positions.to(torch.float32)[..., None] * torch.pow(theta, -exponents)  # (..., head_dim / 2)
        cos, sin = angles.cos(), angles.sin()
        return cls(*(torch.cat(pair, -1)[..., None, :].to(dtype) for pair in ((cos, cos), (-sin, sin))))

    @classmethod
    def table(cls, length: int, head_dim: int, theta: float, device: torch.device | None = None) -> torch.Tensor:
        """`(length, 2, head_dim)` float32: the rotation of positions 0 to length - 1, cos and sin stacked, which a
        model keeps so that its passes look positions up instead of computing them."""
        return torch.cat(cls.of(torch.arange(length, device=device), head_dim, theta, torch.float32), dim=-2)

    @classmethod
    def look_up(cls, table: torch.Tensor, positions: torch.Tensor, dtype: torch.dtype) -> "Rotation":
        """The rotation of tokens at `positions` `(...)`, all within `table` (`Rotation.table`): `of`'s, bit for bit,
        in a gather and a cast (`of` ran 34 us for one sentence of 24 tokens, this 8)."""
        return cls(*table[positions].to(dtype).unsqueeze(-2).unbind(-3))  # 2 x (..., 1, head_dim)

    def select(self, index: torch.Tensor) -> "Rotation":
        """The rotation of the tokens at `index` `(n,)` of the flattened positions: `(n, 1, head_dim)`."""
        return Rotation(*(table.reshape(-1, *table.shape[-2:]).index_select(0, index) for table in self))

    def turn(self, x: torch.Tensor) -> torch.Tensor:
        """x `(..., n * head_dim)`: n heads' queries or keys of the tokens, turned. The reference that the fused turns
        below are tested against."""
        heads = x.unflatten(-1, (-1, self.cos.shape[-1]))  # (..., n, head_dim)
        return self._turned(heads, self.cos, self.sin).flatten(-2)

    def turn_parts(self, x: torch.Tensor, turned: int) -> torch.Tensor:
        """x `(parts, ..., heads, head_dim)`, the tokens' per-head projections -> a new tensor in x's own layout (a
        view of the fused projection: that projection's), the first `turned` parts turned and the rest copied."""
        return self._fused(x, self.cos, self.sin, turned, keep_layout=True)

    def turn_heads(self, x: torch.Tensor, turned: int | None = None) -> torch.Tensor:
        """x `(parts, batch, heads, seq, head_dim)`, any strides: per-head views split from the fused projection of
        a `(batch, k_seq, 1, head_dim)` rotation's first seq tokens -> a new contiguous tensor, its first `turned`
        parts (all where None) turned and the rest copied."""
        cos, sin = (table[:, : x.shape[-2]].transpose(1, 2) for table in self)  # (batch, 1, seq, head_dim)
        return self._fused(x, cos, sin, len(x) if turned is None else turned, keep_layout=False)

    @staticmethod
    def _fused(x, cos, sin, turned: int, keep_layout: bool) -> torch.Tensor:
        """TurnToHeads, or in a traced or compiled graph the reference's ops."""
        if is_tracing() or torch.compiler.is_compiling():  # a graph takes the reference's ops (inductor fuses them)
            return torch.cat([Rotation._turned(x[:turned], cos, sin), x[turned:]])
        if torch.is_grad_enabled() and x.requires_grad:
            return TurnToHeads.apply(x, cos, sin, turned, keep_layout)
        return TurnToHeads.turn(x, cos, sin, turned, keep_layout)  # nothing to differentiate

    def turn_projection(self, grid: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """grid `(3, batch, heads, seq, head_dim)`: the per-head views of the fused projection of a padded batch ->
        the queries and keys turned, contiguous, and the values. While training, the values are copied with them into
        one tensor, so that the gradient comes back as one tensor in the projection's own layout (bf16 steps 1.8%
        faster than turning each alone in benchmarks/ab.py); serving leaves them the view they are, which the kernels
        read as they are."""
        if torch.is_grad_enabled() and grid.requires_grad:
            return self.turn_heads(grid, turned=2).unbind(0)
        return *self.turn_heads(grid[:2]).unbind(0), grid[2]

    @staticmethod
    def _turned(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        # Each pair (a, b) -> (a cos - b sin, b cos + a sin): the halves swapped, times (-sin, sin), in one fused op.
        return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, -1), sin)


class SineBertEmbeddings(nn.Module):
    """Word (+ token-type) embeddings plus, with absolute positions, the fixed sinusoidal encoding of `position_ids`,
    then LayerNorm."""

    def __init__(self, config: SineBertConfig):
        super().__init__()
        self.config = config
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.token_type_embeddings = (
            nn.Embedding(config.type_vocab_size, config.hidden_size) if config.type_vocab_size > 0 else None
        )
        self.embedding_scale = math.sqrt(config.hidden_size) if config.scale_embeddings else 1.0
        self.absolute_positions = config.position_embedding_type == "absolute"  # (rotary ones turn the attention's)
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
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps, bias=config.bias)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def position_encoding(self, position_ids: torch.LongTensor | None, seq_length: int) -> torch.Tensor:
        """`(batch or 1, seq, hidden)` encodings; positions past the cached table are computed on the fly."""
        table = self.position_table
        if is_tracing():  # computed, so that the graph holds for any length
            positions = torch.arange(seq_length, device=table.device)[None] if position_ids is None else position_ids
            return sinusoidal_encoding(positions, self.config.hidden_size)
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
        checks = [(input_ids if inputs_embeds is None else None, self.config.vocab_size, "input_ids", "vocab_size")]
        if self.case_embeddings is not None:
            checks.append((case_ids, len(self.case_embeddings), "case_ids", "letter case classes"))
        if self.token_type_embeddings is not None:
            checks.append((token_type_ids, self.config.type_vocab_size, "token_type_ids", "type_vocab_size"))
        _check_ids(*checks)  # every id this pass looks up, in one read
        if inputs_embeds is None:
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
            inputs_embeds = inputs_embeds + F.embedding(case_ids, self.case_embeddings)  # as segment_match
        embeddings = inputs_embeds * self.embedding_scale
        if self.absolute_positions:
            positions = self.position_encoding(position_ids, embeddings.shape[1]) * self.config.position_scale
            embeddings = embeddings + positions.to(embeddings.dtype)
        if self.token_type_embeddings is not None:
            if token_type_ids is None:
                embeddings = embeddings + self.token_type_embeddings.weight[0]
            else:
                embeddings = embeddings + self.token_type_embeddings(token_type_ids)
        return self.dropout(self.LayerNorm(embeddings))


def cross_segment_matches(
    input_ids: torch.LongTensor, token_type_ids: torch.LongTensor, vocab_size: int
) -> torch.Tensor:
    """`(batch, seq)` bool, True where a token's id also occurs in the same row in the other segment (token type 0
    against the rest). A lookup of sorted keys, O(batch * seq) memory, so long inputs cost no (seq, seq) table."""
    rows = torch.arange(input_ids.shape[0], device=input_ids.device)[:, None]  # (batch, 1)
    keys = (rows * vocab_size + input_ids) * 2 + (token_type_ids != 0)  # (batch, seq)
    if is_tracing():  # ONNX has no sorted lookup (isin's searchsorted): compare all pairs, (batch, seq, seq)
        return ((keys ^ 1)[:, :, None] == keys[:, None, :]).any(dim=-1)
    return torch.isin(keys ^ 1, keys)  # the same row and id, the other segment


def _check_ids(*checks: tuple[torch.Tensor | None, int, str, str]):
    """Each (ids, size, name, config_name): ids (None: not looked up) within [0, size), all in one read of the device
    (a wait for it on a GPU)."""
    checks = [check for check in checks if check[0] is not None and check[0].numel()]
    if is_tracing() or not checks:  # (a check of values, which an exported graph cannot branch on)
        return
    bounds = torch.stack([bound.long() for ids, *_ in checks for bound in torch.aminmax(ids)]).tolist()
    for (ids, size, name, config_name), low, high in zip(checks, bounds[::2], bounds[1::2]):
        if low >= 0 and high < size:
            continue
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


class SineBertAttention(nn.Module):
    """Multi-head self-attention with one fused QKV projection; the kernel is looked up by name
    (`attention_sinebert.py` registers the fast ones)."""

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
        self.qkv_proj = SineBertLinear(config.hidden_size, 3 * config.hidden_size, bias=config.bias)
        self.out_proj = SineBertLinear(config.hidden_size, config.hidden_size, bias=config.bias)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        output_attentions: bool = False,
        rows: "LayerRows | None" = None,
        rotation: Rotation | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """hidden_states: `(batch, seq, hidden)`, or on a padding-free batch the `(n_rows, hidden)` rows that `rows`
        describes (see `layout_sinebert.py`), where only the rows it keeps come out. rotation: with rotary
        positions, that of the tokens, `(batch, seq, 1, head_dim)` or `(n_rows, 1, head_dim)`."""
        if rows is not None:
            return self.out_proj(rows.attend(self, hidden_states, attention_mask, output_attentions, rotation)), None
        output, weights = self.attend_padded(self.qkv_proj(hidden_states), attention_mask, output_attentions, rotation)
        return self.out_proj(output), weights

    def rotate(self, qkv: torch.Tensor, rotation: Rotation | None) -> torch.Tensor:
        """qkv: `(..., 3 * hidden)` projections of tokens, queries then keys then values. With rotary positions (a
        `rotation` of the tokens) the queries and keys come back turned, in a new tensor of qkv's layout (for the
        rows of a padding-free batch, before they go to their kernel); otherwise `qkv` as it is."""
        if rotation is None:
            return qkv
        parts = qkv.unflatten(-1, (3, self.num_heads, self.head_dim)).movedim(-3, 0)  # (3, ..., heads, head_dim)
        return rotation.turn_parts(parts, turned=2).movedim(0, -3).flatten(-3)

    def attend_padded(
        self, qkv: torch.Tensor, attention_mask: torch.Tensor | None, output_attentions: bool = False,
        rotation: Rotation | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """qkv: `(batch, seq, 3 * hidden)` -> the heads' outputs `(batch, seq, hidden)`, and the weights under eager.
        rotation: the tokens', `(batch, seq, 1, head_dim)`, with rotary positions when qkv is not turned yet."""
        batch, seq = qkv.shape[:2]
        # (batch, seq, 3 * hidden) -> (3, batch, heads, seq, head_dim)
        grid = qkv.view(batch, seq, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        query, key, value = grid.unbind(0) if rotation is None else rotation.turn_projection(grid)
        output, weights = self.attend(query, key, value, attention_mask, output_attentions)
        return output.flatten(2), weights

    def attend(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        output_attentions: bool = False,
        full: bool | None = None,
        **kernel_kwargs,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """query `(batch, heads, q_seq, head_dim)`, key and value `(batch, heads, seq, head_dim)` -> `(batch, q_seq,
        heads, head_dim)` through this layer's kernel, and the weights under eager. `full`: True where the keys are
        each query's whole sequence, as the rows of a padding-free batch give them (full attention's kernel, whatever
        the layer type); None: this layer's attention over `seq` keys (`attends_all`). `kernel_kwargs`: what the
        caller knows of the layout, for the kernels that use it: the boundaries of sequences packed in one row
        (`layout_sinebert.Packing`, for "varlen"), or `every_query_has_a_key` (for "matmul")."""
        batch, q_seq = query.shape[0], query.shape[2]
        if q_seq == 0 or key.shape[2] == 0:  # nothing to compute, and SDPA rejects empty sequences
            return query.new_zeros(batch, q_seq, self.num_heads, self.head_dim), None
        scores = batch * query.shape[1] * q_seq * key.shape[2]  # (a product of sizes, not Size.numel(): exportable)
        full = self.attends_all(key.shape[2]) if full is None else full
        packed = "cu_seq_lens_q" in kernel_kwargs
        kernel = self.kernel_name(query.device, query.dtype, scores, packed, key.shape[2], full)
        if output_attentions and kernel != "eager":
            raise ValueError(
                f"output_attentions=True needs the eager attention kernel, but this layer runs {kernel!r}; "
                "load the model with attn_implementation='eager' (or call model.set_attn_implementation('eager'))."
            )
        attention_function = SINEBERT_ATTENTION_FUNCTIONS.get_interface(kernel, eager_attention_forward)
        return attention_function(
            self, query, key, value, attention_mask, scaling=self.scaling,
            dropout=self.config.attention_probs_dropout_prob if self.training else 0.0,
            sliding_window=None if full else self.sliding_window,
            global_positions=() if full else self.global_positions, **kernel_kwargs,
        )

    def attends_all(self, seq: int | None) -> bool:
        """Whether this layer attends every key of inputs of `seq` tokens (None: long inputs): full attention, or a
        sliding window that covers them on the fast path (`window_covers`), which then runs as full attention."""
        if self.layer_type == "full_attention":
            return True
        return window_covers(self.config._attn_implementation, self.sliding_window, seq)

    def kernel_name(
        self, device: torch.device, dtype: torch.dtype, scores: int = 0, packed: bool = False, seq: int | None = None,
        full: bool | None = None,
    ) -> str:
        """The kernel this layer runs on inputs of `dtype` on `device` with `scores` attention scores (`packed`: on
        the sequences packed in one row) over `seq` keys (None: long inputs, for sliding windows); `full` as `attend`
        takes it."""
        implementation = self.config._attn_implementation
        if self.attends_all(seq) if full is None else full:
            return full_attention_kernel(implementation, device, dtype, scores, packed)
        return local_attention_kernel(implementation, seq, self.sliding_window, device, dtype)

    def kernel_description(
        self, device: torch.device, dtype: torch.dtype, scores: int = 0, packed: bool = False, seq: int | None = None
    ) -> str:
        """What this layer attends to and the kernel that runs it, e.g. `sliding_attention(window=128, global=[0]) via
        local_blocked (full attention up to 129 tokens, sdpa up to 768)`: without `seq`, the kernels of a sliding
        window and where each runs."""
        kernel = self.kernel_name(device, dtype, scores, packed, seq)
        if self.layer_type == "full_attention":
            return f"full_attention via {kernel}"
        if self.attends_all(seq):
            kernel += " (the window covers the input: full attention)"
        if seq is None and kernel == "local_blocked":
            limit = local_dense_limit(self.sliding_window, device, dtype)
            kernel += f" (full attention up to {self.sliding_window + 1} tokens, sdpa up to {limit})"
        return f"sliding_attention(window={self.sliding_window}, global={list(self.global_positions)}) via {kernel}"

    def extra_repr(self) -> str:
        if self.layer_type == "full_attention":
            return "layer_type=full_attention"
        window, positions = self.sliding_window, list(self.global_positions)
        return f"layer_type=sliding_attention, sliding_window={window}, global={positions}"


class SineBertMLP(nn.Module):
    """Position-wise feed-forward network: Linear(d, ffn) -> activation -> Linear(ffn, d); with `mlp_type="glu"`,
    Linear(d, 2 ffn) split into a gate and a value, activation(gate) * value -> Linear(ffn, d)."""

    def __init__(self, config: SineBertConfig):
        super().__init__()
        self.gated = config.mlp_type == "glu"
        width = config.intermediate_size * (2 if self.gated else 1)
        self.fc1 = SineBertLinear(config.hidden_size, width, bias=config.bias)
        self.act = ACT2FN[config.hidden_act]
        self.fc2 = SineBertLinear(config.intermediate_size, config.hidden_size, bias=config.bias)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if not self.gated:
            return self.fc2(self.act(self.fc1(hidden_states)))
        gate, value = self.fc1(hidden_states).chunk(2, dim=-1)  # each (..., ffn)
        return self.fc2(self.act(gate) * value)


class SineBertLayer(GradientCheckpointingLayer):
    """Attention and feed-forward sub-layers, each with a residual connection and LayerNorm (post- or pre-LN)."""

    def __init__(self, config: SineBertConfig, layer_idx: int):
        super().__init__()
        self.pre_norm = config.norm_placement == "pre"
        self.attention = SineBertAttention(config, layer_idx)
        self.attention_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps, bias=config.bias)
        self.mlp = SineBertMLP(config)
        self.mlp_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps, bias=config.bias)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        output_attentions: bool = False,
        rows: "LayerRows | None" = None,
        rotation: Rotation | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """hidden_states: `(batch, seq, hidden)`, or the `(n_rows, hidden)` rows of a padding-free batch (rotation:
        their tokens', for rotary attention). Where `rows` keeps only the rows a head reads (the last
        layer), the residual, norms and feed-forward network run on those alone and the layer returns
        `(n_read, hidden)`."""
        attended, weights = self.attention(
            self.attention_norm(hidden_states) if self.pre_norm else hidden_states, attention_mask, output_attentions,
            rows, rotation,
        )
        if rows is not None:
            hidden_states = rows.read(hidden_states)
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

    def attention_kernels(
        self, dtype: torch.dtype | None = None, input_shape: tuple[int, int] | None = None
    ) -> list[str]:
        """Per encoder layer, its attention and the kernel that runs it, e.g. `["full_attention via sdpa",
        "sliding_attention(window=128, global=[0]) via local_blocked (full attention up to 129 tokens, sdpa up to
        768)", ...]`, for layers computing in `dtype` (by default autocast's where it is on, else the weights') on the
        model's device, and inputs of `input_shape` (batch, seq), by default the shortest, under the grad mode of the
        call: bf16 full attention on a CPU runs "matmul" up to MATMUL_ATTENTION_MAX_SCORES scores, without a gradient
        only from MATMUL_ATTENTION_MIN_SCORES on and not on a CPU with AMX, and "sdpa" outside; on a GPU in bf16 or
        fp16 it runs "varlen" (unless it trains with attention dropout). Sliding-window layers run "local_blocked",
        "sdpa" over the band written out on inputs of at most `attention_sinebert.local_dense_limit` tokens, and full
        attention's kernel on the rows of inputs their window covers (`attention_sinebert.window_covers`): without
        `input_shape` they say all three. Raises ValueError where a layer has no kernel, exactly as a forward pass
        would."""
        device = self.device
        if dtype is None:
            dtype = self.base_model._compute_dtype(device)
        batch, seq = input_shape or (0, None)
        scores = batch * self.config.num_attention_heads * (seq or 0) ** 2
        packed = self.base_model._packed(device, dtype)
        return [layer.attention.kernel_description(device, dtype, scores, packed, seq)
                for layer in self.base_model.layers]

    def _init_weights(self, module: nn.Module):
        super()._init_weights(module)
        if isinstance(module, TokenLoss):
            init.constant_(module.running, math.inf)
        if isinstance(module, SineBertEmbeddings):
            positions = torch.arange(module.position_table.shape[0], device=module.position_table.device)
            init.copy_(module.position_table, sinusoidal_encoding(positions, self.config.hidden_size))
            if module.segment_match is not None:
                init.zeros_(module.segment_match)  # starts as the model without the feature
            if module.case_embeddings is not None:
                init.zeros_(module.case_embeddings)
        if isinstance(module, SineBertModel) and module.config.position_embedding_type == "rotary":
            init.copy_(module.rotary_table, module._rotary_table(module.rotary_table.device))

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
                if projection.bias is not None:
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


class SineBertModel(SineBertPreTrainedModel):
    """The bare encoder: `last_hidden_state` of shape `(batch, seq, hidden)`."""

    def __init__(self, config: SineBertConfig):
        super().__init__(config)
        self.embeddings = SineBertEmbeddings(config)
        self.layers = nn.ModuleList([SineBertLayer(config, i) for i in range(config.num_hidden_layers)])
        # Pre-LN leaves the residual stream unnormalised; the final LayerNorm gives heads a normalised input.
        pre = config.norm_placement == "pre"
        self.final_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps, bias=config.bias) if pre else None
        if config.position_embedding_type == "rotary":  # a cache, as the embeddings' position_table
            self.register_buffer("rotary_table", self._rotary_table(), persistent=False)
        self.post_init()

    def _rotary_table(self, device: torch.device | None = None) -> torch.Tensor:
        return Rotation.table(self.config.max_position_embeddings, self._head_dim, self.config.rope_theta, device)

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
        # Where every row goes, decided once: padded batches drop their padding before the layers, except under the
        # eager reference, which computes every position as written (its outputs at padding are not zeros).
        device, dtype = inputs.device, self._compute_dtype(inputs.device)
        layout = TokenLayout(self.config, attention_mask, output_mask, kept_tokens, position_ids, inputs.shape[:2],
                             device, dtype, output_hidden_states, self._packed(device, dtype),
                             self._rotary(dtype, inputs.shape[1], position_ids))
        hidden_states = layout.embed(self.embeddings, input_ids, token_type_ids, position_ids, inputs_embeds, case_ids)
        all_hidden_states, all_attentions, entered, dropping = [], [], None, layout.dropping
        for index, layer in enumerate(self.layers):
            if dropping and index == dropping[0]:
                entered, hidden_states = hidden_states, layout.drop(hidden_states)
            if output_hidden_states:
                state = hidden_states if entered is None else layout.restore(entered, hidden_states)
                all_hidden_states.append(layout.padded(state))
            mask = layout.mask(index, layer.attention.layer_type)
            rows, rotation = layout.rows(index), layout.rotation(index)
            hidden_states, weights = layer(hidden_states, mask, output_attentions, rows, rotation)
            all_attentions.append(weights)
            if dropping and index == dropping[-1]:
                hidden_states, entered = layout.restore(entered, hidden_states), None
        if self.final_norm is not None:
            hidden_states = self.final_norm(hidden_states)
        if output_hidden_states:
            all_hidden_states.append(layout.padded(hidden_states))
        return BaseModelOutput(
            last_hidden_state=layout.output(hidden_states),
            hidden_states=tuple(all_hidden_states) if output_hidden_states else None,
            attentions=tuple(all_attentions) if output_attentions else None,
        )

    def _packed(self, device: torch.device, dtype: torch.dtype) -> bool:
        """Whether full attention runs "varlen" on packed rows here (never while attention dropout is on)."""
        dropout = self.config.attention_probs_dropout_prob if self.training else 0.0
        if is_tracing():
            return False
        return packed_attention(self.config._attn_implementation, device, dtype, dropout)

    def _rotary(self, dtype: torch.dtype, seq_length: int, position_ids: torch.Tensor | None):
        """With rotary positions, what makes the `Rotation` of tokens at given positions in `dtype`; else None. Inputs
        of `seq_length` tokens without `position_ids` look their positions up in `rotary_table`, others compute them
        (positions given, which may lie past the table, or a traced graph, which must hold for any length)."""
        if self.config.position_embedding_type != "rotary":
            return None
        if not is_tracing() and position_ids is None and seq_length <= len(self.rotary_table):  # (no guard on it)
            return partial(Rotation.look_up, self.rotary_table, dtype=dtype)
        return partial(Rotation.of, head_dim=self._head_dim, theta=self.config.rope_theta, dtype=dtype)

    @property
    def _head_dim(self) -> int:
        return self.config.hidden_size // self.config.num_attention_heads

    def _compute_dtype(self, device: torch.device) -> torch.dtype:
        """The dtype the layers compute in: autocast's where it is on, else the weights'."""
        if torch.is_autocast_enabled(device.type):
            return torch.get_autocast_dtype(device.type)
        return self.embeddings.word_embeddings.weight.dtype


class SineBertPredictionHead(nn.Module):
    """The masked-LM transform before the tied decoder: dense -> activation -> LayerNorm."""

    def __init__(self, config: SineBertConfig):
        super().__init__()
        self.dense = SineBertLinear(config.hidden_size, config.hidden_size, bias=config.bias)
        self.act = ACT2FN[config.hidden_act]
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps, bias=config.bias)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.act(self.dense(hidden_states)))


class SineBertForMaskedLM(SineBertPreTrainedModel):
    _tied_weights_keys = {"decoder.weight": "sinebert.embeddings.word_embeddings.weight"}

    def __init__(self, config: SineBertConfig):
        super().__init__(config)
        self.sinebert = SineBertModel(config)
        self.head = SineBertPredictionHead(config)
        self.decoder = SineBertLinear(config.hidden_size, config.vocab_size)
        dropping_by_loss = config.token_dropping_layers is not None and config.token_dropping_policy == "loss"
        self.token_loss = TokenLoss(config.vocab_size) if dropping_by_loss else None
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
        dropping = self.training and labels is not None and self.config.token_dropping_layers is not None
        kept = self._tokens_to_keep(input_ids, attention_mask, labels) if dropping else None
        outputs = self.sinebert(
            input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds,
            output_attentions=output_attentions, output_hidden_states=output_hidden_states, case_ids=case_ids,
            output_mask=predicted, kept_tokens=kept,
        )
        hidden_states = outputs.last_hidden_state  # (batch, seq, hidden), or (num_predicted, hidden)
        predictions = fillers = 0
        if predicted is not None:  # the labels read, row-major; as many as the encoder's rows (no read of the device)
            predictions = hidden_states.shape[0]
            labels = labels.flatten()[nonzero(predicted, predictions)]
            dtype = self.sinebert._compute_dtype(hidden_states.device)
            hidden_states, labels, fillers = with_prediction_fillers(hidden_states, labels, self.config, dtype)
        logits = self.decoder(self.head(hidden_states))
        loss = None
        if labels is not None:
            labels = labels.reshape(-1)
            losses = vocabulary_cross_entropy(logits.reshape(-1, logits.shape[-1]), labels)  # (rows,), 0 where -100
            counted = labels != -100
            if dropping and self.token_loss is not None:
                self.token_loss.update(labels[counted], losses[counted])
            loss = losses.sum() / counted.sum()
        return MaskedLMOutput(
            loss=loss, logits=logits[:predictions] if fillers else logits, hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )

    def _tokens_to_keep(self, input_ids, attention_mask, labels) -> torch.Tensor:
        """Token dropping's kept tokens `(batch, seq)` under `config.token_dropping_policy`."""
        importance = None
        if self.config.token_dropping_policy == "loss":
            if self.token_loss is None:  # the config changed after the model was built without a table
                raise ValueError("token_dropping_policy='loss' needs the running-loss table, which a model gets when "
                                 "built with token_dropping_layers set; build it from a config that has both.")
            if input_ids is None:
                raise ValueError("token_dropping_policy='loss' ranks tokens by their ids: pass input_ids, not "
                                 "inputs_embeds, or use token_dropping_policy='random'.")
            importance = self.token_loss.running[input_ids]  # (batch, seq)
        return tokens_to_keep(labels != -100, attention_mask, self.config.token_dropping_keep, importance)


@dataclass
class SineBertForPreTrainingOutput(ModelOutput):
    """loss: mean binary cross-entropy over the labelled tokens; logits `(batch, seq)`: per token, the logit that it
    was replaced (ELECTRA's discriminator)."""

    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None


class SineBertDiscriminatorHead(nn.Module):
    """dense -> activation -> one logit per token."""

    def __init__(self, config: SineBertConfig):
        super().__init__()
        self.dense = SineBertLinear(config.hidden_size, config.hidden_size)
        self.act = ACT2FN[config.hidden_act]
        self.dense_prediction = SineBertLinear(config.hidden_size, 1)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.dense_prediction(self.act(self.dense(hidden_states))).squeeze(-1)  # (batch, seq)


class SineBertForPreTraining(SineBertPreTrainedModel):
    """The replaced-token-detection discriminator (ELECTRA, Clark et al., 2020): for every token, whether a generator
    replaced it. Its encoder is the one every other head loads."""

    def __init__(self, config: SineBertConfig):
        super().__init__(config)
        self.sinebert = SineBertModel(config)
        self.discriminator_head = SineBertDiscriminatorHead(config)
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
    ) -> SineBertForPreTrainingOutput:
        r"""
        labels (`torch.LongTensor` of shape `(batch, seq)`): 1 where the token was replaced, 0 where it is the
            original, -100 where it counts for nothing (padding).
        """
        outputs = self.sinebert(
            input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds,
            output_attentions=output_attentions, output_hidden_states=output_hidden_states, case_ids=case_ids,
        )
        logits = self.discriminator_head(outputs.last_hidden_state)  # (batch, seq)
        loss = None
        if labels is not None:
            counted = labels != -100
            loss = F.binary_cross_entropy_with_logits(logits[counted].float(), labels[counted].float())
        return SineBertForPreTrainingOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )


class SineBertForSequenceClassification(SineBertPreTrainedModel):
    """Pools the sequence (`config.classifier_pooling`), then dense + tanh, dropout and a linear classifier."""

    def __init__(self, config: SineBertConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.sinebert = SineBertModel(config)
        self.dense = SineBertLinear(config.hidden_size, config.hidden_size)
        dropout = config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob
        self.dropout = nn.Dropout(dropout)
        self.classifier = SineBertLinear(config.hidden_size, config.num_labels)
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
        if self.config.classifier_pooling != "cls" or is_tracing():
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
        self.classifier = SineBertLinear(config.hidden_size, config.num_labels)
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
    """Extractive QA: start and end logits over the tokens. Served by the `question-answering` pipeline that
    `import sinebert` registers and that the checkpoint carries (transformers 5 removed its own)."""

    def __init__(self, config: SineBertConfig):
        super().__init__(config)
        self.sinebert = SineBertModel(config)
        self.qa_outputs = SineBertLinear(config.hidden_size, 2)
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
    (SineBertForPreTraining, "AutoModelForPreTraining"),
    (SineBertForSequenceClassification, "AutoModelForSequenceClassification"),
    (SineBertForTokenClassification, "AutoModelForTokenClassification"),
    (SineBertForQuestionAnswering, "AutoModelForQuestionAnswering"),
):
    _cls.register_for_auto_class(_auto)

__all__ = [
    "SineBertPreTrainedModel",
    "SineBertModel",
    "SineBertForMaskedLM",
    "SineBertForPreTraining",
    "SineBertForSequenceClassification",
    "SineBertForTokenClassification",
    "SineBertForQuestionAnswering",
]
