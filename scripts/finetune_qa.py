r"""Fine-tune sinebert for extractive question answering on SQuAD-format JSON, its flattened json / jsonl form or a
hub dataset.

    accelerate launch scripts/finetune_qa.py --model_name_or_path runs/pretrain \
        --train_file squad/train-v1.1.json --validation_file squad/dev-v1.1.json --output_dir runs/qa

Arguments follow Hugging Face's run_qa_no_trainer.py; any of them can also come from --config_file (YAML/JSON).
Scores are exact match and F1 with the official SQuAD normalisation; eval_predictions.json maps question ids to
answers. The output folder serves `pipeline("question-answering", model=..., trust_remote_code=True)` with or without
sinebert installed, and answers as the evaluation did: the config stores the run's --max_seq_length, --doc_stride
and --max_answer_length as the pipeline's defaults.
"""

import argparse

from transformers import AutoModelForQuestionAnswering

import sinebert  # noqa: F401  (registers the Auto classes and the QA pipeline)
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
from sinebert.training.qa import QAEvaluation, load_qa_data, model_card, pipeline_settings, window_count


def parse_args(argv=None) -> argparse.Namespace:
    parser = finetune_parser(__doc__, script="qa", max_length=384, batch_size=16)
    group = parser.add_argument_group("question answering")
    group.add_argument("--doc_stride", type=int, default=128, help="Tokens shared by consecutive context windows.")
    group.add_argument("--max_answer_length", type=int, default=30, help="Longest answer, in tokens.")
    group.add_argument("--n_best_size", type=int, default=20, help="Candidate answers kept per question.")
    group.add_argument(
        "--version_2_with_negative", action="store_true",
        help="SQuAD v2-style data: questions may have no answer, and 'no answer' competes with the best span.",
    )
    group.add_argument(
        "--train_answer_windows_only", action="store_true",
        help="Train only on the context windows that hold the answer, not on the other windows of an answered "
             "question (which teach the model to point at [CLS]); questions without an answer keep all their windows.",
    )
    group.add_argument("--question_column_name", help="json / hub data: the question column (default 'question').")
    group.add_argument("--context_column_name", help="json / hub data: the context column (default 'context').")
    group.add_argument("--answer_column_name", help="json / hub data: the answers column (default 'answers').")
    # The context tokens that the question uses locate most answers; the model marks them (SineBertConfig
    # cross_segment_match): squad_eval F1 29.3 against 12.6 without, on the CPU cram (README). Names are capitalised
    # in most contexts, and the lower-cased vocabulary drops that (letter_case): F1 +1.0 and +1.3 from two checkpoints.
    parser.set_defaults(cross_segment_match=True, letter_case=True)
    return parse_with_config_file(parser, argv)


def main(argv=None):
    args = parse_args(argv)
    accelerator = setup_accelerator(args)
    tokenizer = load_tokenizer(args)
    data = load_qa_data(args, tokenizer)
    model = load_model(AutoModelForQuestionAnswering, args, tokenizer)
    model.config.task_specific_params = {"question-answering": pipeline_settings(args)}
    fit_schedule(args, accelerator, len(data.train_rows))
    train_dataloader, eval_dataloader = make_dataloaders(
        args, accelerator, model.config, data.train_rows, data.eval_rows, PaddingCollator(tokenizer.pad_token_id)
    )
    evaluation = QAEvaluation(
        eval_dataloader, accelerator, data, args.n_best_size, args.max_answer_length, args.version_2_with_negative
    )
    trainer = Trainer(args, accelerator, model, train_dataloader, evaluation.task(args, window_count))
    results = trainer.fit()
    model = finish(args, accelerator, trainer, tokenizer, evaluation, results, model_card(args, data))
    shutdown(accelerator, trainer, model)


if __name__ == "__main__":
    run_cli(main)
