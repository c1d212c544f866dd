"""`--push_to_hub`: the final folder goes to the Hugging Face hub at the end of a run, and a run that could not
upload fails before it trains, not after."""

from pathlib import Path

from .errors import UserError, one_line

# What a run folder holds that is not the model: resumable checkpoints, the best weights kept during training, the
# data traces of --trace_data, temporary folders of a save in progress, and the run's lock.
NOT_UPLOADED = ["checkpoints/**", "best_model.safetensors", "data_trace_rank*.jsonl", ".tmp*", ".tmp*/**",
                ".sinebert.lock"]


def add_hub_arguments(parser):
    group = parser.add_argument_group("hub (as in Hugging Face's example scripts)")
    group.add_argument("--push_to_hub", action="store_true",
                       help="Upload the final folder (model, tokenizer, card, results) to --hub_model_id at the end; "
                            "the hub and the token are checked before training starts.")
    group.add_argument("--hub_model_id", help="The repository to push to, e.g. your-name/sinebert-sst2.")
    group.add_argument("--hub_token", help="A write token (default: the one `hf auth login` saved, or HF_TOKEN).")


def check_hub(args):
    """With --push_to_hub: one sentence now if the upload could not happen later (no repository name, offline, no
    token, the hub unreachable); else nothing."""
    if not getattr(args, "push_to_hub", False):
        return
    if not args.hub_model_id:
        raise UserError("--push_to_hub needs --hub_model_id, the repository to upload to (e.g. your-name/my-model).")
    from huggingface_hub import HfApi, constants, get_token

    if constants.HF_HUB_OFFLINE:
        raise UserError(
            "--push_to_hub cannot upload while HF_HUB_OFFLINE is set; unset it, or train without --push_to_hub and "
            "upload the folder later with `hf upload`."
        )
    token = args.hub_token or get_token()
    if not token:
        raise UserError("--push_to_hub needs a Hugging Face token: run `hf auth login`, set HF_TOKEN, or pass "
                        "--hub_token.")
    try:
        HfApi(token=token).whoami()
    except Exception as error:  # any failure of the request: network, authentication, server
        reason = one_line(error, 200)
        raise UserError(
            f"--push_to_hub: the hub did not accept the token ({type(error).__name__}: {reason}); check the network "
            "and the token before training, or drop --push_to_hub."
        ) from None


def push_folder(args, folder: Path):
    """Upload `folder` (the run's final model) to --hub_model_id, creating the repository if needed."""
    if not getattr(args, "push_to_hub", False):
        return
    from huggingface_hub import HfApi

    api = HfApi(token=args.hub_token)
    api.create_repo(args.hub_model_id, exist_ok=True)
    api.upload_folder(repo_id=args.hub_model_id, folder_path=str(folder), ignore_patterns=NOT_UPLOADED,
                      commit_message=f"sinebert: {Path(folder).name}")
    print(f"Uploaded {folder} to https://huggingface.co/{args.hub_model_id}")
