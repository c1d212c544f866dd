"""Every head exports with torch.export and to ONNX with dynamic batch and sequence axes, and the exported graph
equals the eager model on padded batches of shapes it was not traced with."""

import json

import onnxruntime
import pytest
import torch
from transformers import BertConfig, BertModel

from sinebert import (
    SineBertForMaskedLM,
    SineBertForQuestionAnswering,
    SineBertForSequenceClassification,
    SineBertForTokenClassification,
    SineBertModel,
)
from sinebert.export import example_inputs, export_onnx, export_program, input_names
from tests.conftest import load_script, tiny_config, user_error

HEADS = [SineBertModel, SineBertForMaskedLM, SineBertForSequenceClassification, SineBertForTokenClassification,
         SineBertForQuestionAnswering]
# The QA script's defaults (letter case, cross-segment matches) and long-input layers: each changes the graph.
VARIANTS = {"default": {}, "qa features": {"letter_case": True, "cross_segment_match": True},
            "sliding window": {"sliding_window": 4, "global_attn_every_n_layers": 2, "global_attention_positions": [0]},
            "rotary positions": {"position_embedding_type": "rotary"}, "GLU feed-forward": {"mlp_type": "glu"},
            "no biases": {"bias": False, "norm_placement": "pre"}}


def padded_batches(config):
    """Two batches of new shapes, each with padded rows (one almost all padding)."""
    for batch, seq in ((3, 23), (1, 40), (5, 7)):
        inputs = dict(zip(input_names(config), example_inputs(config, batch, seq)))
        inputs["attention_mask"][0, 3:] = 0
        yield inputs


def compare(model, outputs, inputs):
    """The exported outputs equal eager's at every real token (logits of a sequence: everywhere)."""
    with torch.no_grad():
        expected = model(**inputs, return_dict=False)
    real = inputs["attention_mask"].bool()
    for got, want in zip(outputs, expected):
        got = torch.as_tensor(got)
        if isinstance(model, SineBertForSequenceClassification):
            torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
        else:
            torch.testing.assert_close(got[real], want[real], atol=1e-4, rtol=1e-4)


# Each variant changes the encoder and each head only its last layers: every variant once, each on another head,
# covers what the whole cross product would.
EXPORTED = [(SineBertModel, "default"), (SineBertModel, "no biases"), (SineBertForMaskedLM, "GLU feed-forward"),
            (SineBertForSequenceClassification, "rotary positions"), (SineBertForTokenClassification, "sliding window"),
            (SineBertForQuestionAnswering, "qa features")]


@pytest.mark.parametrize(("cls", "variant"), EXPORTED, ids=lambda x: getattr(x, "__name__", x))
def test_torch_export_equals_eager_on_new_padded_shapes(cls, variant):
    torch.manual_seed(0)
    model = cls(tiny_config(num_labels=3, **VARIANTS[variant])).eval()
    program = export_program(model).module()
    for inputs in padded_batches(model.config):
        compare(model, program(*inputs.values()), inputs)


# Every head's last layers (the bare encoder's operators are in each head's graph): the masked LM with the cram's
# rotary positions, the fine-tuned heads with the QA script's defaults.
@pytest.mark.slow
@pytest.mark.parametrize(("cls", "variant"), [(SineBertForMaskedLM, "rotary positions")] +
                         [(cls, "qa features") for cls in HEADS[2:]], ids=lambda x: getattr(x, "__name__", x))
def test_onnx_export_runs_in_onnxruntime_as_eager(cls, variant, tmp_path):
    torch.manual_seed(0)
    model = cls(tiny_config(num_labels=3, **VARIANTS[variant])).eval()
    session = onnxruntime.InferenceSession(str(export_onnx(model, tmp_path / "model.onnx")))
    assert [i.name for i in session.get_inputs()] == list(input_names(model.config))
    for inputs in padded_batches(model.config):
        compare(model, session.run(None, {k: v.numpy() for k, v in inputs.items()}), inputs)


def test_the_export_tests_cover_every_head_and_every_variant():
    assert {cls for cls, _ in EXPORTED} == set(HEADS) and {variant for _, variant in EXPORTED} == set(VARIANTS)


def test_the_checks_of_eager_inputs_stay_outside_export():
    model = SineBertModel(tiny_config()).eval()
    with pytest.raises(ValueError, match="input_ids contains 99, outside"):
        model(input_ids=torch.tensor([[5, 99]]))


@pytest.mark.slow
def test_export_script_writes_a_checked_graph_and_refuses_other_models(tmp_path, tokenizer_dir, capsys):
    script = load_script("export_onnx")
    folder = tmp_path / "classifier"
    SineBertForSequenceClassification(tiny_config(num_labels=2)).save_pretrained(folder)
    script.main(["--model_name_or_path", str(folder), "--output_file", str(tmp_path / "out" / "model.onnx")])
    assert "onnxruntime matches the eager model" in capsys.readouterr().out
    assert onnxruntime.InferenceSession(str(tmp_path / "out" / "model.onnx")).get_outputs()[0].name == "logits"
    bert = tmp_path / "bert"
    BertModel(BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=37)).save_pretrained(bert)
    message = user_error(capsys, script, ["--model_name_or_path", bert, "--output_file", tmp_path / "b.onnx"])
    assert "holds a bert model (BertModel)" in message and not (tmp_path / "b.onnx").exists()
    assert json.loads((folder / "config.json").read_text())["architectures"] == ["SineBertForSequenceClassification"]
