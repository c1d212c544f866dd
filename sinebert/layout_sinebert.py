"""The padding-free layout of a batch: which rows the encoder's layers compute, built once per forward pass.

A padded `(batch, seq)` batch loses its padding before the layers (Portes et al., 2023, MosaicBERT; ModernBERT): the
embeddings, projections, feed-forward layers and LayerNorms run on the `(n_real + fillers, hidden)` rows of the real
tokens, so mixed-length batches spend no work on padding. Full attention runs on the rows packed one after another
("varlen", on a GPU) or on buckets of sequences of similar length (one bucket under torch.compile); sliding-window
attention puts the rows back into the padded batch, whose positions its windows count.
Two more choices of rows ride on the same layout: the last layer computes only the rows a head reads
(`output_mask`), and the layers of token dropping only the kept tokens (`kept_tokens`, Hou et al., 2022).

`modeling_sinebert.py` holds the model; this file only says where its rows go. Under the eager reference nothing is
unpadded: every position is computed as written, and token dropping is written out with masks. A model being
exported (`torch.export`, `torch.onnx.export`) takes that padded path with its implementation's kernels, since the
rows of a batch depend on its values and an exported graph may depend only on its shapes.
"""

import math
from collections.abc import Callable
from contextlib import contextmanager
from typing import NamedTuple

import torch
from torch import nn

from .attention_sinebert import (
    MATMUL_ATTENTION_MIN_SCORES,
    MATMUL_KEY_MULTIPLE,
    additive_mask,
    full_attention_kernel,
    is_tracing,
    local_attention_kernel,
    local_attention_mask,
    window_covers,
)

# A bucket of its own costs a kernel call and its copies, counted as the attention work of one sequence of 128 tokens:
# a batch is split only where that saves more. On the SST-2 dev batches of benchmarks/speed.py (2 CPU cores, bf16),
# costs of 64**2 to 192**2 and 2 to 4 buckets ran within 4% of each other, 128**2 among the fastest; in float32 all
# within 1%. Long inputs of mixed lengths still split, since their attention work grows with the square of the length.
BUCKET_COST = 128 * 128
MAX_BUCKETS = 4
# bf16 matrix products on a CPU (oneDNN) run slower when their rows are not a multiple of 16 and change from call to
# call, as the real-token counts of unpadded batches do: over 28 such counts from 950 to 1,139 a (rows, 256) x (256,
# 1024) product made 635 GFLOP/s, and 687 (counting only the real rows) with its rows rounded up to a multiple of 16
# (same command and machine; float32 is not affected). Unpadded bf16 batches therefore carry filler rows up to it,
# from FILLED_MIN_ROWS rows on: below them the rounding gained nothing over changing row counts and, at a fixed count,
# cost up to a fifth more time (20 rows rounded up to 32).
CPU_BF16_ROW_MULTIPLE = 16
FILLED_MIN_ROWS = 256

# The weight of a token id's running loss against its mean in the latest batch (token dropping by loss): about ten
# batches that predict the id make up its value, so it follows the loss as training lowers it. Not tuned.
TOKEN_LOSS_DECAY = 0.9


def padding_mask(attention_mask: torch.Tensor | None, padded: bool | None = None) -> torch.Tensor | None:
    """`(batch, seq)` 1/0 padding mask -> boolean `(batch, 1, 1, seq)`, or None when nothing is padded (which
    lets SDPA take its unmasked fast path; an exported graph always applies the mask). `padded`: whether anything
    is, where the caller has read it already; else it is read here."""
    if attention_mask is None:
        return None
    if attention_mask.dim() != 2:
        raise ValueError(
            f"attention_mask must have shape (batch, seq) with 1 for tokens and 0 for padding, got shape "
            f"{tuple(attention_mask.shape)}."
        )
    mask = attention_mask.bool()
    if is_tracing():
        return mask[:, None, None, :]
    if padded is None:
        padded = not bool(mask.all())
    return mask[:, None, None, :] if padded else None


def filler_count(rows: int, multiple: int) -> int:
    """Filler rows to put after `rows` real ones: up to a multiple of `multiple`, from FILLED_MIN_ROWS rows on."""
    return -rows % multiple if rows >= FILLED_MIN_ROWS else 0


def _filled_index(index: torch.Tensor, count: int, multiple: int) -> torch.Tensor:
    """`index` `(count,)` of rows -> `(count + fillers,)`: copies of its first row after it, up to `filler_count`."""
    fillers = filler_count(count, multiple)
    return torch.cat([index, index[:1].expand(fillers)]) if fillers else index


def _real(values: torch.Tensor, n_real: int) -> torch.Tensor:
    """`(n_real + fillers, ...)` -> `(n_real, ...)`: values itself where there are no fillers (the gradient of a slice
    is zeros around a copy)."""
    return values if len(values) == n_real else values[:n_real]


def _with_fillers(rows: int, *parts: torch.Tensor) -> torch.Tensor:
    """`(n_real, ...)`, whole or in parts one after another -> `(rows, ...)`, zeros at the fillers after them, in one
    copy."""
    fillers = rows - sum(len(part) for part in parts)
    if fillers:
        parts = (*parts, parts[0].new_zeros(fillers, *parts[0].shape[1:]))
    return torch.cat(parts) if len(parts) > 1 else parts[0]


def nonzero(mask: torch.Tensor, count: int) -> torch.Tensor:
    """The flattened indices `(count,)` of the `count` True places of `mask`, in row-major order."""
    return torch.nonzero_static(mask.flatten(), size=count).squeeze(-1)


class PaddedLayout(NamedTuple):
    """Where `n` rows go in a padded `(batch, seq)` grid: `slots`, their places in the flattened grid, and `padding`,
    the other places."""

    slots: torch.Tensor  # (n,)
    padding: torch.Tensor  # (batch * seq - n,)
    batch: int
    seq: int

    @classmethod
    def of(cls, real: torch.Tensor, count: int, slots: torch.Tensor | None = None) -> "PaddedLayout":
        """real: `(batch, seq)` bool, True at the `count` places where a row goes; the rows fill those places in
        row-major order unless `slots` gives another order. (The count, read from the device by the caller with
        the other sizes of the pass, spares `nonzero` a read of its own: on a GPU each is a wait.)"""
        if slots is None:
            slots = nonzero(real, count)
        return cls(slots, nonzero(~real, real.numel() - count), *real.shape)

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

    # Their rows in the `(n_real, ...)` layout of TokenRows: n_rows from first_row on. (Two ints, not a slice: under
    # torch.compile a slice of dynamic sizes would fix them to this batch's values.)
    first_row: int
    n_rows: int
    # (batch, k_seq) the row of `(n_real, ...)` at each place of the grid. Places past a sequence's end repeat a real
    # row of the bucket: they are masked as keys and dropped as queries, so nothing needs zeroing.
    grid: torch.Tensor
    q_seq: int
    # (batch, 1, 1, k_seq) True at real tokens, or None when every place is one; or, for the kernels that add a mask
    # as it is (SDPA, the matmul kernel), that mask made once for every layer: 0 at real tokens, the dtype's minimum
    # elsewhere (from a boolean one, SDPA makes it again in each call: three more operations a layer and bucket)
    mask: torch.Tensor | None
    slots: torch.Tensor  # (its rows,) the place of each of the bucket's rows in the grid's q_seq columns, flattened
    # Kernels that read strided heads (SDPA) take the grid's whole rows, which gather fastest: then both are None.
    # The matmul kernel needs each head contiguous, which one gather of rows of head_dim lays out: `head_rows` is the
    # row, in the fused projection `(rows, 3 * heads * head_dim)` viewed as `(rows * 3 * heads, head_dim)`, of each
    # head's query at the grid's first q_seq columns and of its key and its value at every place, in (batch, heads,
    # columns) order; and `head_slots` `(its rows * heads,)` the row of each of the bucket's rows and heads in the
    # output `(batch, heads, q_seq, head_dim)` viewed as `(-1, head_dim)`. (On SST-2 in bf16 a third of the time of
    # gathering whole rows and copying each head out; in fp32 twice the time of gathering whole rows.)
    head_rows: torch.Tensor | None
    head_slots: torch.Tensor | None

    @property
    def rows(self) -> slice:
        return slice(self.first_row, self.first_row + self.n_rows)


def attention_buckets(
    on_device: torch.Tensor, on_host: list[int], heads: int, key_multiple: int = 1,
    per_head: Callable[[int], bool] | None = None, mask_dtype: torch.dtype | None = None,
) -> tuple[AttentionBucket, ...]:
    """Splits sequences of lengths `on_device` `(batch,)` (longest first; their rows follow one another in that
    order; `on_host` the same as a list) into at most MAX_BUCKETS runs of equal count, as many as make the padded
    attention work, sum(batch * q_seq * k_seq), plus BUCKET_COST per bucket smallest; each bucket's keys are its
    longest rounded up to a multiple of `key_multiple`. Sequences without tokens join no bucket. Every tensor is
    made from `on_device` on its device: a copy of the list there would wait for the device as a read does. `heads`:
    the attention heads; `per_head`: whether the kernel of a bucket with so many scores (batch * heads * q_seq *
    k_seq) reads each head contiguous (`per_head_kernel`), which gives that bucket `head_rows` and `head_slots`
    (None: no bucket's does); `mask_dtype`: that of additive masks (`AttentionBucket.mask`), None for boolean ones."""
    lengths = [n for n in on_host if n]
    if not lengths:
        return ()

    def runs(count: int) -> list[list[int]]:
        size = -(-len(lengths) // count)
        return [lengths[i : i + size] for i in range(0, len(lengths), size)]

    def keys(run: list[int]) -> int:
        return _round_up(run[0], key_multiple)

    def cost(split: list[list[int]]) -> int:
        return sum(len(run) * run[0] * keys(run) + BUCKET_COST for run in split)

    splits = [runs(count) for count in range(1, MAX_BUCKETS + 1)]
    costs = [cost(split) for split in splits]  # (not min(key=...), which torch.compile warns about)
    buckets, start, first = [], 0, 0  # (first: the run's first sequence)
    for run in splits[costs.index(min(costs))]:
        full = run[-1] == keys(run)  # the shortest fills every key
        buckets.append(_bucket(on_device, start, first, len(run), run[0], sum(run), keys(run), full, heads, per_head,
                               mask_dtype))
        start, first = start + sum(run), first + len(run)
    return tuple(buckets)


def compiled_totals(counts: torch.Tensor) -> list[int]:
    """counts `(batch,)`, each row's real tokens -> [the tokens, the longest, the sequences with tokens]: all that
    the rows read of the batch under torch.compile (`one_bucket`), in one read."""
    return torch.stack([counts.sum(), counts.max(), counts.count_nonzero()]).tolist()


def one_bucket(
    on_device: torch.Tensor, sequences: int, longest: int, total: int, heads: int, key_multiple: int = 1,
    per_head: Callable[[int], bool] | None = None, mask_dtype: torch.dtype | None = None,
) -> tuple[AttentionBucket, ...]:
    """Every sequence in one bucket, from three totals: the sequences with tokens, the longest and the tokens. What
    `torch.compile` runs: choosing buckets from each length would make dynamo guard on every length and compile the
    pass again for each new batch; three sizes become dynamic after the first recompile."""
    if not sequences:
        return ()
    keys = _round_up(longest, key_multiple)
    return (_bucket(on_device, 0, 0, sequences, longest, total, keys, False, heads, per_head, mask_dtype),)


def _round_up(count: int, multiple: int) -> int:
    """`count` rounded up to a multiple of `multiple` (a bucket's keys: its longest, to `key_multiple`)."""
    return -(-count // multiple) * multiple


def _bucket(
    on_device: torch.Tensor, start: int, first: int, count: int, longest: int, total: int, keys: int, full: bool,
    heads: int, per_head: Callable[[int], bool] | None, mask_dtype: torch.dtype | None = None,
) -> AttentionBucket:
    """The bucket of the `count` sequences from `first` on (lengths `on_device`, longest first), whose `total` rows
    start at row `start`: a grid of `keys` columns, its queries the first `longest`; `full`: every sequence fills
    every key (no mask)."""
    # Each sequence's tokens move to the front of its row: full attention does not see positions (the sinusoids
    # were added to the embeddings), so where the padding was (left or right) does not matter.
    counts = on_device[first : first + count, None]  # (batch, 1)
    starts = start + counts.cumsum(0) - counts  # (batch, 1) the row of each sequence's first token
    columns = torch.arange(keys, device=on_device.device)  # (k_seq,)
    real = columns < counts  # (batch, k_seq)
    grid = torch.where(real, starts + columns, start)
    mask = None if full else real[:, None, None, :]
    if mask is not None and mask_dtype is not None:
        mask = additive_mask(mask, mask_dtype)
    row, column = torch.nonzero_static(real[:, :longest], size=total).unbind(1)  # (its rows,) each
    head_rows = head_slots = None
    if per_head is not None and per_head(count * heads * longest * keys):
        head = torch.arange(heads, device=on_device.device)
        queries = _head_rows(grid[:, :longest], 0, head)
        head_rows = torch.cat([queries, *(_head_rows(grid, part, head) for part in (1, 2))])  # then keys, values
        head_slots = ((row[:, None] * heads + head) * longest + column[:, None]).flatten()  # (its rows, heads)
    return AttentionBucket(start, total, grid, longest, mask, row * longest + column, head_rows, head_slots)


def _head_rows(grid: torch.Tensor, part: int, head: torch.Tensor) -> torch.Tensor:
    """`(batch, columns)` rows of tokens -> `(batch * heads * columns,)` rows of their part (0 query, 1 key, 2 value)
    of each head (`head`: `arange(heads)`) in the fused projection viewed as `(rows * 3 * heads, head_dim)`, in (batch,
    heads, columns) order."""
    return ((grid[:, None] * 3 + part) * len(head) + head[:, None]).flatten()


class Packing(NamedTuple):
    """The sequences' boundaries in rows packed one after another, for the "varlen" kernel."""

    cu_seq_lens: torch.Tensor  # (sequences + 1,) int32: sequence i holds rows cu_seq_lens[i]:cu_seq_lens[i + 1]
    max_length: int

    def kwargs(self) -> dict:
        """The kernel's keyword arguments, named as transformers names those of packed sequences."""
        return dict(cu_seq_lens_q=self.cu_seq_lens, cu_seq_lens_k=self.cu_seq_lens, max_length_q=self.max_length,
                    max_length_k=self.max_length)


class TokenRows(NamedTuple):
    """Where the real tokens of a padded `(batch, seq)` batch sit once the padding is taken out.

    The rows hold the sequences longest first, one after another. Full attention runs either on them as they are
    (`packing`, for the "varlen" kernel) or on `buckets` of similar length, each padded only to about its own
    longest; `layout` puts the rows back into the `(batch, seq)` batch. After the real tokens' rows may come filler
    rows, copies of the first, up to a multiple of `row_multiple` rows: every layer computes them, but no token
    attends to them and no output keeps them.
    """

    layout: PaddedLayout  # of the real tokens' rows in the batch
    buckets: tuple[AttentionBucket, ...]  # empty where packed
    rows: torch.Tensor  # (n_real + fillers,) the place in the flattened batch each row comes from
    packing: Packing | None = None

    @classmethod
    def from_mask(
        cls, attention_mask: torch.Tensor, heads: int, key_multiple: int = 1, row_multiple: int = 1,
        packed: bool = False, lengths: list[int] | None = None, per_head: Callable[[int], bool] | None = None,
        mask_dtype: torch.dtype | None = None, totals: list[int] | None = None,
    ) -> "TokenRows":
        """`key_multiple`: the buckets' keys are rounded up to a multiple of it (see `attention_buckets`);
        `row_multiple`: the rows, with fillers, where there are at least FILLED_MIN_ROWS; `packed`: the sequences'
        boundaries instead of buckets; `lengths`: each row's count of True places where the caller has read them
        (else they are read here: every size below comes from that one read; under torch.compile `totals`,
        `one_bucket`'s, read here where not given); `heads`, `per_head` and `mask_dtype`: as `attention_buckets`
        takes them."""
        real = attention_mask.bool()
        counts = real.sum(1)  # (batch,)
        order = torch.argsort(counts, descending=True, stable=True)
        sorted_lengths = counts[order]  # (batch,) longest first
        compiling = torch.compiler.is_compiling()
        if compiling:  # three totals, one bucket (see `one_bucket`)
            n_real, longest, sequences = compiled_totals(counts) if totals is None else totals
        else:
            on_host = sorted(counts.tolist() if lengths is None else lengths, reverse=True)
            n_real, longest, sequences = sum(on_host), on_host[0] if on_host else 0, sum(1 for n in on_host if n)
        positions = order[:, None] * real.shape[1] + torch.arange(real.shape[1], device=real.device)  # (batch, seq)
        layout = PaddedLayout.of(real, n_real, slots=positions.flatten()[nonzero(real[order], n_real)])
        rows = _filled_index(layout.slots, n_real, row_multiple)
        if packed:
            # The sequences without tokens left out.
            cu_seq_lens = torch.nn.functional.pad(sorted_lengths[:sequences].cumsum(0), (1, 0)).to(torch.int32)
            return cls(layout, (), rows, Packing(cu_seq_lens, longest))
        if compiling:
            buckets = one_bucket(sorted_lengths, sequences, longest, n_real, heads, key_multiple, per_head, mask_dtype)
        else:
            buckets = attention_buckets(sorted_lengths, on_host, heads, key_multiple, per_head, mask_dtype)
        return cls(layout, buckets, rows)

    @property
    def n_real(self) -> int:
        return len(self.layout.slots)

    def unpad(self, values: torch.Tensor) -> torch.Tensor:
        """`(batch, seq, ...)` -> `(n_real + fillers, ...)`."""
        return values.flatten(0, 1).index_select(0, self.rows)

    def pad(self, values: torch.Tensor) -> torch.Tensor:
        """`(n_real + fillers, ...)` -> `(batch, seq, ...)`, zeros at the padding; the fillers are dropped."""
        return self.layout.pad(self.real(values))

    def real(self, values: torch.Tensor) -> torch.Tensor:
        """`(n_real + fillers, ...)` -> `(n_real, ...)`."""
        return _real(values, self.n_real)

    def with_fillers(self, *parts: torch.Tensor) -> torch.Tensor:
        """`(n_real, ...)`, whole or in parts one after another -> `(n_real + fillers, ...)`, zeros at the fillers."""
        return _with_fillers(len(self.rows), *parts)

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


class QueryRows(NamedTuple):
    """The rows a head reads, which alone the last layer computes: `index` into the rows of its input, then filler
    rows up to a row multiple as TokenRows has them (the masked-LM head reads a new count of rows each batch), and
    `layout`, the rows read as queries in a `(batch, queries)` grid, each sequence's in its own row."""

    index: torch.Tensor  # (n_read + fillers,)
    layout: PaddedLayout

    @classmethod
    def from_mask(cls, output_mask: torch.Tensor, tokens: TokenRows | None, n_read: int, most: int,
                  row_multiple: int = 1) -> "QueryRows":
        """`n_read` and `most`: the count of places read, and the most in one row, read by the caller
        (`_check_token_mask`); `row_multiple`: as `TokenRows.from_mask` takes it (none under torch.compile, where
        the count is a size of the graph)."""
        read = output_mask.bool()
        counts = read.sum(1)  # (batch,)
        positions = nonzero(read, n_read)  # (n_read,) in the flattened batch, row-major
        queries = torch.arange(most, device=read.device) < counts[:, None]  # (batch, most)
        index = positions if tokens is None else tokens.rows_of(positions)
        if not torch.compiler.is_compiling():
            index = _filled_index(index, n_read, row_multiple)
        return cls(index, PaddedLayout.of(queries, n_read))

    @property
    def n_read(self) -> int:
        return len(self.layout.slots)

    def real(self, values: torch.Tensor) -> torch.Tensor:
        """`(n_read + fillers, ...)` -> `(n_read, ...)`."""
        return _real(values, self.n_read)

    def with_fillers(self, values: torch.Tensor) -> torch.Tensor:
        """`(n_read, ...)` -> `(n_read + fillers, ...)`, zeros at the fillers."""
        return _with_fillers(len(self.index), values)


class LayerRows(NamedTuple):
    """What one layer computes on a padding-free batch: the `tokens` whose rows it gets (None: the padded batch),
    the `queries` it keeps (the last layer's rows a head reads, or None for every row), and whether it is `full`
    attention on this batch (a full-attention layer, or a sliding window that covers every sequence); a sliding
    window that does not attends on the padded batch."""

    tokens: TokenRows | None
    queries: QueryRows | None
    full: bool = True

    def attend(self, attention: torch.nn.Module, hidden_states: torch.Tensor, mask: torch.Tensor | None,
               output_attentions: bool = False, rotation=None) -> torch.Tensor:
        """The heads' outputs of `attention` (a SineBertAttention) before its output projection, `(rows, hidden)`:
        every row is a key and a value, and the rows of `queries` (all where None) are the queries. No kernel of a
        padding-free batch returns weights, so `output_attentions` only makes the kernel say so. `rotation`: the
        rows' tokens' (`TokenLayout.rotation`), for rotary attention."""
        full = self.full
        packed = self.tokens is not None and self.tokens.packing is not None
        if self.queries is not None and full and not packed:  # (packed: every row is a query, the rows read kept)
            return self._attend_queries(attention, hidden_states, mask, output_attentions, rotation)
        qkv = attention.qkv_proj(hidden_states)  # (n_real + fillers, 3 * hidden) or (batch, seq, 3 * hidden)
        if self.tokens is None:
            output, _ = attention.attend_padded(qkv, mask, output_attentions, rotation)
            return self.read(output)
        qkv = attention.rotate(qkv, rotation)  # (the rows' queries and keys turned, in the rows' layout)
        if full and not packed:  # (n_real + fillers, hidden)
            output = self.tokens.with_fillers(*self._attend_buckets(attention, qkv, output_attentions))
        elif full:
            output = self.tokens.with_fillers(self._attend_packed(attention, qkv, output_attentions))
        else:  # sliding windows need the batch's own positions; padding keys are masked
            output, _ = attention.attend_padded(self.tokens.pad(qkv), mask, output_attentions)
            output = self.tokens.with_fillers(self.tokens.layout.unpad(output))
        return self.read(output)  # (n_read + fillers, hidden) where only the rows read are kept

    def read(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """The rows of `queries` of any rows or padded batch, `(n_read + fillers, hidden)`; everything where it is
        None (a layer's residual stream is its input, or only the rows a head reads in the last layer)."""
        if self.queries is None:
            return hidden_states
        return hidden_states.reshape(-1, hidden_states.shape[-1]).index_select(0, self.queries.index)

    def _attend_packed(self, attention: torch.nn.Module, qkv: torch.Tensor, output_attentions: bool) -> torch.Tensor:
        """qkv: `(n_real + fillers, 3 * hidden)` -> `(n_real, hidden)`, full attention within each sequence in one
        kernel call on the rows as they are."""
        n_real = self.tokens.n_real
        # (n_real, 3 * hidden) -> 3 x (1, heads, n_real, head_dim): one row holding every sequence
        grid = self.tokens.real(qkv).view(1, n_real, 3, attention.num_heads, attention.head_dim)
        query, key, value = grid.permute(2, 0, 3, 1, 4).unbind(0)
        output, _ = attention.attend(
            query, key, value, None, output_attentions, full=True, **self.tokens.packing.kwargs()
        )
        return output.squeeze(0).flatten(1)  # (1, n_real, heads, head_dim) -> (n_real, hidden)

    def _attend_buckets(self, attention: torch.nn.Module, qkv: torch.Tensor, output_attentions: bool) -> list:
        """qkv: `(n_real + fillers, 3 * hidden)` -> the `(n_real, hidden)` rows in parts, one per bucket, in order:
        full attention within each bucket."""
        heads, head_dim = attention.num_heads, attention.head_dim
        parts = []
        for bucket in self.tokens.buckets:
            batch = len(bucket.grid)
            per_head = bucket.head_rows is not None  # (the layout asked the kernel for the bucket's size)
            query, key, value = (_gather_heads if per_head else _gather_rows)(qkv, bucket, heads, head_dim)
            attended, _ = attention.attend(  # every sequence of a bucket has a token, which every query sees
                query, key, value, bucket.mask, output_attentions, full=True, every_query_has_a_key=True
            )  # (batch, q_seq, heads, head_dim): a view of (batch, heads, q_seq, head_dim) for per-head inputs
            if per_head:
                output = attended.transpose(1, 2).reshape(-1, head_dim).index_select(0, bucket.head_slots)
            else:
                output = attended.reshape(batch * bucket.q_seq, -1).index_select(0, bucket.slots)
            parts.append(output.view(-1, heads * head_dim))  # (its rows, hidden)
        return parts or [qkv.new_zeros(0, qkv.shape[-1] // 3)]

    def _attend_queries(self, attention: torch.nn.Module, hidden_states: torch.Tensor, mask: torch.Tensor | None,
                        output_attentions: bool, rotation) -> torch.Tensor:
        """Full attention with only the rows read as queries -> `(n_read + fillers, hidden)`: the query projection
        runs on those rows alone."""
        hidden, heads, head_dim = attention.out_proj.in_features, attention.num_heads, attention.head_dim
        weight, bias = attention.qkv_proj.weight, attention.qkv_proj.bias  # (3 * hidden, hidden): query, key, value
        query_bias, key_value_bias = (None, None) if bias is None else (bias[:hidden], bias[hidden:])
        index = self.queries.real(self.queries.index)  # (n_read,): the fillers join after attention
        read = hidden_states.reshape(-1, hidden_states.shape[-1]).index_select(0, index)  # (n_read, hidden)
        query = torch.nn.functional.linear(read, weight[:hidden], query_bias)
        key_value = torch.nn.functional.linear(hidden_states, weight[hidden:], key_value_bias)  # every token
        query = self.queries.layout.pad(query)  # (batch, queries, hidden)
        if self.tokens is not None:
            key_value = self.tokens.pad(key_value)  # (batch, seq, 2 * hidden); padding keys are masked
        batch, seq = key_value.shape[:2]
        query = query.view(batch, -1, heads, head_dim).transpose(1, 2)  # (batch, heads, queries, head_dim)
        key, value = key_value.view(batch, seq, 2, heads, head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        if rotation is not None:  # turned on the grids, into the layout the kernel takes (zeros at the padding)
            query = _padded(rotation.select(index), self.queries.layout.pad).turn_heads(query[None])
            key = (rotation if self.tokens is None else _padded(rotation, self.tokens.pad)).turn_heads(key[None])
            query, key = query.squeeze(0), key.squeeze(0)  # (views: select's gradient is zeros around a copy)
        # (batch, queries, heads, head_dim)
        output, _ = attention.attend(query, key, value, mask, output_attentions, full=True)
        return self.queries.with_fillers(self.queries.layout.unpad(output).flatten(1))  # (n_read + fillers, hidden)


def _gather_rows(qkv: torch.Tensor, bucket: AttentionBucket, heads: int, head_dim: int) -> tuple[torch.Tensor, ...]:
    """A bucket's query, key and value `(batch, heads, q_seq or k_seq, head_dim)` from the rows `(rows, 3 * hidden)`:
    one gather of whole rows onto the grid (no zeroing, as places past a sequence's end hold a real row), then
    strided views of each head."""
    batch, k_seq = bucket.grid.shape
    grid = qkv.index_select(0, bucket.grid.flatten()).view(batch, k_seq, 3, heads, head_dim)
    query, key, value = grid.permute(2, 0, 3, 1, 4).unbind(0)
    return query[:, :, : bucket.q_seq], key, value


def _gather_heads(qkv: torch.Tensor, bucket: AttentionBucket, heads: int, head_dim: int) -> tuple[torch.Tensor, ...]:
    """The same as `_gather_rows`, each head contiguous: one gather of rows of head_dim."""
    batch, k_seq = bucket.grid.shape
    gathered = qkv.view(-1, head_dim).index_select(0, bucket.head_rows)  # (queries + 2 * batch * heads * k_seq, hd)
    queries = batch * heads * bucket.q_seq
    key, value = gathered[queries:].view(2, batch, heads, k_seq, head_dim).unbind(0)
    return gathered[:queries].view(batch, heads, bucket.q_seq, head_dim), key, value


def _padded(rotation, pad):
    """A rotation of rows `(n, 1, head_dim)` -> that of the `(batch, seq)` grid `pad` puts them in, zeros at the
    padding: `(batch, seq, 1, head_dim)`."""
    return rotation._make(pad(table) for table in rotation)


def tokens_to_keep(predicted: torch.Tensor, attention_mask: torch.Tensor | None, keep: float,
                   importance: torch.Tensor | None = None) -> torch.Tensor:
    """`(batch, seq)` bool, the tokens that token dropping's layers compute: every `predicted` one and as many others
    as make up `keep` of each sequence's tokens (rounded up): those of the highest `importance` `(batch, seq)`, ties
    (every token, without it) in random order."""
    real = torch.ones_like(predicted) if attention_mask is None else attention_mask.bool()
    predicted = predicted & real
    # Predicted tokens rank first (+inf), then by importance (finite: an infinite one must not tie with them),
    # padding last (-inf).
    score = torch.zeros(predicted.shape, device=predicted.device) if importance is None else \
        importance.float().nan_to_num(posinf=torch.finfo(torch.float32).max)
    score = torch.where(predicted, math.inf, torch.where(real, score, -math.inf))
    shuffled = torch.rand(predicted.shape, device=predicted.device).argsort(1)  # (batch, seq) positions
    # A stable sort of the shuffled positions by score: equal scores stay in random order.
    ranked = shuffled.gather(1, score.gather(1, shuffled).argsort(dim=1, descending=True, stable=True))
    counts = torch.maximum((real.sum(1) * keep).ceil().long(), predicted.sum(1))  # (batch,)
    in_share = torch.arange(predicted.shape[1], device=predicted.device)[None] < counts[:, None]  # (batch, seq)
    return torch.zeros_like(predicted).scatter(1, ranked, in_share)


class TokenLoss(nn.Module):
    """The running masked-LM loss of each vocabulary id, the importance by which token dropping's "loss" policy
    keeps tokens (Hou et al., 2022). A buffer, saved with the weights so that a resumed run ranks as the one it
    continues; +inf for ids never predicted yet (the special tokens stay there), which rank first."""

    def __init__(self, vocab_size: int):
        super().__init__()
        self.register_buffer("running", torch.full((vocab_size,), math.inf))
        self.counting = True  # False within `paused`

    @contextmanager
    def paused(self):
        """Batches seen within it leave the table as it is: a batch trained again to keep the processes in step
        (streaming shards that ran out unevenly) must not weigh twice. The update still joins the processes' sum."""
        self.counting = False
        try:
            yield
        finally:
            self.counting = True

    @torch.no_grad()
    def update(self, ids: torch.Tensor, losses: torch.Tensor):
        """Fold in the losses `(n,)` of the predicted ids `(n,)`: each id's mean over the batch of every process
        (summed across processes, so that they keep one table), then an exponential average with TOKEN_LOSS_DECAY.
        Non-finite losses are left out: a step skipped for them (`--nonfinite_loss skip`) must not make the table NaN
        for good."""
        losses = losses.detach().float()
        weights = losses.isfinite().float() * self.counting  # (n,): 0 leaves a loss out, without a read of the device
        totals = torch.zeros(2, self.running.numel(), device=self.running.device)  # (sum, count) per id
        totals[0].index_add_(0, ids, torch.where(weights > 0, losses, 0.0))
        totals[1].index_add_(0, ids, weights)
        if torch.distributed.is_available() and torch.distributed.is_initialized() \
                and torch.distributed.get_world_size() > 1:
            torch.distributed.all_reduce(totals)
        seen = totals[1] > 0
        mean, old = totals[0][seen] / totals[1][seen], self.running[seen]
        self.running[seen] = torch.where(old.isinf(), mean, TOKEN_LOSS_DECAY * old + (1 - TOKEN_LOSS_DECAY) * mean)


def unpadded_multiples(attn_implementation: str, device: torch.device, dtype: torch.dtype) -> tuple[int, int]:
    """(key_multiple, row_multiple) of `TokenRows.from_mask` for layers computing in `dtype` on `device`:
    MATMUL_KEY_MULTIPLE where full attention runs the matmul kernel (on buckets of some size) and
    CPU_BF16_ROW_MULTIPLE for the projections, both for bf16 on a CPU only, else 1."""
    if device.type != "cpu" or dtype != torch.bfloat16:
        return 1, 1
    matmul = full_attention_kernel(attn_implementation, device, dtype, MATMUL_ATTENTION_MIN_SCORES) == "matmul"
    return MATMUL_KEY_MULTIPLE if matmul else 1, CPU_BF16_ROW_MULTIPLE


def with_prediction_fillers(hidden_states: torch.Tensor, labels: torch.Tensor, config, dtype: torch.dtype
                            ) -> tuple[torch.Tensor, torch.Tensor, int]:
    """The rows a masked-LM head predicts `(n, hidden)` and their labels `(n,)` -> the same with filler rows (zeros,
    labelled -100) up to the row multiple of `unpadded_multiples`, and how many, so that the head's products take
    rows of the multiple that the last layer's took (`QueryRows`); none under the eager reference or in a traced or
    compiled graph."""
    if config._attn_implementation == "eager" or is_tracing() or torch.compiler.is_compiling():
        return hidden_states, labels, 0
    multiple = unpadded_multiples(config._attn_implementation, hidden_states.device, dtype)[1]
    fillers = filler_count(len(labels), multiple)
    if fillers:
        hidden_states = _with_fillers(len(labels) + fillers, hidden_states)
        labels = torch.cat([labels, labels.new_full((fillers,), -100)])
    return hidden_states, labels, fillers


def per_head_kernel(attn_implementation: str, device: torch.device, dtype: torch.dtype) -> Callable[[int], bool]:
    """`per_head` of `attention_buckets` for layers computing in `dtype` on `device`: whether full attention over so
    many scores runs the matmul kernel, which reads each head contiguous."""
    return lambda scores: full_attention_kernel(attn_implementation, device, dtype, scores) == "matmul"


class TokenLayout:
    """Everything a forward pass decides about its rows, once: the attention masks of the padded batch (keyed by
    layer type, as transformers keys them), the rows of the real tokens, the rows of token dropping's layers and the
    rows the last layer keeps. `SineBertModel.forward` asks it for each layer's mask and rows.

    The fast path (every attn_implementation but the reference "eager") unpads a padded batch; the reference computes
    every position, drops tokens by masking them as keys, and selects the rows read after the last layer.
    """

    def __init__(self, config, attention_mask, output_mask, kept_tokens, position_ids, shape, device, dtype,
                 output_hidden_states, packed: bool = False, rotary=None):
        """`packed`: full attention runs "varlen" (`attention_sinebert.packed_attention`); then every batch is
        packed, padded or not, so that what runs is what is reported. `rotary`: with rotary positions, what makes the
        rotation of tokens at given positions (`modeling_sinebert.Rotation.of`), else None."""
        self.rotary, self.rotations = rotary, {}  # one rotation per set of rows: every row, and the kept ones
        if rotary is not None:  # (batch, seq)
            grid = torch.arange(shape[1], device=device)[None] if position_ids is None else position_ids
            self.position_grid = grid.expand(shape)
        fast = config._attn_implementation != "eager" and not is_tracing()
        rows = None  # TokenRows.from_mask's settings for this pass (None: the reference keeps the padded batch)
        if fast:
            implementation = config._attn_implementation
            key_multiple, row_multiple = unpadded_multiples(implementation, device, dtype)
            rows = dict(key_multiple=key_multiple, row_multiple=row_multiple, packed=packed,
                        per_head=per_head_kernel(implementation, device, dtype),
                        mask_dtype=dtype if implementation == "sdpa" else None)  # (its kernels add masks as they are)
        # Each row's count of real tokens: the one read of the attention mask, for the padding mask and the rows. Under
        # torch.compile, which would guard on every length, three totals instead (`one_bucket`).
        lengths = [shape[1]] * shape[0] if attention_mask is None else None
        totals = padded = None
        if attention_mask is not None and attention_mask.dim() == 2 and not is_tracing():
            counts = attention_mask.bool().sum(1)
            if torch.compiler.is_compiling():
                totals = compiled_totals(counts)
                padded = totals[0] < shape[0] * shape[1]
            else:
                lengths = counts.tolist()
        if lengths is not None:
            padded = any(n < shape[1] for n in lengths)
        # Sliding windows that reach every key of the longest sequence are full attention on this batch.
        longest = shape[1] if lengths is None else max(lengths, default=0)
        self.windows_cover = "sliding_attention" in config.layer_types and window_covers(
            config._attn_implementation, config.sliding_window, longest
        )
        self.layer_types = config.layer_types
        self.masks = self._masks(config, attention_mask, shape[1], device, dtype, padded, self.windows_cover)
        self.packed = packed
        self.tokens = None
        if self.packed or fast and self.masks["full_attention"] is not None:
            real = attention_mask if attention_mask is not None else torch.ones(shape, dtype=torch.bool, device=device)
            self.tokens = TokenRows.from_mask(real, config.num_attention_heads, lengths=lengths, totals=totals, **rows)
        self.queries = self.output_mask = None
        if output_mask is not None:
            read = _check_token_mask("output_mask", output_mask, attention_mask, shape, "The positions to read "
                                     "(output_mask, or masked-LM labels other than -100) include padding "
                                     "(attention_mask 0); read real tokens only.", per_row=False)
            self.output_mask = output_mask.bool()
            if fast and not output_hidden_states:
                self.queries = QueryRows.from_mask(output_mask, self.tokens, *read, rows["row_multiple"])
        self.dropping = ()  # the layers of token dropping
        if kept_tokens is not None:
            self._drop(config, kept_tokens.bool(), attention_mask, shape, rows)
        self.last_layer = config.num_hidden_layers - 1

    @staticmethod
    def _masks(config, attention_mask: torch.Tensor | None, seq: int, device: torch.device, dtype: torch.dtype,
               padded: bool | None, windows_cover: bool) -> dict:
        """The padding mask `(batch, 1, 1, seq)` (or None) for full attention; for sliding-window layers the
        written-out band `(batch or 1, 1, seq, seq)`, boolean under the eager reference and additive for SDPA (made
        once for every layer), else the padding mask, from which the blocked kernel builds its O(seq * window) masks,
        and where the windows cover every sequence (`windows_cover`) full attention's. `padded`: whether any place
        is padding, if read already."""
        padding = padding_mask(attention_mask, padded)
        masks = {"full_attention": padding, "sliding_attention": padding}
        if "sliding_attention" in config.layer_types and not windows_cover:
            # (raises where there is none)
            kernel = local_attention_kernel(config._attn_implementation, seq, config.sliding_window, device, dtype)
            if kernel in ("eager", "sdpa"):
                band = local_attention_mask(seq, config.sliding_window, config.global_attention_positions, padding,
                                            device)
                # (under sdpa, queries with no key in reach, at padding, get finite weights, then dropped)
                masks["sliding_attention"] = additive_mask(band, dtype) if kernel == "sdpa" else band
        return masks

    def _drop(self, config, kept: torch.Tensor, attention_mask, shape, rows: dict | None):
        if config.token_dropping_layers is None:
            raise ValueError("kept_tokens needs config.token_dropping_layers, the layers that compute only them.")
        # Checked here, not in the config: a checkpoint pretrained with token dropping may be read with windows.
        local = [i for i in config.token_dropping_range if config.layer_types[i] != "full_attention"]
        if local:
            raise ValueError(
                f"token_dropping_layers={list(config.token_dropping_layers)} includes sliding-window layers "
                f"{local}, whose windows count positions that dropping tokens would shift; drop tokens in "
                "full-attention layers only (or set token_dropping_layers=None)."
            )
        counts = _check_token_mask("kept_tokens", kept, attention_mask, shape,
                                   "kept_tokens includes padding (attention_mask 0); keep real tokens only.")
        self.dropping, self.kept = tuple(config.token_dropping_range), kept
        self.kept_rows = self.kept_index = None  # under the reference the kept tokens are a mask
        if rows is not None:
            self.kept_rows = TokenRows.from_mask(kept, config.num_attention_heads, lengths=counts, **rows)
            kept_rows = self.kept_rows.rows
            # (n_kept + fillers,)
            self.kept_index = kept_rows if self.tokens is None else self.tokens.rows_of(kept_rows)

    def embed(self, embeddings, input_ids, token_type_ids, position_ids, inputs_embeds, case_ids) -> torch.Tensor:
        """The embeddings of the rows the first layer computes: `(n_real + fillers, hidden)` on the fast path, else
        `(batch, seq, hidden)`."""
        inputs = input_ids, token_type_ids, position_ids, inputs_embeds, case_ids
        if self.tokens is None:
            return embeddings(*inputs)
        if embeddings.segment_match is not None or torch.compiler.is_compiling():
            # Cross-segment matches need the batch's own rows. (Nor under torch.compile: with freezing and dynamic
            # shapes, torch 2.13's inductor generates code for the real-token path that names an undefined size.)
            return self.tokens.unpad(embeddings(*inputs))
        return embeddings(*self.tokens.real_tokens(*inputs)).squeeze(0)  # the rows, embedded as one sequence

    def mask(self, index: int, layer_type: str) -> torch.Tensor | None:
        """The attention mask of layer `index`, of `layer_type`."""
        if index in self.dropping and self.kept_rows is None:
            return self.kept[:, None, None, :]  # the reference: dropped tokens are no keys
        return self.masks[layer_type]

    def rows(self, index: int) -> LayerRows | None:
        """The rows layer `index` computes, or None for the padded batch (every position)."""
        tokens = self.kept_rows if index in self.dropping else self.tokens
        queries = self.queries if index == self.last_layer else None
        full = self.layer_types[index] == "full_attention" or self.windows_cover
        return None if tokens is None and queries is None else LayerRows(tokens, queries, full)

    def rotation(self, index: int):
        """With rotary positions, the rotation of the tokens whose rows layer `index` computes (of the padded batch's
        `(batch, seq)` grid or of `(rows,)`), made once for every layer that computes the same rows; else None."""
        if self.rotary is None:
            return None
        dropping = index in self.dropping
        if dropping not in self.rotations:
            tokens = self.kept_rows if dropping else self.tokens
            grid = self.position_grid  # (batch, seq)
            positions = grid if tokens is None else grid.reshape(-1).index_select(0, tokens.rows)  # (rows,)
            self.rotations[dropping] = self.rotary(positions)
        return self.rotations[dropping]

    def drop(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """The states entering the first dropping layer -> its input: the kept tokens' rows on the fast path."""
        if self.kept_rows is None:
            return hidden_states
        return hidden_states.reshape(-1, hidden_states.shape[-1]).index_select(0, self.kept_index)

    def restore(self, entered: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        """`entered` (the states before the first dropping layer) with the kept tokens' states replaced by
        `hidden_states`, those after the last dropping layer (or within them, for `output_hidden_states`)."""
        if self.kept_rows is None:
            return torch.where(self.kept[..., None], hidden_states, entered)
        n_kept, width = self.kept_rows.n_real, entered.shape[-1]
        flat = entered.reshape(-1, width).index_copy(0, self.kept_index[:n_kept], hidden_states[:n_kept])
        return flat.view_as(entered)

    def padded(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """Rows of every real token -> `(batch, seq, hidden)`, zeros at the padding."""
        return hidden_states if self.tokens is None else self.tokens.pad(hidden_states)

    def output(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """The last layer's rows -> `last_hidden_state`: `(batch, seq, hidden)`, or `(n_read, hidden)` in row-major
        order of `output_mask` where one was given."""
        if self.queries is not None:
            return self.queries.real(hidden_states)  # the last layer computed the rows read, in that order
        hidden_states = self.padded(hidden_states)
        if self.output_mask is not None:  # every position computed, then selected
            return hidden_states[self.output_mask]
        return hidden_states


def _check_token_mask(name: str, mask: torch.Tensor, attention_mask: torch.Tensor | None, shape, on_padding: str,
                      per_row: bool = True) -> list[int] | None:
    """`mask`, the `(batch, seq)` input `name`, has the input's `shape` and is True at real tokens only (else
    ValueError(`on_padding`)). Returns each row's count of True places, or with `per_row=False` only their sum and the
    largest, read from the device with the check (None in an exported graph, which cannot branch on values). Under
    torch.compile each number read becomes a size of the graph after the read: a count per row would make inductor
    guard on their order and compile again for each new order."""
    if mask.shape != shape:
        raise ValueError(
            f"{name} must have the shape of the input, (batch, seq) = {tuple(shape)}, got {tuple(mask.shape)}."
        )
    if is_tracing():
        return None
    mask = mask.bool()
    counts = mask.sum(1)  # (batch,)
    if not per_row:
        counts = torch.stack([counts.sum(), torch.cat([counts.new_zeros(1), counts]).max()])  # (2,): an empty batch too
    if attention_mask is None:  # no padding to check
        return counts.tolist()
    on_padding_places = (mask & ~attention_mask.bool()).sum()
    *counts, on_padding_places = torch.cat([counts, on_padding_places[None]]).tolist()  # one read
    if on_padding_places:
        raise ValueError(on_padding)
    return counts
