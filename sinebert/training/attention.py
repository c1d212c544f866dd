"""Attention heatmaps: what every head of every layer of a saved checkpoint attends to for one text."""

from pathlib import Path

import torch
from transformers import AutoModel, AutoTokenizer
from transformers.utils import logging as hf_logging

from .errors import UserError
from .reporting import pyplot


def attention_maps(model_dir: str | Path, text: str, max_length: int = 64,
                   trust_remote_code: bool = False) -> tuple[list[str], torch.Tensor]:
    """The tokens of `text` and the attention weights `(layers, heads, tokens, tokens)` of the checkpoint's encoder.

    The model is loaded with the eager kernel, the one that returns attention weights; rows are the attending
    (query) tokens, columns the attended (key) tokens, and each row sums to 1.
    """
    if not text.strip():
        raise UserError("--text is empty; give a sentence to visualise.")
    try:
        tokenizer = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=trust_remote_code)
        model = load_encoder(model_dir, trust_remote_code)
    except (OSError, ValueError) as error:
        raise UserError(f"Could not load a model and tokenizer from {model_dir}: {error}") from error
    model.eval()
    inputs = tokenizer(text, return_tensors="pt", truncation=True, max_length=max_length)
    with torch.no_grad():
        outputs = model(**inputs, output_attentions=True)
    weights = torch.stack([layer[0] for layer in outputs.attentions])  # (layers, heads, tokens, tokens)
    return tokenizer.convert_ids_to_tokens(inputs["input_ids"][0].tolist()), weights.float()


def load_encoder(model_dir: str | Path, trust_remote_code: bool = False):
    """The bare encoder of any checkpoint, with the eager kernel. A task checkpoint's head weights are left out on
    purpose, so the loading report that lists them is silenced."""
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        return AutoModel.from_pretrained(model_dir, attn_implementation="eager", trust_remote_code=trust_remote_code)
    finally:
        hf_logging.set_verbosity(verbosity)


def plot_attention_grid(tokens: list[str], weights: torch.Tensor, output: str | Path, title: str) -> Path:
    """One PNG: a heatmap per (layer, head), layers as rows and heads as columns, tokens on both axes, one colour
    scale for all of them."""
    layers, heads = weights.shape[:2]
    top = float(weights.max())
    cell = min(2.6, 22 / max(heads, layers))  # inches per heatmap; large models stay a readable size
    plt = pyplot()
    figure, axes = plt.subplots(layers, heads, figsize=(cell * heads + 0.8, cell * layers + 0.9), squeeze=False)
    font = max(3.0, min(7.0, 150 / max(len(tokens), 1) * cell / 2.6))
    for layer in range(layers):
        for head in range(heads):
            axis = axes[layer][head]
            image = axis.imshow(weights[layer, head].numpy(), cmap="viridis", vmin=0.0, vmax=top)
            axis.set_xticks(range(len(tokens)), tokens, rotation=90, fontsize=font)
            axis.set_yticks(range(len(tokens)), tokens, fontsize=font)
            axis.tick_params(length=0)
            show_x, show_y = layer == layers - 1, head == 0
            if not show_x:
                axis.set_xticklabels([])
            if not show_y:
                axis.set_yticklabels([])
            axis.set_title(f"layer {layer + 1}, head {head + 1}", fontsize=8)
    figure.suptitle(title, fontsize=10)
    figure.tight_layout(rect=(0, 0, 0.9, 1))
    colorbar = figure.colorbar(image, cax=figure.add_axes((0.915, 0.3, 0.012, 0.4)))
    colorbar.set_label("attention weight", fontsize=8)
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(output, dpi=110)
    plt.close(figure)
    return output
