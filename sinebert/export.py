"""Export a sinebert model for serving: `torch.export` and ONNX (the dynamo exporter), with the batch size and the
sequence length dynamic, so that one graph serves padded batches of any shape.

    from sinebert.export import export_onnx
    export_onnx(AutoModelForSequenceClassification.from_pretrained("runs/sst2"), "sst2.onnx")

The exported graph takes the padded path of the model (the eager reference's layout, with the model's own
attention kernel on every position), which depends on shapes only; its outputs equal the eager model's at every real
token. ONNX export needs the `onnx` extra (`pip install ".[onnx]"`: onnx and onnxscript; onnxruntime to run it).
"""

from pathlib import Path

import torch
from torch import nn

# The outputs of each head, in the order `return_dict=False` returns them without labels.
OUTPUT_NAMES = {
    "SineBertModel": ("last_hidden_state",),
    "SineBertForMaskedLM": ("logits",),
    "SineBertForSequenceClassification": ("logits",),
    "SineBertForTokenClassification": ("logits",),
    "SineBertForQuestionAnswering": ("start_logits", "end_logits"),
}


class ExportableModel(nn.Module):
    """A head with positional tensor inputs and a tuple of tensors out, as exporters take them."""

    def __init__(self, model: nn.Module):
        super().__init__()
        name = type(model).__name__
        if name not in OUTPUT_NAMES:
            raise ValueError(f"{name} is not a sinebert head; export one of {sorted(OUTPUT_NAMES)}.")
        if model.config.output_attentions or model.config.output_hidden_states:
            raise ValueError(
                "The model's config asks for attentions or hidden states, which the exported graph does not return; "
                "set config.output_attentions and config.output_hidden_states to False."
            )
        self.model = model.eval()
        self.input_names = input_names(model.config)
        self.output_names = OUTPUT_NAMES[name]

    def forward(self, input_ids, attention_mask, token_type_ids=None, case_ids=None) -> tuple[torch.Tensor, ...]:
        """Each input `(batch, seq)`; the graph takes those of `input_names(config)`, in that order."""
        inputs = {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids,
                  "case_ids": case_ids}
        outputs = self.model(**{k: v for k, v in inputs.items() if v is not None}, return_dict=False)
        return tuple(outputs[: len(self.output_names)])


def input_names(config) -> tuple[str, ...]:
    """What the graph takes, each `(batch, seq)` int64: ids, padding mask, segments, and letter case if it reads it."""
    return ("input_ids", "attention_mask", "token_type_ids") + (("case_ids",) if config.letter_case else ())


def example_inputs(config, batch: int = 2, seq: int = 16) -> tuple[torch.Tensor, ...]:
    """Inputs to trace with: a padded batch (row 1 shorter), two segments, ids above the special tokens."""
    generator = torch.Generator().manual_seed(0)
    values = {
        "input_ids": torch.randint(min(5, config.vocab_size - 1), config.vocab_size, (batch, seq), generator=generator),
        "attention_mask": torch.ones(batch, seq, dtype=torch.long),
        "token_type_ids": (torch.arange(seq) >= seq // 2).long().expand(batch, seq).clone(),
        "case_ids": torch.randint(0, 3, (batch, seq), generator=generator),
    }
    values["attention_mask"][1:, seq - seq // 4:] = 0
    return tuple(values[name] for name in input_names(config))


def dynamic_shapes(names: tuple[str, ...]) -> tuple[dict, ...]:
    batch, seq = torch.export.Dim("batch", min=1), torch.export.Dim("sequence", min=2)
    return tuple({0: batch, 1: seq} for _ in names)


def export_program(model: nn.Module) -> torch.export.ExportedProgram:
    """`torch.export.export` of `model` (any sinebert head) with dynamic batch and sequence length; the program's
    module takes the tensors of `input_names(model.config)` in order and returns a tuple of the head's outputs."""
    wrapper = ExportableModel(model)
    inputs = example_inputs(model.config)
    with torch.no_grad():
        return torch.export.export(wrapper, inputs, dynamic_shapes=dynamic_shapes(wrapper.input_names), strict=False)


def export_onnx(model: nn.Module, output_file: str | Path, opset_version: int = 18) -> Path:
    """ONNX graph of `model` (any sinebert head), from `torch.export`, with dynamic batch and sequence axes; inputs
    and outputs named as the Hugging Face head names them. Returns the file's path."""
    try:
        import onnx  # noqa: F401
        import onnxscript  # noqa: F401
    except ImportError as error:
        raise ImportError(
            f"ONNX export needs onnx and onnxscript ({error.name} is missing); install sinebert's onnx extra: "
            'pip install ".[onnx]".'
        ) from None
    wrapper = ExportableModel(model)
    output_file = Path(output_file)
    output_file.parent.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        program = torch.onnx.export(
            wrapper, example_inputs(model.config), dynamo=True, input_names=list(wrapper.input_names),
            output_names=list(wrapper.output_names), dynamic_shapes=dynamic_shapes(wrapper.input_names),
            opset_version=opset_version, optimize=True, verbose=False,
        )
    program.save(str(output_file))
    return output_file
