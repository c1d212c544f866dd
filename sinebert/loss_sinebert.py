"""The masked-LM head's cross-entropy over the vocabulary, computed in float32 chunk by chunk.

`F.cross_entropy(logits.float(), labels)` on bf16 logits of a pretraining step (about 600 rows x 16,000 words) makes
six full passes of float32 logits: the cast, log-softmax and, backward, the zeroed gradient of the picked entries,
log-softmax's gradient and the cast back. Here each chunk of rows is cast, reduced and, backward, turned into its
gradient while it is in cache, and only the logits' own dtype is written out: forward and backward together took 27
against 88 ms for bf16 logits of 614 x 16,000, and 26 against 51 ms for float32 (one thread of an AMD EPYC, torch
2.13). In whole bf16 pretraining steps of the cram's model, 311 against 342 ms (docs/SPEED.md).
"""

import torch
import torch.nn.functional as F

IGNORE_INDEX = -100
# Float32 entries per chunk. On a CPU, 2**18 (1 MiB) stays in cache between the passes over a chunk: 2**22 took 50%
# longer, 2**20 10%. On a GPU the launches of a loop cost more than the memory, so one chunk holds the logits of a
# BERT-base step (2**26 entries: 256 MiB in float32). Not yet measured on a GPU.
CPU_CHUNK_ENTRIES = 2**18
GPU_CHUNK_ENTRIES = 2**26


class _VocabularyCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: torch.Tensor, labels: torch.Tensor, chunk: int) -> torch.Tensor:
        counted = labels != IGNORE_INDEX
        ctx.compute = torch.promote_types(logits.dtype, torch.float32)  # float32 at least; float64 stays
        picks = labels.clamp(min=0)[:, None]  # (rows, 1); the ignored rows pick entry 0, then count for nothing
        log_sum_exp = torch.empty(logits.shape[0], dtype=ctx.compute, device=logits.device)
        for start in range(0, logits.shape[0], chunk):
            # log sum exp, written out: torch.logsumexp took 3.5 times as long on chunks of 16 x 16,384
            rows = logits[start : start + chunk].to(ctx.compute, copy=True)
            largest = rows.amax(-1, keepdim=True)
            log_sum_exp[start : start + chunk] = rows.sub_(largest).exp_().sum(-1).log_() + largest.squeeze(-1)
        picked = logits.gather(1, picks).squeeze(1).to(ctx.compute)
        ctx.save_for_backward(logits, picks, counted, log_sum_exp)
        ctx.chunk = chunk
        return torch.where(counted, log_sum_exp - picked, 0.0)

    @staticmethod
    def backward(ctx, grad_losses: torch.Tensor):
        logits, picks, counted, log_sum_exp = ctx.saved_tensors
        scale = torch.where(counted, grad_losses, 0.0)[:, None]  # (rows, 1)
        grad = torch.empty_like(logits)
        in_place = logits.dtype == ctx.compute  # then each chunk is worked out in the gradient itself
        for start in range(0, logits.shape[0], ctx.chunk):
            rows = slice(start, start + ctx.chunk)
            chunk = grad[rows].copy_(logits[rows]) if in_place else logits[rows].to(ctx.compute)
            # d loss / d logits = (softmax - one-hot of the label) x the row's incoming gradient
            chunk.sub_(log_sum_exp[rows, None]).exp_().mul_(scale[rows]).scatter_add_(1, picks[rows], -scale[rows])
            if not in_place:
                grad[rows] = chunk
        return grad, None, None


def vocabulary_cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Each row's cross-entropy `(rows,)`, 0 where the label is -100: `F.cross_entropy(logits.float(), labels,
    reduction="none")` for logits `(rows, vocab)` of any float dtype (float64 stays float64) and labels `(rows,)`,
    with the gradient in the logits' dtype."""
    if torch.compiler.is_compiling():
        # The chunk loop's trip count would make dynamo specialise on the rows (the masked tokens, a new count each
        # step) and compile the head again for every count; a graph takes the reference, which inductor fuses itself.
        return F.cross_entropy(logits.to(torch.promote_types(logits.dtype, torch.float32)), labels, reduction="none")
    entries = GPU_CHUNK_ENTRIES if logits.device.type == "cuda" else CPU_CHUNK_ENTRIES
    return _VocabularyCrossEntropy.apply(logits, labels, max(1, entries // max(1, logits.shape[-1])))
