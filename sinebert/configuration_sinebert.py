"""SineBERT model configuration."""

import math
from typing import Literal

from transformers import PreTrainedConfig
from transformers.activations import ACT2FN

# Every Auto class a sinebert checkpoint loads under with `trust_remote_code=True`. Written into each saved
# config so that a process without the package can load any head, not only the class that was saved.
SINEBERT_AUTO_MAP = {
    "AutoConfig": "configuration_sinebert.SineBertConfig",
    "AutoModel": "modeling_sinebert.SineBertModel",
    "AutoModelForMaskedLM": "modeling_sinebert.SineBertForMaskedLM",
    "AutoModelForPreTraining": "modeling_sinebert.SineBertForPreTraining",
    "AutoModelForSequenceClassification": "modeling_sinebert.SineBertForSequenceClassification",
    "AutoModelForTokenClassification": "modeling_sinebert.SineBertForTokenClassification",
    "AutoModelForQuestionAnswering": "modeling_sinebert.SineBertForQuestionAnswering",
}

NORM_PLACEMENTS = ("post", "pre")
ATTENTION_INITS = ("normal", "mimetic")
POSITION_EMBEDDING_TYPES = ("absolute", "rotary")
MLP_TYPES = ("mlp", "glu")
TOKEN_DROPPING_POLICIES = ("random", "loss")
CLASSIFIER_POOLINGS = ("cls", "mean")


class SineBertConfig(PreTrainedConfig):
    r"""
    Configuration of a SineBERT encoder: a BERT-style bidirectional transformer whose positions are the fixed
    sinusoidal encoding of "Attention Is All You Need" (Vaswani et al., 2017, section 3.5) instead of learned
    position embeddings, so that any length can be encoded.

    Args:
        vocab_size (`int`, defaults to 30522): Number of tokens in the vocabulary.
        hidden_size (`int`, defaults to 768): Width d of the embeddings and of every encoder layer.
        num_hidden_layers (`int`, defaults to 12): Number of encoder layers.
        num_attention_heads (`int`, defaults to 12): Attention heads per layer; must divide `hidden_size`.
        intermediate_size (`int`, defaults to 3072): Width of the position-wise feed-forward layer (with `mlp_type`
            `"glu"`, of its gated product).
        hidden_act (`str`, defaults to `"gelu"`): Activation of the feed-forward layer (any name in
            `transformers.activations.ACT2FN`).
        mlp_type (`str`, defaults to `"mlp"`): The feed-forward layer. `"mlp"`: Linear(d, ffn) -> activation ->
            Linear(ffn, d), as BERT. `"glu"`: a gated linear unit (Shazeer, 2020, "GLU Variants Improve
            Transformer"; ModernBERT's feed-forward): the first projection gives two halves of width ffn, the
            activation of one times the other goes through Linear(ffn, d). An `intermediate_size` of 2/3 of an
            `"mlp"`'s takes the same FLOPs.
        bias (`bool`, defaults to `True`): Whether the encoder's linear layers and LayerNorms (and the masked-LM
            head's transform) add a bias, as BERT's do. `False`, as ModernBERT: none but the decoder's and the task
            heads'.
        hidden_dropout_prob (`float`, defaults to 0.1): Dropout on embeddings and residual branches, in [0, 1).
        attention_probs_dropout_prob (`float`, defaults to 0.1): Dropout on attention probabilities, in [0, 1).
        max_position_embeddings (`int`, defaults to 512): Rows of the cached sinusoidal table. Not a limit:
            positions beyond it are computed on the fly.
        position_embedding_type (`str`, defaults to `"absolute"`): Where the fixed sinusoids of position enter.
            `"absolute"` adds the sinusoidal encoding of each position to its word embedding (Vaswani et al., 2017).
            `"rotary"` adds nothing to the embeddings and instead rotates each head's queries and keys by angles
            proportional to the position, at the same geometric series of frequencies (RoFormer, Su et al., 2021),
            so that attention scores depend on the distance between two tokens and not on where they stand. Configs
            saved before this setting existed load with `"absolute"`, as they were trained.
        rope_theta (`float`, defaults to 10000.0): With rotary positions, the base of the frequencies: the pair i of
            a head's dimensions turns by position * rope_theta^(-2i / head_dim).
        type_vocab_size (`int`, defaults to 2): Number of token types (segments); 0 disables token-type
            embeddings.
        layer_norm_eps (`float`, defaults to 1e-12): Epsilon of every LayerNorm.
        initializer_range (`float`, defaults to 0.02): Standard deviation of the normal weight initialisation.
        pad_token_id (`int`, defaults to 0): Id of the padding token.
        tie_word_embeddings (`bool`, defaults to `True`): Tie the masked-LM decoder to the word embeddings.
        classifier_dropout (`float`, *optional*): Dropout before the classification heads; `None` uses
            `hidden_dropout_prob`.
        norm_placement (`str`, defaults to `"post"`): `"post"` normalises after each residual addition as in the
            original Transformer and BERT; `"pre"` normalises the input of each sub-layer and adds a final
            LayerNorm (Xiong et al., 2020, "On Layer Normalization in the Transformer Architecture"), which
            tolerates larger learning rates.
        classifier_pooling (`str`, defaults to `"cls"`): How sequence classification pools the tokens: `"cls"`
            takes the first token, `"mean"` averages the non-padding tokens.
        scale_embeddings (`bool`, defaults to `False`): Multiply word embeddings by sqrt(hidden_size) before
            adding positions, as in the original Transformer, so that the sinusoids (entries in [-1, 1]) do not
            drown the small initial word embeddings.
        position_scale (`float`, *optional*): Factor of the sinusoidal encoding where it is added to the word
            embeddings (absolute positions only). By default sqrt(2) * `initializer_range`, so that at initialisation
            a position row has the norm of a word-embedding row (a sinusoid row has norm sqrt(hidden_size / 2)), as
            BERT's learned position embeddings do; unscaled, a sinusoid is 35 times a word vector and after the
            embedding LayerNorm the model barely sees which token it reads. With `scale_embeddings` the default is
            1, the original Transformer's. Configs saved before this setting existed load with 1, as they were
            trained.
        attention_init (`str`, defaults to `"normal"`): How a model trained from scratch initialises its attention
            projections. `"normal"` draws them like every other weight (normal, `initializer_range`); `"mimetic"`
            sets, in each layer, every head's query-key product W_q W_k^T to the rank-head_dim part of 0.7 Z + 0.7 I
            and the value-output product W_v W_o to 0.4 Z - 0.4 I, each Z a random matrix of N(0, 1/hidden_size)
            entries (Trockman and Kolter, 2023, "Mimetic Initialization of Self-Attention Layers"). Tokens then
            start by attending to tokens like themselves, and with sinusoidal positions to their neighbours, which
            is where a short MLM run otherwise spends most of its steps. Weights loaded from a checkpoint are never
            reinitialised.
        sparse_prediction (`bool`, defaults to `False`): When `SineBertForMaskedLM` gets `labels`, project only
            the positions whose label is not -100 onto the vocabulary and return logits of shape
            `(num_masked, vocab_size)`. The loss is the same; the work of the decoder, and of the last layer apart
            from its keys and values, shrinks by the masking rate. Pretraining turns this on. Without labels, logits
            cover every position either way.
        sliding_window (`int`, *optional*): Local attention: a token attends only to the tokens at most
            `sliding_window` positions before or after it (bidirectional band, as in Longformer, Beltagy et al.,
            2020), so time and memory grow as O(seq * sliding_window) instead of O(seq^2). `None` (the default)
            gives every layer full attention.
        global_attn_every_n_layers (`int`, *optional*): With `sliding_window`, layers 0, n, 2n, ... keep full
            attention and the others are local, as in ModernBERT (Warner et al., 2024, which uses n=3). `None` (the
            default) makes every layer local. Needs `sliding_window`.
        global_attention_positions (`list[int]`, *optional*): Positions that attend to every token and that every
            token attends to in the local layers (Longformer's global attention), e.g. `[0]` for [CLS] so that a
            classifier pooling it sees the whole input. Positions past a sequence's end are skipped for that input.
            Needs `sliding_window`.
        cross_segment_match (`bool`, defaults to `False`): Add a learned vector (zero at the start) to the word
            embedding of every token whose id also occurs in the other segment of a pair (`token_type_ids` 0 against
            the rest): in question answering, the context tokens that the question uses and the question tokens that
            the context has. The exact-match feature of DrQA (Chen et al., 2017, "Reading Wikipedia to Answer
            Open-Domain Questions"), computed from the inputs, so tokenizers and pipelines need nothing new. Inputs
            without `token_type_ids` are one segment and get no match.
        letter_case (`bool`, defaults to `False`): Read the letter case of each token's word from the `case_ids`
            input (0 lower case or no letters, 1 capitalised, 2 all capitals; `SineBertTokenizer` returns them) and
            add a learned vector per case (zero at the start) to the word embedding. A lower-cased vocabulary loses
            case, which in English marks most names (Collobert et al., 2011, add it to lower-cased words the same
            way). The model then needs `case_ids` in every call.
        token_dropping_layers (`list[int]`, *optional*): Token dropping in masked-LM training (Hou et al., 2022,
            "Token Dropping for Efficient BERT Pretraining"): `[first, stop]`, the encoder layers `first` to `stop - 1`
            that, while `SineBertForMaskedLM` trains with `labels`, compute only some of the tokens. The others keep
            the hidden state they had before `first` until the layers after `stop - 1`, which compute every token
            again. Negative values count from the end as in a Python slice, so `[1, -1]` means every layer but the
            first and the last at any depth. The last layer must be left out, and the layers that drop tokens must
            have full attention (a window counts positions, which dropping shifts). `None` (the default) drops no
            tokens. Evaluation, inference and the other heads always compute every token in every layer.
        token_dropping_keep (`float`, defaults to 0.5): With `token_dropping_layers`, the share of each sequence's
            tokens those layers compute, in (0, 1]: every token with a label and as many others as make up the share.
        token_dropping_policy (`str`, defaults to `"random"`): Which of the unlabelled tokens token dropping keeps.
            `"random"`: drawn at random. `"loss"` (Hou et al.'s importance): those whose vocabulary id has the highest
            running masked-LM loss (`SineBertForMaskedLM.token_loss`, a buffer saved with the weights), ids never
            predicted yet (the special tokens among them) first, ties in random order.
    """

    model_type = "sinebert"

    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    mlp_type: Literal["mlp", "glu"] = "mlp"
    bias: bool = True
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    position_embedding_type: Literal["absolute", "rotary"] = "absolute"
    rope_theta: float = 10000.0
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    initializer_range: float = 0.02
    pad_token_id: int | None = 0
    tie_word_embeddings: bool = True
    classifier_dropout: float | None = None
    norm_placement: Literal["post", "pre"] = "post"
    classifier_pooling: Literal["cls", "mean"] = "cls"
    scale_embeddings: bool = False
    position_scale: float | None = None
    attention_init: Literal["normal", "mimetic"] = "normal"
    sparse_prediction: bool = False
    sliding_window: int | None = None
    global_attn_every_n_layers: int | None = None
    global_attention_positions: list[int] | None = None
    cross_segment_match: bool = False
    letter_case: bool = False
    token_dropping_layers: list[int] | None = None
    token_dropping_keep: float = 0.5
    token_dropping_policy: Literal["random", "loss"] = "random"

    def __post_init__(self, **kwargs):
        if self.position_scale is None:
            self.position_scale = 1.0 if self.scale_embeddings else math.sqrt(2) * self.initializer_range
        self._validate()
        if getattr(self, "auto_map", None) is None and "auto_map" not in kwargs:
            kwargs["auto_map"] = dict(SINEBERT_AUTO_MAP)
        super().__post_init__(**kwargs)

    @classmethod
    def from_dict(cls, config_dict, **kwargs):
        # A saved sinebert config without position_scale predates it: its model added the sinusoid unscaled.
        if config_dict.get("model_type") == cls.model_type:
            config_dict = {"position_scale": 1.0, **config_dict}
        return super().from_dict(config_dict, **kwargs)

    def _validate(self):
        for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                     "max_position_embeddings"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}.")
        if not isinstance(self.type_vocab_size, int) or self.type_vocab_size < 0:
            raise ValueError(f"type_vocab_size must be a non-negative integer, got {self.type_vocab_size!r}.")
        if self.hidden_size % self.num_attention_heads != 0:
            raise ValueError(
                f"hidden_size={self.hidden_size} is not divisible by num_attention_heads={self.num_attention_heads}; "
                "choose a number of heads that divides the hidden size."
            )
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob", "classifier_dropout"):
            value = getattr(self, name)
            if value is None and name == "classifier_dropout":
                continue
            if not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {value!r}.")
        if self.norm_placement not in NORM_PLACEMENTS:
            raise ValueError(f"norm_placement must be one of {NORM_PLACEMENTS}, got {self.norm_placement!r}.")
        if self.mlp_type not in MLP_TYPES:
            raise ValueError(f"mlp_type must be one of {MLP_TYPES}, got {self.mlp_type!r}.")
        if not isinstance(self.bias, bool):
            raise ValueError(f"bias must be true or false, got {self.bias!r}.")
        if self.attention_init not in ATTENTION_INITS:
            raise ValueError(f"attention_init must be one of {ATTENTION_INITS}, got {self.attention_init!r}.")
        if self.classifier_pooling not in CLASSIFIER_POOLINGS:
            raise ValueError(
                f"classifier_pooling must be one of {CLASSIFIER_POOLINGS}, got {self.classifier_pooling!r}."
            )
        if self.position_embedding_type not in POSITION_EMBEDDING_TYPES:
            raise ValueError(
                f"position_embedding_type must be one of {POSITION_EMBEDDING_TYPES}, got "
                f"{self.position_embedding_type!r}."
            )
        if self.position_embedding_type == "rotary" and (self.hidden_size // self.num_attention_heads) % 2:
            raise ValueError(
                f"Rotary positions turn pairs of each head's dimensions, but hidden_size={self.hidden_size} / "
                f"num_attention_heads={self.num_attention_heads} gives an odd head size; choose an even one."
            )
        theta = self.rope_theta
        if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not theta > 1:
            raise ValueError(f"rope_theta must be a number greater than 1, got {self.rope_theta!r}.")
        if not isinstance(self.position_scale, (int, float)) or not self.position_scale >= 0:
            raise ValueError(f"position_scale must be a non-negative number, got {self.position_scale!r}.")
        if not self.layer_norm_eps > 0:
            raise ValueError(f"layer_norm_eps must be positive, got {self.layer_norm_eps!r}.")
        if not self.initializer_range > 0:
            raise ValueError(f"initializer_range must be positive, got {self.initializer_range!r}.")
        if self.pad_token_id is not None and not 0 <= self.pad_token_id < self.vocab_size:
            raise ValueError(
                f"pad_token_id={self.pad_token_id} is outside the vocabulary [0, {self.vocab_size}); "
                "set it to the tokenizer's pad token id."
            )
        if self.hidden_act not in ACT2FN:
            raise ValueError(f"hidden_act={self.hidden_act!r} is unknown; choose one of {sorted(ACT2FN)}.")
        self._validate_local_attention()
        self._validate_token_dropping()

    def _validate_token_dropping(self):
        layers, keep = self.token_dropping_layers, self.token_dropping_keep
        if not isinstance(keep, (int, float)) or isinstance(keep, bool) or not 0.0 < keep <= 1.0:
            raise ValueError(f"token_dropping_keep must be in (0, 1], got {keep!r}.")
        if self.token_dropping_policy not in TOKEN_DROPPING_POLICIES:
            raise ValueError(f"token_dropping_policy must be one of {TOKEN_DROPPING_POLICIES}, got "
                             f"{self.token_dropping_policy!r}.")
        if layers is None:
            return
        valid = isinstance(layers, (list, tuple)) and len(layers) == 2 and all(_is_int(i) for i in layers)
        dropping = self.token_dropping_range if valid else range(0)
        if not dropping or dropping[-1] == self.num_hidden_layers - 1:
            raise ValueError(
                f"token_dropping_layers must be [first, stop], a slice of the {self.num_hidden_layers} layers that "
                f"holds at least one and leaves out the last (which computes every token), got {layers!r}."
            )

    def _validate_local_attention(self):
        window, every, positions = self.sliding_window, self.global_attn_every_n_layers, self.global_attention_positions
        if window is None:
            for name, value in (("global_attn_every_n_layers", every), ("global_attention_positions", positions)):
                if value is not None:
                    raise ValueError(
                        f"{name}={value!r} only applies to local attention, but sliding_window is None; set "
                        f"sliding_window (tokens on each side) or leave {name} unset."
                    )
            return
        if not _is_positive_int(window):
            raise ValueError(
                f"sliding_window must be a positive integer (tokens on each side) or None, got {window!r}."
            )
        if every is not None and not _is_positive_int(every):
            raise ValueError(f"global_attn_every_n_layers must be a positive integer or None, got {every!r}.")
        if every == 1:
            raise ValueError(
                f"global_attn_every_n_layers=1 makes every layer full attention, so sliding_window={window} would "
                "never be used; set sliding_window=None for full attention."
            )
        if positions is not None:
            if not isinstance(positions, (list, tuple)) or not all(
                isinstance(p, int) and not isinstance(p, bool) and p >= 0 for p in positions
            ):
                raise ValueError(
                    f"global_attention_positions must be a list of non-negative token positions, got {positions!r}."
                )
            if len(set(positions)) != len(positions):
                raise ValueError(f"global_attention_positions has repeated positions: {positions!r}.")

    @property
    def token_dropping_range(self) -> range:
        """The layers of `token_dropping_layers` (negative values counted from the end), empty without it."""
        if self.token_dropping_layers is None:
            return range(0)
        first, stop = self.token_dropping_layers
        return range(self.num_hidden_layers)[first:stop]

    @property
    def layer_types(self) -> list[str]:
        """Per layer, `"full_attention"` or `"sliding_attention"`, from `sliding_window` and
        `global_attn_every_n_layers` (derived, so the two can never disagree)."""
        if self.sliding_window is None:
            return ["full_attention"] * self.num_hidden_layers
        every = self.global_attn_every_n_layers
        return [
            "full_attention" if every is not None and i % every == 0 else "sliding_attention"
            for i in range(self.num_hidden_layers)
        ]


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_positive_int(value) -> bool:
    return _is_int(value) and value > 0


SineBertConfig.register_for_auto_class()

__all__ = ["SineBertConfig"]
