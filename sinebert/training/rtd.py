"""Replaced-token detection (ELECTRA, Clark et al., 2020): a small masked-LM generator fills the masked positions
with tokens it samples, and the sinebert discriminator (`SineBertForPreTraining`) learns, at every position, whether
the token there is the original. The discriminator is what `scripts/pretrain.py --objective rtd` saves.

The generator is a `SineBertForMaskedLM` of a fraction of the discriminator's width that reads and writes words
through the discriminator's word-embedding matrix (ELECTRA's shared embeddings), projected to its own width on the
way in and back on the way out. Its samples are drawn by inverse CDF from one uniform number per position that the
collator draws from the example's own seed (`MaskingCollator(sample_noise=True)`), so that, like the masks, they
depend on the example only: one process or two, a resumed run or not, the same tokens are sampled.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers.utils import ModelOutput

from ..modeling_sinebert import SineBertForMaskedLM, SineBertForPreTraining
from .errors import UserError

# ELECTRA's weight of the discriminator's loss against the generator's (lambda = 50 in the paper).
DISCRIMINATOR_WEIGHT = 50.0
# The generator's width as a share of the discriminator's: the paper found 1/4 to 1/2 best.
GENERATOR_FRACTION = 0.25
# The temperature the generator's samples are drawn at. At 1 (ELECTRA's), on the cram's budget, the small generator
# learns word frequencies faster than the discriminator learns context, and detection falls back to calling every
# token original; at 2 its samples stay easier to spot, the detector learns through the whole run, and fine-tuning
# from it gains 1.5 to 10 points (docs/QUALITY.md, "Replaced-token detection on the same budget").
GENERATOR_TEMPERATURE = 2.0


class SharedWordEmbedding(nn.Module):
    """The generator's input embedding: the discriminator's word vectors, projected to the generator's width."""

    def __init__(self, shared: nn.Embedding, width: int):
        super().__init__()
        self.shared = shared
        self.project = nn.Linear(shared.embedding_dim, width, bias=False)

    @property
    def weight(self) -> torch.Tensor:  # what the embeddings' dtype is read from
        return self.shared.weight

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.project(self.shared(input_ids))  # (batch, seq, width)


class SharedDecoder(nn.Module):
    """The generator's output layer: back to the discriminator's width, then onto its word vectors."""

    def __init__(self, shared: nn.Embedding, width: int):
        super().__init__()
        self.shared = shared
        self.project = nn.Linear(width, shared.embedding_dim, bias=False)
        self.bias = nn.Parameter(torch.zeros(shared.num_embeddings))

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return F.linear(self.project(hidden_states), self.shared.weight, self.bias)  # (rows, vocab)


def generator_config(config, fraction: float):
    """The discriminator's config at `fraction` of its width: as many heads of the same size as fit (at least one),
    the feed-forward layer scaled alike, the same depth (ELECTRA's generators keep the layers); the masked-only head,
    no token dropping, and a vocabulary size equal to the discriminator's."""
    if not 0 < fraction <= 1:
        raise UserError(f"--generator_fraction must be in (0, 1], got {fraction}: the generator's share of the "
                        "discriminator's width (0.25 in ELECTRA's small models).")
    heads = max(1, round(config.num_attention_heads * fraction))
    head_size = config.hidden_size // config.num_attention_heads
    values = config.to_dict() | {
        "hidden_size": heads * head_size, "num_attention_heads": heads,
        "intermediate_size": max(1, round(config.intermediate_size * fraction)),
        "sparse_prediction": True, "token_dropping_layers": None,
    }
    values.pop("auto_map", None)
    return type(config)(**{k: v for k, v in values.items() if k not in ("architectures", "transformers_version")})


@dataclass
class ReplacedTokenDetectionOutput(ModelOutput):
    """loss: the generator's masked-LM loss plus the weighted discriminator loss, per masked token (see `forward`);
    logits `(masked, vocab)`: the generator's at the masked positions (what the masked-LM evaluation reads);
    discriminator_logits `(batch, seq)`; replaced `(batch, seq)`: 1 where the sample differs from the original,
    -100 at padding."""

    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    discriminator_logits: torch.Tensor | None = None
    replaced: torch.Tensor | None = None
    generator_loss: torch.Tensor | None = None
    discriminator_loss: torch.Tensor | None = None


def sample_from(logits: torch.Tensor, noise: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """One token per row of `logits` `(rows, vocab)` at `temperature`, drawn by inverse CDF with the uniform numbers
    `noise` `(rows,)`: the first token whose cumulative probability exceeds the number."""
    cumulative = (logits.float() / temperature).softmax(-1).cumsum(-1)
    return torch.searchsorted(cumulative, noise.float()[:, None]).squeeze(-1).clamp_max(logits.shape[-1] - 1)


class ReplacedTokenDetection(nn.Module):
    """Generator and discriminator, trained together; the discriminator alone is kept."""

    def __init__(self, discriminator: SineBertForPreTraining, fraction: float = GENERATOR_FRACTION,
                 weight: float = DISCRIMINATOR_WEIGHT, mlm_probability: float = 0.15,
                 temperature: float = GENERATOR_TEMPERATURE):
        super().__init__()
        if not temperature > 0:
            raise UserError(f"--generator_temperature must be above 0, got {temperature}: the temperature the "
                            "generator's samples are drawn at (1: its own distribution; above 1: flatter).")
        self.temperature = temperature
        self.discriminator = discriminator
        self.generator = SineBertForMaskedLM(generator_config(discriminator.config, fraction))
        shared, width = discriminator.get_input_embeddings(), self.generator.config.hidden_size
        self.generator.sinebert.embeddings.word_embeddings = SharedWordEmbedding(shared, width)
        self.generator.decoder = SharedDecoder(shared, width)
        # Both losses are divided by the masked tokens (the loop's count): the discriminator's sum over every token
        # times mlm_probability is, on average, its mean over the tokens, as ELECTRA weights it.
        self.weight, self.mlm_probability = weight, mlm_probability
        self.config = discriminator.config

    def get_input_embeddings(self) -> nn.Embedding:
        return self.discriminator.get_input_embeddings()

    def attention_kernels(self) -> list[str]:
        return self.discriminator.attention_kernels()

    def activation_checkpointing_enable(self):
        for model in (self.generator, self.discriminator):
            model.activation_checkpointing_enable()

    def forward(self, input_ids, attention_mask, labels, sample_noise, token_type_ids=None,
                **kwargs) -> ReplacedTokenDetectionOutput:
        """input_ids `(batch, seq)` with [MASK] (or a random token) at the positions `labels` names; sample_noise
        `(batch, seq)` uniform numbers in [0, 1)."""
        generated = self.generator(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
                                   labels=labels)
        masked = labels != -100
        with torch.no_grad():
            samples = sample_from(generated.logits, sample_noise[masked], self.temperature)
        original = torch.where(masked, labels, input_ids)
        corrupted = original.masked_scatter(masked, samples)
        replaced = (corrupted != original).long().masked_fill(attention_mask == 0, -100)
        judged = self.discriminator(input_ids=corrupted, attention_mask=attention_mask, token_type_ids=token_type_ids)
        counted = replaced != -100
        discriminator_sum = F.binary_cross_entropy_with_logits(
            judged.logits[counted].float(), replaced[counted].float(), reduction="sum"
        )
        masked_count = masked.sum().clamp_min(1)
        loss = generated.loss + self.weight * self.mlm_probability * discriminator_sum / masked_count
        return ReplacedTokenDetectionOutput(
            loss=loss, logits=generated.logits, discriminator_logits=judged.logits, replaced=replaced,
            generator_loss=generated.loss, discriminator_loss=discriminator_sum / counted.sum().clamp_min(1),
        )


def discriminator_of(model: nn.Module) -> SineBertForPreTraining:
    return model.discriminator if isinstance(model, ReplacedTokenDetection) else model
