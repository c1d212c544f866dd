"""sinebert: a Hugging Face-native encoder with fixed sinusoidal positions.

Importing the package registers `SineBertConfig`, every head and `SineBertTokenizer` with the transformers Auto
classes, and the `question-answering` pipeline. `IOB2TaggingPipeline` serves a tagger's best well-formed IOB2 tags
(`pipeline("token-classification", model=..., pipeline_class=IOB2TaggingPipeline)`).
"""

from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForMaskedLM,
    AutoModelForPreTraining,
    AutoModelForQuestionAnswering,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
    AutoTokenizer,
)
from transformers.pipelines import PIPELINE_REGISTRY

from .configuration_sinebert import SineBertConfig
from .modeling_sinebert import (
    SineBertForMaskedLM,
    SineBertForPreTraining,
    SineBertForQuestionAnswering,
    SineBertForSequenceClassification,
    SineBertForTokenClassification,
    SineBertModel,
    SineBertPreTrainedModel,
)
from .pipeline_sinebert import ExtractiveQuestionAnsweringPipeline
from .tagging import IOB2TaggingPipeline
from .tokenization_sinebert import SineBertTokenizer

__version__ = "0.1.0"

AutoConfig.register("sinebert", SineBertConfig, exist_ok=True)
for _auto, _model in (
    (AutoModel, SineBertModel),
    (AutoModelForMaskedLM, SineBertForMaskedLM),
    (AutoModelForPreTraining, SineBertForPreTraining),
    (AutoModelForSequenceClassification, SineBertForSequenceClassification),
    (AutoModelForTokenClassification, SineBertForTokenClassification),
    (AutoModelForQuestionAnswering, SineBertForQuestionAnswering),
):
    _auto.register(SineBertConfig, _model, exist_ok=True)
AutoTokenizer.register(SineBertConfig, tokenizer_class=SineBertTokenizer, exist_ok=True)

# transformers 5 has no question-answering pipeline; one of a later release keeps its name.
for _task in ("question-answering", "extractive-question-answering"):
    if _task not in PIPELINE_REGISTRY.get_supported_tasks():
        PIPELINE_REGISTRY.register_pipeline(
            _task, pipeline_class=ExtractiveQuestionAnsweringPipeline, pt_model=AutoModelForQuestionAnswering,
            type="text",
        )

__all__ = [
    "ExtractiveQuestionAnsweringPipeline",
    "IOB2TaggingPipeline",
    "SineBertConfig",
    "SineBertForMaskedLM",
    "SineBertForPreTraining",
    "SineBertForQuestionAnswering",
    "SineBertForSequenceClassification",
    "SineBertForTokenClassification",
    "SineBertModel",
    "SineBertPreTrainedModel",
    "SineBertTokenizer",
]
