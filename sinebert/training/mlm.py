"""Masked-language-model data: packing text into blocks, masking (80/10/10), and evaluation."""

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from datasets import Dataset, IterableDataset
from datasets.distributed import split_dataset_by_node

from .errors import UserError
from .loop import unpadded_ids


def pack_texts(texts: list[str], tokenizer, block_size: int) -> list[list[int]]:
    """Concatenate texts, each followed by [SEP], into blocks of `block_size` tokens that start with [CLS].

    Nothing is padded and nothing is dropped: the last block of each batch of texts may be shorter.
    """
    if not texts:
        return []
    cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
    stream = []
    for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]:
        stream.extend(ids)
        stream.append(sep)
    body = block_size - 1
    return [[cls] + stream[start : start + body] for start in range(0, len(stream), body)]


def _pack_batch(batch, tokenizer, block_size: int, text_column: str):
    wrong = next((value for value in batch[text_column] if value is not None and not isinstance(value, str)), None)
    if wrong is not None:
        raise UserError(
            f"The {text_column!r} column holds {wrong!r} ({type(wrong).__name__}), not text; give text there, or name "
            "the text column with --text_column_name."
        )
    texts = [text for text in batch[text_column] if text and not text.isspace()]  # drop empty lines
    return {"input_ids": pack_texts(texts, tokenizer, block_size)}


def pack_dataset(dataset: Dataset | IterableDataset, tokenizer, block_size: int, text_column: str,
                 num_proc: int | None = None, use_cache: bool = True):
    """Map a text dataset to packed blocks (`input_ids`); map-style datasets also get an `example_id`. `use_cache`
    False packs again instead of reading the datasets cache (--overwrite_cache)."""
    if block_size < 3:
        raise UserError(f"--max_seq_length {block_size} is too short: a block needs [CLS], a token and [SEP].")
    # A streamed text file does not know its columns before it is read (column_names None): its one column is the text.
    kwargs = dict(batched=True, batch_size=1000, remove_columns=dataset.column_names or [text_column],
                  fn_kwargs=dict(tokenizer=tokenizer, block_size=block_size, text_column=text_column))
    if isinstance(dataset, IterableDataset):
        return dataset.map(_pack_batch, **kwargs)
    packed = dataset.map(_pack_batch, num_proc=num_proc, desc="packing text into blocks",
                         load_from_cache_file=use_cache, **kwargs)
    if len(packed) == 0:
        raise UserError(f"The {text_column!r} column is empty after dropping blank lines: there is nothing to train on.")
    return packed.add_column("example_id", list(range(len(packed))))


class StreamingBlocks(torch.utils.data.IterableDataset):
    """This process's share of a streamed, packed dataset, with ids unique across processes.

    `split_dataset_by_node` gives each process whole files when their number divides evenly, otherwise every
    n-th example; either way no example is read by two processes.
    """

    def __init__(self, packed: IterableDataset, rank: int, world_size: int):
        self.shard = split_dataset_by_node(packed, rank=rank, world_size=world_size)
        self.rank, self.world_size = rank, world_size

    def __iter__(self):
        for local_index, example in enumerate(self.shard):
            yield {"input_ids": example["input_ids"], "example_id": local_index * self.world_size + self.rank}


class MaskingCollator:
    """Pads blocks and masks them for MLM (Devlin et al., 2019): each non-special token is chosen with probability
    `mlm_probability`, and one at random where that chose none; chosen tokens become [MASK] 80% of the time, a random
    token 10%, unchanged 10%. With `sample_noise`, each position also gets a uniform number (`sample_noise`,
    `(batch, seq)`) from which replaced-token detection's generator samples its token there.

    Masks are a function of (seed, epoch, example_id): the same example gets the same mask wherever and whenever
    it is drawn (any number of processes, a resumed run), and new masks each epoch. `epoch=None` fixes the masks
    for evaluation.
    """

    def __init__(self, tokenizer, mlm_probability: float = 0.15, seed: int = 0, epoch: int | None = 0,
                 sample_noise: bool = False):
        if not 0 < mlm_probability < 1:
            raise UserError(f"--mlm_probability must be in (0, 1), got {mlm_probability}.")
        if tokenizer.mask_token_id is None or tokenizer.pad_token_id is None:
            raise UserError("The tokenizer has no [MASK] or [PAD] token; train one with scripts/train_tokenizer.py.")
        self.mask_id, self.pad_id = tokenizer.mask_token_id, tokenizer.pad_token_id
        self.vocab_size = len(tokenizer)
        self.special_ids = torch.tensor(sorted(set(tokenizer.all_special_ids)))
        self.mlm_probability, self.seed, self.epoch, self.sample_noise = mlm_probability, seed, epoch, sample_noise

    def set_epoch(self, epoch: int):
        if self.epoch is not None:
            self.epoch = epoch

    @staticmethod
    def _one_of(eligible: torch.Tensor, generator: torch.Generator) -> int:
        """A position drawn from `eligible` `(seq,)`, for a block in which no token was chosen: every block predicts
        at least one token, as BERT's data builder made sure. A micro-batch with none would log a loss of 0, take a
        step with no gradient and, with several processes, give the masked-LM head's last layer no gradient on this
        process only, which data parallelism cannot reduce (gloo stops on the mismatch)."""
        positions = eligible.nonzero().flatten()
        return int(positions[torch.randint(len(positions), (1,), generator=generator)])

    def __call__(self, examples: list[dict]) -> dict[str, torch.Tensor]:
        length = max(len(e["input_ids"]) for e in examples)
        input_ids = torch.full((len(examples), length), self.pad_id, dtype=torch.long)
        attention_mask = torch.zeros((len(examples), length), dtype=torch.long)
        labels = torch.full((len(examples), length), -100, dtype=torch.long)
        noise = torch.zeros((len(examples), length))
        epoch = -1 if self.epoch is None else self.epoch
        for row, example in enumerate(examples):
            ids = torch.tensor(example["input_ids"], dtype=torch.long)
            generator = torch.Generator().manual_seed(hash((self.seed, epoch, int(example["example_id"]))) % 2**62)
            eligible = ~torch.isin(ids, self.special_ids)
            chosen = (torch.rand(len(ids), generator=generator) < self.mlm_probability) & eligible
            if not chosen.any() and eligible.any():
                chosen[self._one_of(eligible, generator)] = True
            action = torch.rand(len(ids), generator=generator)  # < 0.8: [MASK]; < 0.9: random token; else keep
            random_ids = torch.randint(self.vocab_size, (len(ids),), generator=generator)
            labels[row, : len(ids)] = torch.where(chosen, ids, -100)
            ids = torch.where(chosen & (action < 0.8), self.mask_id, ids)
            ids = torch.where(chosen & (action >= 0.8) & (action < 0.9), random_ids, ids)
            input_ids[row, : len(ids)] = ids
            attention_mask[row, : len(ids)] = 1
            if self.sample_noise:  # drawn after the masks, which stay those of plain MLM
                noise[row, : len(ids)] = torch.rand(len(ids), generator=generator)
        batch = {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}
        return batch | ({"sample_noise": noise} if self.sample_noise else {})


def cut_blocks(batch: dict, length: int, pad_token_id: int) -> dict:
    """Cut each row of a collated MLM batch into rows of `length` tokens: the same tokens, masks and labels, in more
    and shorter rows. (B, L) -> (B * ceil(L / length), length); the last piece of a row is padded, and rows left
    with no real token are dropped. Each piece gets positions 0..length-1 of its own."""
    pad = -batch["input_ids"].shape[1] % length
    fill = {"input_ids": pad_token_id, "attention_mask": 0, "labels": -100, "sample_noise": 0.0}
    cut = {key: F.pad(batch[key], (0, pad), value=value).reshape(-1, length) for key, value in fill.items()
           if key in batch}
    real = cut["attention_mask"].any(dim=1)
    return {key: value[real] for key, value in cut.items()}


@dataclass(frozen=True)
class MixedLengths:
    """Pretraining on mixed sequence lengths: on a share `probability` of the optimizer steps, the blocks of
    --max_seq_length tokens are cut into blocks of `short_length` (same tokens per step). Short steps are cheaper
    (attention is quadratic in length); the long ones teach the model positions that short blocks never show.
    Which steps are short depends only on the seed and the step, so resuming sees the same mix."""

    short_length: int
    probability: float
    seed: int
    pad_token_id: int

    def is_short(self, step: int) -> bool:
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        return torch.rand((), generator=generator).item() < self.probability

    def __call__(self, batch: dict, step: int) -> dict:
        return cut_blocks(batch, self.short_length, self.pad_token_id) if self.is_short(step) else batch


def mixed_lengths(args, pad_token_id: int) -> MixedLengths | None:
    """The --short_seq_length / --short_seq_probability mix, checked; None without --short_seq_length."""
    if args.short_seq_length is None:
        return None
    if not 0 < args.short_seq_length < args.max_seq_length:
        raise UserError(f"--short_seq_length must be between 1 and --max_seq_length - 1 "
                        f"({args.max_seq_length - 1}), got {args.short_seq_length}.")
    if not 0 <= args.short_seq_probability <= 1:
        raise UserError(f"--short_seq_probability must be between 0 and 1, got {args.short_seq_probability}.")
    return MixedLengths(args.short_seq_length, args.short_seq_probability, args.seed, pad_token_id)


def trace_blocks(batch: dict) -> dict[str, list[list[int]]]:
    """What `--trace_data` records of a collated batch: its unmasked, unpadded blocks and each block's masked
    positions."""
    labels = batch["labels"]
    chosen = labels != -100  # (batch, seq)
    masked = [torch.nonzero(row).flatten().tolist() for row in chosen]
    return {"input_ids": unpadded_ids(batch, torch.where(chosen, labels, batch["input_ids"])), "masked": masked}


def masked_token_count(batch: dict) -> int:
    return int((batch["labels"] != -100).sum())


def evaluate_mlm(model, dataloader, accelerator) -> dict:
    """Validation loss (mean over masked tokens), perplexity and masked-token accuracy, exact across processes. For
    replaced-token detection these are the generator's, beside the discriminator's loss and accuracy over every token
    (`eval_detection_loss`, `eval_detection_accuracy`) and the share of tokens the generator replaced."""
    # Per example: loss sum, correct, masked count; detection loss sum, correct, tokens, replaced.
    totals = torch.zeros(7, dtype=torch.float64, device=accelerator.device)
    detection = False
    for batch in dataloader:
        with accelerator.autocast():
            output = model(**batch)
        logits, labels = output.logits, batch["labels"]
        predicted = labels != -100
        if logits.dim() == 3:  # dense logits: keep the masked positions, as sparse prediction returns them
            logits = logits[predicted]
        targets = labels[predicted]
        token_loss = F.cross_entropy(logits.float(), targets, reduction="none")
        correct = (logits.argmax(-1) == targets).double()
        rows = predicted.nonzero()[:, 0]  # example of each masked token, for per-example sums
        per_example = torch.zeros(labels.shape[0], 7, dtype=torch.float64, device=labels.device)
        per_example[:, 0].index_add_(0, rows, token_loss.double())
        per_example[:, 1].index_add_(0, rows, correct)
        per_example[:, 2].index_add_(0, rows, torch.ones_like(correct))
        replaced = getattr(output, "replaced", None)
        if replaced is not None:
            detection, counted = True, replaced != -100
            judged = output.discriminator_logits.float()
            loss = F.binary_cross_entropy_with_logits(judged, replaced.clamp_min(0).float(), reduction="none")
            per_example[:, 3] = (loss * counted).sum(1).double()
            per_example[:, 4] = (((judged > 0).long() == replaced) & counted).sum(1).double()
            per_example[:, 5] = counted.sum(1).double()
            per_example[:, 6] = (replaced == 1).sum(1).double()
        # gather_for_metrics drops the examples accelerate repeats to even out the last batch across processes
        totals += accelerator.gather_for_metrics(per_example).sum(0)
    loss_sum, correct, count, detection_sum, detected, tokens, replaced_count = totals.tolist()
    loss = loss_sum / max(count, 1.0)
    metrics = {
        "eval_loss": loss,
        "perplexity": float(torch.tensor(loss).exp()),
        "eval_accuracy": correct / max(count, 1.0),
        "eval_masked_tokens": int(count),
    }
    if detection:
        metrics |= {"eval_detection_loss": detection_sum / max(tokens, 1.0),
                    "eval_detection_accuracy": detected / max(tokens, 1.0),
                    "eval_replaced_share": replaced_count / max(tokens, 1.0)}
    return metrics
