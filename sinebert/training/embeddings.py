"""Word embeddings trained with CBOW and negative sampling (Mikolov et al., 2013) to start MLM pretraining from.

On a small budget, masked language modelling spends its first thousands of steps on a plateau where the encoder
predicts how frequent each token is and has not yet learned to read the context (README "Quality at a fixed
budget"). CBOW learns which tokens share contexts at about 90k tokens/s on two CPU cores, over 20 times the
encoder's rate, so a few minutes of it give the encoder word embeddings worth fine-tuning from.

`scripts/train_word_embeddings.py` writes them; `scripts/pretrain.py --init_word_embeddings` starts from them.
"""

import hashlib
import json
import os
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from .errors import UserError

FILE_NAME = "word_embeddings.safetensors"


def vocabulary_digest(tokenizer) -> str:
    """SHA-256 of the token -> id map: embeddings only fit the tokenizer whose ids they were trained on."""
    vocab = json.dumps(sorted(tokenizer.get_vocab().items()), ensure_ascii=False)
    return hashlib.sha256(vocab.encode("utf-8")).hexdigest()


def token_stream(texts, tokenizer) -> torch.Tensor:
    """Every line's token ids end to end, each followed by -1 so that no context window crosses lines: (tokens,)."""
    ids = tokenizer(list(texts), add_special_tokens=False, verbose=False)["input_ids"]  # lines may exceed 512
    stream = torch.tensor([token for line in ids if line for token in (*line, -1)], dtype=torch.long)
    if not (stream >= 0).any():
        raise UserError("The training text holds no tokens to train word embeddings on.")
    return stream


class CBOW(torch.nn.Module):
    """Predicts a token from the mean of its context's input vectors, against negatives shared by the batch."""

    def __init__(self, vocab_size: int, size: int, negatives: int):
        super().__init__()
        # Row `vocab_size` stands for "beyond the line"; embedding_bag leaves it out of the mean.
        self.inputs = torch.nn.Parameter(torch.empty(vocab_size + 1, size).uniform_(-0.5 / size, 0.5 / size))
        self.outputs = torch.nn.Parameter(torch.zeros(vocab_size, size))
        self.negatives = negatives

    def forward(self, contexts: torch.Tensor, targets: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        # contexts (B, 2 x window), targets (B,), noise (N,) token ids drawn from the noise distribution
        hidden = F.embedding_bag(contexts, self.inputs, mode="mean", padding_idx=len(self.outputs))  # (B, size)
        positive = (hidden * self.outputs[targets]).sum(-1)  # (B,)
        negative = hidden @ self.outputs[noise].T  # (B, N): one matmul instead of B x `negatives` gathers
        # Shared noise: each of the N samples counts negatives / N, so a token still meets `negatives` in expectation.
        return -(F.logsigmoid(positive).mean() + self.negatives / len(noise) * F.logsigmoid(-negative).sum(-1).mean())


def context_windows(stream: torch.Tensor, centers: torch.Tensor, window: int, pad_id: int) -> torch.Tensor:
    """The `window` tokens on each side of each center, with `pad_id` past the center's line end: (B, 2 x window)."""
    offsets = torch.cat([torch.arange(-window, 0), torch.arange(1, window + 1)])
    positions = centers[:, None] + offsets  # (B, 2 x window)
    in_stream = (positions >= 0) & (positions < len(stream))
    tokens = torch.where(in_stream, stream[positions.clamp(0, len(stream) - 1)], -1)
    # A position stays in context only if no line end (-1) lies between it and the center.
    inside = tokens >= 0
    left = inside[:, :window].flip(1).cumprod(1).flip(1)
    right = inside[:, window:].cumprod(1)
    return torch.where(torch.cat([left, right], 1).bool(), tokens, pad_id)


def train_cbow(stream: torch.Tensor, vocab_size: int, args) -> tuple[torch.Tensor, dict]:
    """CBOW on `stream` for --max_train_minutes or --max_train_steps (the first reached), the learning rate decaying
    linearly to 0 over that budget; returns the input vectors (vocab_size, size) and a summary."""
    generator = torch.Generator().manual_seed(args.seed)
    torch.manual_seed(args.seed)
    centers = torch.nonzero(stream >= 0).squeeze(1)
    counts = torch.bincount(stream[centers], minlength=vocab_size).double()
    noise = counts.pow(0.75)  # word2vec's smoothed unigram distribution
    # Sampling stays on the CPU (a few thousand ids a step); the vectors train on the GPU when there is one.
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = CBOW(vocab_size, args.embedding_size, args.negatives).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.learning_rate)
    started, step, loss = time.perf_counter(), 0, float("nan")
    while True:
        done = step / args.max_train_steps if args.max_train_steps else 0.0
        if args.max_train_minutes:
            done = max(done, (time.perf_counter() - started) / (60 * args.max_train_minutes))
        if done >= 1:
            break
        for group in optimizer.param_groups:
            group["lr"] = args.learning_rate * (1 - done)
        batch = centers[torch.randint(len(centers), (args.batch_size,), generator=generator)]
        contexts = context_windows(stream, batch, args.window, vocab_size)
        shared_noise = torch.multinomial(noise, args.noise_samples, replacement=True, generator=generator)
        loss = model(contexts.to(device), stream[batch].to(device), shared_noise.to(device))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1
        if step % args.logging_steps == 0:
            print(f"step {step}: loss {loss.item():.4f}", flush=True)
    seconds = time.perf_counter() - started
    # Named as the other scripts' all_results.json, so the cram's stage table reads it alike.
    summary = {"train_steps": step, "train_tokens": step * args.batch_size, "train_seconds": round(seconds, 2),
               "train_tokens_per_second": step * args.batch_size / max(seconds, 1e-9), "corpus_tokens": len(centers),
               "epochs": step * args.batch_size / len(centers), "final_loss": float(loss.detach()) if step else None}
    return model.inputs.detach()[:vocab_size].cpu(), summary


def save_word_embeddings(output_dir: Path, matrix: torch.Tensor, tokenizer, summary: dict) -> Path:
    """Write `matrix` with the tokenizer's digest atomically (a temporary file, then a rename)."""
    output_dir.mkdir(parents=True, exist_ok=True)
    path = output_dir / FILE_NAME
    partial = path.with_suffix(".partial")
    save_file({"word_embeddings": matrix.contiguous()}, str(partial),
              metadata={"vocabulary_sha256": vocabulary_digest(tokenizer), "summary": json.dumps(summary)})
    os.replace(partial, path)
    return path


def load_word_embeddings(path: str, tokenizer, hidden_size: int, std: float) -> torch.Tensor:
    """The matrix of `path` (a file or a folder holding one), centred and scaled to `std` per entry, as the model's
    own initialisation would be, after checking that it fits this tokenizer and hidden size: (vocab, hidden)."""
    file = Path(path)
    if file.is_dir():
        file = file / FILE_NAME
    if not file.is_file():
        raise UserError(f"--init_word_embeddings {path}: no {FILE_NAME} there; write one with "
                        "scripts/train_word_embeddings.py.")
    with safe_open(str(file), framework="pt") as handle:
        digest = (handle.metadata() or {}).get("vocabulary_sha256")
    if digest != vocabulary_digest(tokenizer):
        raise UserError(f"--init_word_embeddings {path} was trained with another tokenizer than this run's; train "
                        "the embeddings again with the same --tokenizer_name.")
    matrix = load_file(str(file))["word_embeddings"].float()
    if matrix.shape[1] != hidden_size:
        raise UserError(f"--init_word_embeddings {path} has vectors of size {matrix.shape[1]} but the model's "
                        f"hidden_size is {hidden_size}; train them with --embedding_size {hidden_size}.")
    centred = matrix - matrix.mean(0)  # CBOW vectors share a large common component; it carries no meaning
    return centred / centred.std() * std


def init_word_embeddings(model, path: str, tokenizer, from_checkpoint: bool):
    """Copy the embeddings of `path` into a model built from scratch (with tied weights, the MLM decoder too)."""
    if from_checkpoint:
        raise UserError("--init_word_embeddings starts a model from scratch; a --model_name_or_path checkpoint "
                        "already has its word embeddings, so give only one of the two.")
    config = model.config
    matrix = load_word_embeddings(path, tokenizer, config.hidden_size, config.initializer_range)
    with torch.no_grad():
        model.get_input_embeddings().weight[: len(matrix)] = matrix
