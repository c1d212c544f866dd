"""Tokenizer and model loading shared by the scripts, with the checks that catch mismatches early."""

from pathlib import Path

from safetensors import SafetensorError
from transformers import AutoConfig, AutoTokenizer

from ..configuration_sinebert import (
    ATTENTION_INITS,
    MLP_TYPES,
    NORM_PLACEMENTS,
    POSITION_EMBEDDING_TYPES,
    SineBertConfig,
)
from ..tokenization_sinebert import CASE_INPUT, with_case_ids, without_case_ids
from .arguments import read_config_file
from .errors import UserError, one_line

SIZE_FLAGS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "norm_placement",
              "scale_embeddings", "hidden_act", "mlp_type", "bias", "attention_init", "position_embedding_type")
# Dropout is a training choice, not part of what a checkpoint learned: it applies over a checkpoint as well (the CPU
# cram pretrains without dropout and fine-tunes with it).
DROPOUT_FLAGS = ("hidden_dropout_prob", "attention_probs_dropout_prob")
# The attention layout also applies to a pretrained checkpoint: sinusoidal positions let a model pretrained with full
# attention at 128 tokens be fine-tuned with sliding-window layers on long inputs.
LAYOUT_FLAGS = ("sliding_window", "global_attn_every_n_layers", "global_attention_positions")
# Input features that fine-tuning can add to a pretrained checkpoint (their weights start at zero).
FEATURE_FLAGS = ("cross_segment_match", "letter_case")
# Token dropping, a pretraining choice like dropout (flags of scripts/pretrain.py only).
TOKEN_DROPPING_FLAGS = ("token_dropping_layers", "token_dropping_keep", "token_dropping_policy")


def add_size_arguments(parser):
    """Flags that size a model trained from scratch (defaults: SineBertConfig's, or --config_name's)."""
    group = parser.add_argument_group("model size (training from scratch)")
    group.add_argument("--hidden_size", type=int)
    group.add_argument("--num_hidden_layers", type=int)
    group.add_argument("--num_attention_heads", type=int)
    group.add_argument("--intermediate_size", type=int)
    group.add_argument("--norm_placement", choices=NORM_PLACEMENTS)
    group.add_argument("--hidden_act")
    group.add_argument("--mlp_type", choices=MLP_TYPES,
                       help="glu: a gated feed-forward layer, as ModernBERT's (SineBertConfig).")
    group.add_argument("--no_bias", dest="bias", action="store_false", default=None,
                       help="No biases in the encoder's linear layers and LayerNorms, as ModernBERT (SineBertConfig).")
    group.add_argument("--scale_embeddings", action="store_true", default=None)
    group.add_argument("--attention_init", choices=ATTENTION_INITS,
                       help="mimetic: attention starts by attending to similar and nearby tokens (SineBertConfig).")
    group.add_argument("--position_embedding_type", choices=POSITION_EMBEDDING_TYPES,
                       help="rotary: the sinusoids turn queries and keys instead of being added to the embeddings "
                            "(SineBertConfig).")
    group = parser.add_argument_group("dropout and attention layout (from scratch or over a checkpoint)")
    group.add_argument("--hidden_dropout_prob", type=float)
    group.add_argument("--attention_probs_dropout_prob", type=float)
    group.add_argument("--sliding_window", type=int,
                       help="Local attention: tokens seen on each side; 0 for full attention in every layer (drops "
                            "the window and global settings of a checkpoint).")
    group.add_argument("--global_attn_every_n_layers", type=int, help="With --sliding_window: layers 0, n, 2n... full.")
    group.add_argument("--global_attention_positions", type=int, nargs="+",
                       help="With --sliding_window: positions (e.g. 0 for [CLS]) that attend to and from every token.")
    group.add_argument("--cross_segment_match", action="store_true", default=None,
                       help="Mark the tokens of a pair whose id occurs in the other segment (SineBertConfig); on "
                            "by default in question answering.")
    group.add_argument("--no_cross_segment_match", dest="cross_segment_match", action="store_false",
                       help="Leave the mark out (drops it from a checkpoint that has it).")
    group.add_argument("--letter_case", action="store_true", default=None,
                       help="Give the model the letter case of each word, which a lower-cased vocabulary loses "
                            "(SineBertConfig); on by default in named-entity recognition.")
    group.add_argument("--no_letter_case", dest="letter_case", action="store_false",
                       help="Leave letter case out (drops it from a checkpoint that has it).")


def checkpoint_overrides(args) -> dict:
    """The config values the dropout, feature, token-dropping and layout flags set; `--sliding_window 0` means full
    attention everywhere."""
    flags = DROPOUT_FLAGS + FEATURE_FLAGS + TOKEN_DROPPING_FLAGS
    values = {k: getattr(args, k) for k in flags if getattr(args, k, None) is not None}
    if getattr(args, "sliding_window", None) == 0:
        return values | dict.fromkeys(LAYOUT_FLAGS)
    return values | {k: getattr(args, k) for k in LAYOUT_FLAGS if getattr(args, k, None) is not None}


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt")


def check_local_tokenizer(source: str, flag: str):
    """A path that is not there, or a folder without a tokenizer, gets a sentence about the path (transformers would
    answer with the hub's repo-name rules, or ask for sentencepiece)."""
    path = Path(source)
    looks_local = path.exists() or source.startswith((".", "/", "~")) or source.count("/") > 1
    if looks_local and not path.exists():
        raise UserError(f"{flag} {source} does not exist; give the folder scripts/train_tokenizer.py wrote.")
    if path.is_dir() and not any((path / name).is_file() for name in TOKENIZER_FILES):
        hint = " (a checkpoint step folder holds no tokenizer: give the run's output folder)" \
            if path.name.startswith("step_") else ""
        raise UserError(f"{flag} {source} holds no tokenizer (tokenizer.json){hint}; give the folder "
                        "scripts/train_tokenizer.py or a training script wrote.")


def load_tokenizer(args):
    source = args.tokenizer_name or args.model_name_or_path
    if not source:
        raise UserError(
            "Give a tokenizer with --tokenizer_name (train one with scripts/train_tokenizer.py) or a checkpoint "
            "with --model_name_or_path."
        )
    flag = "--tokenizer_name" if args.tokenizer_name else "--model_name_or_path"
    check_local_tokenizer(source, flag)
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=args.trust_remote_code)
    except (OSError, ValueError) as error:
        raise UserError(f"Could not load a tokenizer from {flag} {source}: {error}") from error
    if not tokenizer.is_fast:
        raise UserError(f"The tokenizer in {source} is not a fast tokenizer; offsets and word ids need one.")
    # --letter_case on or off decides; without it, a tokenizer saved with a case-reading model keeps returning case.
    if getattr(args, "letter_case", None):
        return with_case_ids(tokenizer)
    if getattr(args, "letter_case", None) is False:
        return without_case_ids(tokenizer)
    return tokenizer


def size_line(config) -> str:
    """The model's size as the model cards give it, e.g. "hidden 256, 4 layers, 4 heads, FFN 688 (GLU), vocabulary
    16000"."""
    ffn = f"{config.intermediate_size}{' (GLU)' if config.mlp_type == 'glu' else ''}"
    return (f"hidden {config.hidden_size}, {config.num_hidden_layers} layers, {config.num_attention_heads} heads, "
            f"FFN {ffn}, vocabulary {config.vocab_size}")


def scratch_config(args, tokenizer, **task_values) -> SineBertConfig:
    """A config for a model trained from scratch: --config_name (a folder or JSON/YAML file) and size flags."""
    values = {}
    if args.config_name:
        path = Path(args.config_name)
        if path.is_dir() or not path.suffix:
            values = AutoConfig.from_pretrained(args.config_name).to_dict()
        else:
            values = read_config_file(args.config_name)
        for key in ("architectures", "auto_map", "transformers_version", "model_type", "_name_or_path"):
            values.pop(key, None)
    values.update({k: getattr(args, k) for k in SIZE_FLAGS if getattr(args, k, None) is not None})
    values.update(checkpoint_overrides(args))
    values.setdefault("vocab_size", len(tokenizer))
    values["pad_token_id"] = tokenizer.pad_token_id
    values.update(task_values)
    try:
        config = SineBertConfig(**values)
    except (TypeError, ValueError) as error:
        raise UserError(f"Invalid model configuration: {error}") from error
    check_tokenizer(config, tokenizer)
    return config


def check_tokenizer(config, tokenizer):
    if len(tokenizer) > config.vocab_size:
        raise UserError(
            f"The tokenizer has {len(tokenizer)} tokens but the model's vocab_size is {config.vocab_size}; ids "
            "beyond it would crash training. Use the tokenizer the model was trained with, or a larger vocab_size."
        )
    if config.letter_case != (CASE_INPUT in tokenizer.model_input_names):
        model, tokens = ("reads", "does not return") if config.letter_case else ("does not read", "returns")
        raise UserError(
            f"The model {model} letter case (letter_case in its config) but the tokenizer {tokens} case_ids; pass "
            "--letter_case or --no_letter_case to choose for both."
        )


def check_architecture(args) -> SineBertConfig:
    """The config of --model_name_or_path; UserError before anything is built when it is another architecture than
    sinebert (its config would lack sinebert's settings, and the scripts' options would fail deep inside it)."""
    try:
        config = AutoConfig.from_pretrained(args.model_name_or_path, trust_remote_code=args.trust_remote_code)
    except (OSError, ValueError) as error:
        reason = one_line(error, 300)
        raise UserError(f"Could not load a config from --model_name_or_path {args.model_name_or_path}: {reason}") \
            from None
    if config.model_type != SineBertConfig.model_type:
        raise UserError(
            f"--model_name_or_path {args.model_name_or_path} holds a {config.model_type} model; these scripts train "
            "and fine-tune sinebert checkpoints (from scripts/pretrain.py, or any folder saved by a sinebert model). "
            "Start from one of those, or from scratch without --model_name_or_path."
        )
    return config


def load_pretrained(auto_class, args, tokenizer, **config_values):
    """`auto_class.from_pretrained(--model_name_or_path)` with `config_values` applied, or from scratch."""
    attn = {"attn_implementation": args.attn_implementation} if args.attn_implementation else {}
    if not args.model_name_or_path:
        return auto_class.from_config(scratch_config(args, tokenizer, **config_values), **attn)
    path = Path(args.model_name_or_path)
    check_architecture(args)
    if path.is_dir() and not list(path.glob("*.safetensors")) and list(path.glob("*.bin")):
        if not args.allow_pickle_weights:
            raise UserError(
                f"{path} holds only pickle weights (*.bin), and loading a pickle can run arbitrary code; convert "
                "them to safetensors, or pass --allow_pickle_weights if you trust whoever wrote them."
            )
    try:
        model = auto_class.from_pretrained(
            args.model_name_or_path, trust_remote_code=args.trust_remote_code,
            use_safetensors=None if args.allow_pickle_weights else True, **checkpoint_overrides(args), **config_values,
            **attn,
        )
        if isinstance(model.config, SineBertConfig):
            model.config._validate()  # from_pretrained sets the flags' values after the config's own checks
    except (OSError, SafetensorError) as error:
        reason = one_line(error, 300)
        raise UserError(
            f"Could not load a model from --model_name_or_path {args.model_name_or_path}: {reason} (a damaged or "
            "truncated weights file reads this way; save or copy the checkpoint again)."
        ) from None
    except ValueError as error:  # a flag's value the checkpoint's config rejects
        raise UserError(f"Invalid model configuration over {args.model_name_or_path}: {error}") from error
    check_tokenizer(model.config, tokenizer)
    return model
