r"""Fine-tune sinebert for sequence classification: single texts or text pairs; single-label, multi-label or
regression targets.

    accelerate launch scripts/finetune_classification.py --model_name_or_path runs/pretrain \
        --train_file data/train.tsv --validation_file data/dev.tsv --output_dir runs/sst2

Arguments follow Hugging Face's run_glue_no_trainer.py (`--task_name sst2` loads GLUE from the hub); any of them can
also come from --config_file (YAML/JSON). The output folder serves `pipeline("text-classification", model=...)`.
"""

import argparse

from transformers import AutoModelForSequenceClassification

import sinebert  # noqa: F401  (registers the Auto classes)
from sinebert.training.arguments import parse_with_config_file
from sinebert.training.classification import (
    GLUE_TASKS,
    PROBLEM_TYPES,
    ClassificationEvaluation,
    classifier_pooling,
    example_count,
    load_classification_data,
    model_card,
    starting_config,
    to_standard_units,
)
from sinebert.training.errors import run_cli
from sinebert.training.finetune import (
    CLASSIFICATION_FGM,
    PaddingCollator,
    finetune_parser,
    finish,
    fit_schedule,
    load_model,
    make_dataloaders,
)
from sinebert.training.loop import Trainer, setup_accelerator, shutdown
from sinebert.training.models import load_tokenizer


def parse_args(argv=None) -> argparse.Namespace:
    parser = finetune_parser(__doc__, script="glue", max_length=128, batch_size=32,
                             adversarial_epsilon=CLASSIFICATION_FGM)
    group = parser.add_argument_group("classification")
    group.add_argument("--task_name", choices=sorted(GLUE_TASKS), help="A GLUE task, loaded from the hub.")
    group.add_argument("--text_column_name", help="Column of the (first) text (default: found by its usual name).")
    group.add_argument("--text_pair_column_name", help="Column of the second text of a pair (default: found).")
    group.add_argument("--label_column_name", help="Column of the labels (default: 'label', 'labels' or 'score').")
    group.add_argument(
        "--problem_type", choices=PROBLEM_TYPES,
        help="Default: multi-label for list-valued labels, regression for float labels, else single-label.",
    )
    group.add_argument(
        "--label_separator",
        help="Splits a text label cell into its labels, and makes text labels multi-label without --problem_type "
             "(default: ',' for multi-label).",
    )
    group.add_argument(
        "--classifier_pooling", choices=("cls", "mean"),
        help="What the classifier reads: the first token's vector or the mean over the tokens (default: a "
             "classifier checkpoint's own, else mean).",
    )
    return parse_with_config_file(parser, argv)


def main(argv=None):
    args = parse_args(argv)
    accelerator = setup_accelerator(args)
    tokenizer = load_tokenizer(args)
    data = load_classification_data(args, tokenizer, print_fn=accelerator.print)
    start = starting_config(args)
    model = load_model(AutoModelForSequenceClassification, args, tokenizer, **data.labels.config_values(),
                       classifier_pooling=classifier_pooling(args, start))
    to_standard_units(model, data.labels, start)  # regression trains on standardised targets (saved in y's units)
    fit_schedule(args, accelerator, len(data.train_rows))
    train_dataloader, eval_dataloader = make_dataloaders(
        args, accelerator, model.config, data.train_rows, data.eval_rows, PaddingCollator(tokenizer.pad_token_id)
    )
    evaluation = ClassificationEvaluation(eval_dataloader, accelerator, data)
    trainer = Trainer(args, accelerator, model, train_dataloader, evaluation.task(args, example_count))
    results = trainer.fit()
    model = finish(args, accelerator, trainer, tokenizer, evaluation, results, model_card(args, data))
    shutdown(accelerator, trainer, model)


if __name__ == "__main__":
    run_cli(main)
