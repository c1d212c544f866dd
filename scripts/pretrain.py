r"""Pretrain sinebert with masked language modelling, or with replaced-token detection (`--objective rtd`, ELECTRA).

    accelerate launch scripts/pretrain.py --train_file corpus/*.txt --tokenizer_name runs/tokenizer \
        --output_dir runs/pretrain --max_seq_length 128 --per_device_train_batch_size 32 --max_train_steps 2000

Arguments follow Hugging Face's run_mlm_no_trainer.py; any of them can also come from --config_file (YAML/JSON).
"""

import argparse
import math
from functools import partial
from pathlib import Path

import torch
from transformers import AutoModelForMaskedLM, AutoModelForPreTraining

import sinebert  # noqa: F401  (registers the Auto classes)
from sinebert.configuration_sinebert import TOKEN_DROPPING_POLICIES
from sinebert.training.arguments import (
    ArgumentParser,
    add_data_arguments,
    add_example_script_arguments,
    add_model_arguments,
    add_training_arguments,
    parse_with_config_file,
)
from sinebert.training.data import hold_out_validation, load_splits, pick_column
from sinebert.training.embeddings import init_word_embeddings
from sinebert.training.errors import SharedUserError, run_cli
from sinebert.training.hub import add_hub_arguments, push_folder
from sinebert.training.loop import Task, Trainer, check_step_memory, save_final, setup_accelerator, shutdown
from sinebert.training.mlm import (
    MaskingCollator,
    StreamingBlocks,
    evaluate_mlm,
    masked_token_count,
    mixed_lengths,
    pack_dataset,
    trace_blocks,
)
from sinebert.training.models import add_size_arguments, load_pretrained, load_tokenizer, size_line
from sinebert.training.reporting import write_model_card
from sinebert.training.rtd import (
    DISCRIMINATOR_WEIGHT,
    GENERATOR_FRACTION,
    GENERATOR_TEMPERATURE,
    ReplacedTokenDetection,
    discriminator_of,
)
from sinebert.training.sharding import fsdp_requested


def parse_args(argv=None) -> argparse.Namespace:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_example_script_arguments(parser, "mlm")
    add_hub_arguments(parser)
    add_data_arguments(parser)
    add_model_arguments(parser)
    add_size_arguments(parser)
    add_training_arguments(parser, learning_rate=5e-4, batch_size=32, epochs=1)
    group = parser.add_argument_group("masked language modelling")
    group.add_argument("--max_seq_length", type=int, default=128, help="Tokens per packed block.")
    group.add_argument(
        "--max_train_tokens", type=int,
        help="Train on this many tokens: the optimizer steps are this over the tokens of a step (blocks per process x "
             "processes x accumulation x --max_seq_length), so that a run does the same work on any machine; instead "
             "of --max_train_steps and --num_train_epochs (--max_train_minutes stays a cap).",
    )
    group.add_argument(
        "--short_seq_length", type=int,
        help="Mix sequence lengths: on a share --short_seq_probability of the steps, cut the --max_seq_length blocks "
             "into blocks of this many tokens (same tokens per step), as BERT pretrained mostly at 128 tokens and "
             "sometimes at 512. Validation uses --max_seq_length.",
    )
    group.add_argument("--short_seq_probability", type=float, default=0.9,
                       help="With --short_seq_length: the share of steps that use the short blocks.")
    group.add_argument("--mlm_probability", type=float, default=0.15, help="Share of tokens to mask.")
    group.add_argument(
        "--objective", choices=("mlm", "rtd"), default="mlm",
        help="mlm: masked language modelling; rtd: replaced-token detection (ELECTRA): a small generator fills the "
             "masked positions and the model learns at every token whether it was replaced. The saved model is the "
             "discriminator (SineBertForPreTraining), which every Auto head loads.",
    )
    group.add_argument("--generator_fraction", type=float, default=GENERATOR_FRACTION,
                       help=f"With --objective rtd: the generator's width as a share of the model's "
                            f"(default {GENERATOR_FRACTION}).")
    group.add_argument("--discriminator_weight", type=float, default=DISCRIMINATOR_WEIGHT,
                       help=f"With --objective rtd: the weight of the detection loss against the generator's "
                            f"masked-LM loss (default {DISCRIMINATOR_WEIGHT:g}, ELECTRA's).")
    group.add_argument("--generator_temperature", type=float, default=GENERATOR_TEMPERATURE,
                       help=f"With --objective rtd: the temperature the generator's replacements are sampled at "
                            f"(default {GENERATOR_TEMPERATURE:g}); above 1 they are easier to detect.")
    group.add_argument(
        "--token_dropping_layers", type=int, nargs=2, metavar=("FIRST", "STOP"),
        help="Token dropping (SineBertConfig): layers FIRST to STOP - 1 compute only the masked tokens and a share of "
             "the others while training; negative values count from the end (1 -1: all but the first and last).",
    )
    group.add_argument("--token_dropping_keep", type=float,
                       help="With --token_dropping_layers: the share of each block those layers compute (0.5).")
    group.add_argument("--token_dropping_policy", choices=TOKEN_DROPPING_POLICIES,
                       help="With --token_dropping_layers: which unmasked tokens they keep, drawn at random (the "
                            "default) or those whose token id has the highest running masked-LM loss.")
    group.add_argument(
        "--init_word_embeddings", metavar="PATH",
        help="Start from scratch with these word embeddings (scripts/train_word_embeddings.py, same tokenizer): "
             "the encoder then leaves the frequency-only plateau of MLM sooner.",
    )
    group.add_argument("--text_column_name", help="Column of csv/json data holding the text (default: 'text').")
    group.add_argument("--streaming", action="store_true", help="Stream data larger than memory.")
    group.add_argument(
        "--streaming_validation_examples", type=int, default=1000,
        help="With --streaming and no validation data: hold out this many leading examples.",
    )
    return parse_with_config_file(parser, argv)


def load_blocks(args, accelerator, tokenizer):
    """Packed train and validation blocks; streamed data stays lazy and is split between processes."""
    splits = load_splits(args, streaming=args.streaming)
    text_column = pick_column(
        list(splits["train"].column_names or ["text"]), args.text_column_name, ("text", "sentence", "content"),
        "--text_column_name", "text",
    )
    if args.streaming:
        train = splits["train"]
        validation = splits.get("validation")
        if validation is None:
            validation = train.take(args.streaming_validation_examples)
            train = train.skip(args.streaming_validation_examples)
        if args.max_eval_samples:
            validation = validation.take(args.max_eval_samples)
        # Validation is small: materialise it so every process evaluates the same, evenly sharded blocks.
        validation = pack_dataset(_materialise(validation), tokenizer, args.max_seq_length, text_column)
        train = pack_dataset(train, tokenizer, args.max_seq_length, text_column)
        if args.max_train_samples:
            train = train.take(args.max_train_samples)  # blocks, as without --streaming
        return StreamingBlocks(train, accelerator.process_index, accelerator.num_processes), validation
    splits, _ = hold_out_validation(splits, args.validation_split_percentage, args.seed)
    with accelerator.main_process_first():
        blocks = {
            name: pack_dataset(split, tokenizer, args.max_seq_length, text_column, args.preprocessing_num_workers,
                               use_cache=not args.overwrite_cache)
            for name, split in splits.items()
            if name in ("train", "validation")
        }
    if args.max_train_samples:
        blocks["train"] = blocks["train"].select(range(min(args.max_train_samples, len(blocks["train"]))))
    if args.max_eval_samples:
        blocks["validation"] = blocks["validation"].select(range(min(args.max_eval_samples, len(blocks["validation"]))))
    return blocks["train"], blocks["validation"]


def steps_for_tokens(args, accelerator) -> None:
    """Turn --max_train_tokens into --max_train_steps: every step trains full packed blocks of --max_seq_length."""
    if args.max_train_tokens is None:
        return
    given = [f"--{name} {getattr(args, name)}" for name in ("max_train_steps", "num_train_epochs")
             if getattr(args, name) is not None]
    if given:
        raise SharedUserError(f"--max_train_tokens {args.max_train_tokens} and {' and '.join(given)} both say how "
                              "long to train; pass only one of them.")
    per_step = (args.per_device_train_batch_size * accelerator.num_processes * args.gradient_accumulation_steps
                * args.max_seq_length)
    args.max_train_steps = math.ceil(args.max_train_tokens / per_step)
    accelerator.print(f"--max_train_tokens {args.max_train_tokens:,}: {args.max_train_steps:,} steps of "
                      f"{per_step:,} tokens.")


def build_model(args, tokenizer):
    """The masked-LM model (its head predicting only the masked tokens), or for --objective rtd the discriminator
    with its generator. Either checkpoint's config says that a classifier built from it reads the mean of the token
    vectors, as the classification script's default does (docs/QUALITY.md, "Pooling"), so that
    `AutoModelForSequenceClassification.from_pretrained` outside the scripts gets it too."""
    pooling = {"classifier_pooling": "mean"}
    if args.objective == "mlm":
        return load_pretrained(AutoModelForMaskedLM, args, tokenizer, sparse_prediction=True, **pooling)
    if args.token_dropping_layers is not None:
        raise SharedUserError("--token_dropping_layers does not apply to --objective rtd: the discriminator learns "
                              "from every token, so no layer may drop any; leave it out, or use --objective mlm.")
    if fsdp_requested():
        raise SharedUserError("--objective rtd does not run under FSDP yet (the generator shares the discriminator's "
                              "word embeddings across FSDP units); launch it with a data-parallel config.")
    discriminator = load_pretrained(AutoModelForPreTraining, args, tokenizer, **pooling)
    return ReplacedTokenDetection(discriminator, args.generator_fraction, args.discriminator_weight,
                                  args.mlm_probability, args.generator_temperature)


def _materialise(iterable):
    from datasets import Dataset

    return Dataset.from_list(list(iterable))


def main(argv=None):
    args = parse_args(argv)
    accelerator = setup_accelerator(args)
    steps_for_tokens(args, accelerator)
    tokenizer = load_tokenizer(args)
    reshape = mixed_lengths(args, tokenizer.pad_token_id)
    model = build_model(args, tokenizer)
    for flag in ("token_dropping_keep", "token_dropping_policy"):
        if getattr(args, flag) is not None and model.config.token_dropping_layers is None:
            raise SharedUserError(
                f"--{flag} {getattr(args, flag)} needs --token_dropping_layers (or a checkpoint that has them), the "
                "layers that compute only a share of the tokens."
            )
    if model.config.letter_case:
        raise SharedUserError(
            "Pretraining cannot give the model letter case: it packs token ids without the text that case_ids come "
            "from. Pass --no_letter_case (a checkpoint's case vectors are dropped) and turn it on when fine-tuning."
        )
    if args.init_word_embeddings:
        init_word_embeddings(model, args.init_word_embeddings, tokenizer, from_checkpoint=bool(args.model_name_or_path))
    train_blocks, validation_blocks = load_blocks(args, accelerator, tokenizer)
    rows = args.per_device_train_batch_size if args.streaming else min(args.per_device_train_batch_size,
                                                                       len(train_blocks))
    longest = args.max_seq_length if args.streaming else len(train_blocks[0]["input_ids"])  # blocks are full
    check_step_memory(model.config, rows, longest, f"--max_seq_length {args.max_seq_length} with "
                      f"--per_device_train_batch_size {args.per_device_train_batch_size}", accelerator.device)

    rtd = args.objective == "rtd"
    collator = MaskingCollator(tokenizer, args.mlm_probability, seed=args.seed, sample_noise=rtd)
    train_dataloader = torch.utils.data.DataLoader(
        train_blocks, batch_size=args.per_device_train_batch_size, shuffle=not args.streaming, collate_fn=collator,
        generator=torch.Generator().manual_seed(args.seed),
    )
    eval_dataloader = accelerator.prepare(torch.utils.data.DataLoader(
        validation_blocks, batch_size=args.per_device_eval_batch_size or args.per_device_train_batch_size,
        collate_fn=MaskingCollator(tokenizer, args.mlm_probability, seed=args.seed, epoch=None, sample_noise=rtd),
    ))
    task = Task(
        count=masked_token_count,
        evaluate=partial(evaluate_mlm, dataloader=eval_dataloader, accelerator=accelerator),
        main_metric="eval_loss",
        plot_metrics=("eval_accuracy",),
        trace=trace_blocks,
        reshape=reshape,
    )
    trainer = Trainer(args, accelerator, model, train_dataloader, task, streaming=args.streaming, evaluate_first=True)
    results = trainer.fit()
    objective = "replaced-token detection" if rtd else "masked-language-model"
    trainer.plot(f"sinebert {objective} pretraining")
    model = discriminator_of(trainer.unwrapped_model())
    save_final(accelerator, model, tokenizer, args.output_dir, results)
    if accelerator.is_main_process:
        write_model_card(
            Path(args.output_dir), args,
            title=f"sinebert ({objective} pretrained)",
            summary=f"A sinebert encoder pretrained with {objective} by `scripts/pretrain.py`"
                    + (" (ELECTRA's discriminator; fine-tune it with any Auto head)." if rtd else "."),
            pipeline_tag="feature-extraction" if rtd else "fill-mask",
            call='pipe("the capital of france is paris .")' if rtd
            else f'pipe("the capital of france is {tokenizer.mask_token} .")',
            results=results,
            details={
                "data": args.dataset_name or ", ".join(Path(f).name for f in args.train_file or []),
                "size": size_line(model.config),
                "steps": f"{results['train_steps']} of batch {args.per_device_train_batch_size} x "
                         f"{accelerator.num_processes} processes x {args.gradient_accumulation_steps} accumulation",
                "word embeddings": Path(args.init_word_embeddings or args.model_name_or_path or "random").name,
                "sequence length": args.max_seq_length,
                "objective": objective + (f" (generator {args.generator_fraction:g} of the width, detection loss "
                                          f"weight {args.discriminator_weight:g}, samples at temperature "
                                          f"{args.generator_temperature:g})" if rtd else ""),
                "masking": f"{args.mlm_probability:.0%} of tokens (80% [MASK], 10% random, 10% unchanged)",
                "learning rate": f"{args.learning_rate} ({args.lr_scheduler_type} schedule)",
                "mixed precision": accelerator.mixed_precision,
            },
        )
        push_folder(args, Path(args.output_dir))
    shutdown(accelerator, trainer, model)


if __name__ == "__main__":
    run_cli(main)
