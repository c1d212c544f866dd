r"""Fine-tune sinebert for named-entity recognition (token classification) on CoNLL-style, json / jsonl or hub data.

    accelerate launch scripts/finetune_ner.py --model_name_or_path runs/pretrain \
        --train_file conll2003/train.txt --validation_file conll2003/valid.txt --output_dir runs/ner

Arguments follow Hugging Face's run_ner_no_trainer.py; any of them can also come from --config_file (YAML/JSON).
Scores are entity-level precision/recall/F1 (seqeval, strict IOB2). The output folder serves
`pipeline("token-classification", model=...)`.
"""

import argparse

from transformers import AutoModelForTokenClassification

import sinebert  # noqa: F401  (registers the Auto classes)
from sinebert.training.arguments import parse_with_config_file
from sinebert.training.errors import run_cli
from sinebert.training.finetune import (
    PaddingCollator,
    finetune_parser,
    finish,
    fit_schedule,
    load_model,
    make_dataloaders,
)
from sinebert.training.loop import Trainer, setup_accelerator, shutdown
from sinebert.training.models import load_tokenizer
from sinebert.training.ner import SCHEMES, NerEvaluation, labelled_token_count, load_ner_data, model_card


def parse_args(argv=None) -> argparse.Namespace:
    parser = finetune_parser(__doc__, script="ner", max_length=128, batch_size=32)
    group = parser.add_argument_group("named-entity recognition")
    group.add_argument("--text_column_name", help="json / hub data: the column of token lists (default: 'tokens').")
    group.add_argument("--label_column_name", help="json / hub data: the column of tag lists (default: 'ner_tags').")
    group.add_argument("--conll_token_column", type=int, default=0, help="CoNLL files: the token column (from 0).")
    group.add_argument("--conll_tag_column", type=int, default=-1, help="CoNLL files: the tag column (-1: the last).")
    group.add_argument(
        "--label_scheme", choices=SCHEMES, default="IOB2",
        help="Tag scheme of the data; IOB1 is converted to IOB2, which the model learns and is scored in.",
    )
    group.add_argument(
        "--label_all_tokens", action="store_true",
        help="Train every sub-token of a word on its tag, not only the first one.",
    )
    group.add_argument(
        "--document_context", action="store_true",
        help="Fill each row with consecutive sentences of one document (CoNLL files: between -DOCSTART- lines; "
             "json / hub rows: in their order), up to --max_length tokens, so that a word is tagged seeing its "
             "neighbouring sentences.",
    )
    # Names are capitalised: the model gets the letter case that the lower-cased vocabulary drops.
    parser.set_defaults(letter_case=True)
    return parse_with_config_file(parser, argv)


def main(argv=None):
    args = parse_args(argv)
    accelerator = setup_accelerator(args)
    tokenizer = load_tokenizer(args)
    data = load_ner_data(args, tokenizer, print_fn=accelerator.print)
    model = load_model(
        AutoModelForTokenClassification, args, tokenizer, num_labels=len(data.names),
        id2label=dict(enumerate(data.names)), label2id={name: i for i, name in enumerate(data.names)},
    )
    fit_schedule(args, accelerator, len(data.train_rows))
    collate = PaddingCollator(tokenizer.pad_token_id, token_labels=True)
    train_dataloader, eval_dataloader = make_dataloaders(
        args, accelerator, model.config, data.train_rows, data.eval_rows, collate
    )
    evaluation = NerEvaluation(eval_dataloader, accelerator, data)
    trainer = Trainer(args, accelerator, model, train_dataloader, evaluation.task(args, labelled_token_count))
    results = trainer.fit()
    model = finish(args, accelerator, trainer, tokenizer, evaluation, results, model_card(args, data))
    shutdown(accelerator, trainer, model)


if __name__ == "__main__":
    run_cli(main)
