"""Every head served by `pipeline(...)` on a tiny saved model with a real tokenizer, in this process (package
imported) and in a fresh process that cannot import sinebert (`trust_remote_code=True`)."""

import json
import subprocess
import sys
import textwrap

import pytest
import torch
from safetensors.torch import save_file
from transformers import AutoModel, AutoModelForQuestionAnswering, AutoTokenizer, pipeline

import sinebert  # noqa: F401  (registers the Auto classes and the QA pipeline)
from sinebert import (
    SineBertForMaskedLM,
    SineBertForQuestionAnswering,
    SineBertForSequenceClassification,
    SineBertForTokenClassification,
    SineBertModel,
)
from sinebert.pipeline_sinebert import encode_windows, extract_answers, top_spans
from sinebert.tagging import IOB2TaggingPipeline
from sinebert.tokenization_sinebert import with_case_ids
from sinebert.training.ner import word_tags
from tests.conftest import ROOT, entity_spans, tiny_config

HEADS = {
    "AutoModel": SineBertModel,
    "AutoModelForMaskedLM": SineBertForMaskedLM,
    "AutoModelForSequenceClassification": SineBertForSequenceClassification,
    "AutoModelForTokenClassification": SineBertForTokenClassification,
    "AutoModelForQuestionAnswering": SineBertForQuestionAnswering,
}
CONTEXT = "the film was written by maria and shot in the old harbour of the city during a cold winter ."


@pytest.fixture(scope="module")
def saved_heads(tmp_path_factory, tokenizer_dir):
    """One saved folder per head, each with the tokenizer, like the training scripts write them."""
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    labels = {"id2label": {0: "negative", 1: "positive"}, "label2id": {"negative": 0, "positive": 1}}
    tags = {"id2label": {0: "O", 1: "B-PER", 2: "I-PER"}, "label2id": {"O": 0, "B-PER": 1, "I-PER": 2}}
    extra = {"AutoModelForSequenceClassification": labels, "AutoModelForTokenClassification": tags}
    folders = {}
    for auto, cls in HEADS.items():
        torch.manual_seed(0)
        model = cls(tiny_config(vocab_size=len(tokenizer), max_position_embeddings=32, **extra.get(auto, {})))
        folders[auto] = tmp_path_factory.mktemp(auto)
        model.save_pretrained(folders[auto])
        tokenizer.save_pretrained(folders[auto])
    return folders


def test_fill_mask(saved_heads):
    fill = pipeline("fill-mask", model=str(saved_heads["AutoModelForMaskedLM"]))
    results = fill("the movie was [MASK] .", top_k=3)
    assert len(results) == 3 and all("[MASK]" not in r["sequence"] for r in results)
    assert results[0]["score"] >= results[1]["score"] >= results[2]["score"]


def test_text_classification(saved_heads):
    classify = pipeline("text-classification", model=str(saved_heads["AutoModelForSequenceClassification"]))
    result = classify("a gorgeous , witty , seductive movie .")[0]
    assert result["label"] in ("negative", "positive") and 0.0 <= result["score"] <= 1.0


def test_token_classification(saved_heads):
    tag = pipeline("token-classification", model=str(saved_heads["AutoModelForTokenClassification"]))
    entities = tag("maria went to the city")
    assert all(e["entity"] in ("O", "B-PER", "I-PER") for e in entities)


def test_tagging_pipeline_serves_the_best_well_formed_tags_of_the_given_words(tokenizer_dir, tmp_path):
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    names = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
    tags = {"id2label": dict(enumerate(names)), "label2id": {name: i for i, name in enumerate(names)}}
    model = SineBertForTokenClassification(tiny_config(vocab_size=len(tokenizer), max_position_embeddings=32, **tags))
    with torch.no_grad():  # every token: I-LOC most probable (an orphan everywhere), B-PER next
        model.classifier.weight.zero_()
        model.classifier.bias.copy_(torch.tensor([0.05, 0.3, 0.25, 0.05, 0.35]).log())
    folder = tmp_path / "tagger"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    words = ["maria", "al-ain", "went", "home"]  # "al-ain": three tokens, one word
    inputs = tokenizer(words, is_split_into_words=True, return_tensors="pt")
    first = [inputs.word_ids().index(word) for word in range(len(words))]
    with torch.no_grad():
        log_probs = model.eval()(**inputs).logits.log_softmax(-1)[0]  # (seq, tags)
    expected = word_tags(log_probs, first, names)
    assert expected == ["B-PER"] * 4  # 0.3 a word beats B-LOC I-LOC ... (0.05 x 0.35 ...) and B-PER I-PER ...
    tagger = pipeline("token-classification", model=str(folder), pipeline_class=IOB2TaggingPipeline)
    (served,) = tagger([words], is_split_into_words=True)  # a batch of one sentence given as words
    assert [(e["entity_group"], e["start"], e["end"]) for e in served] == entity_spans(words, expected)
    assert tagger("") == [] and tagger("maria went home") == tagger("maria went home", aggregation_strategy="first")
    with pytest.raises(ValueError, match="aggregation_strategy='simple' tags sub-tokens"):
        pipeline("token-classification", model=str(folder), pipeline_class=IOB2TaggingPipeline,
                 aggregation_strategy="simple")("maria went home")


def test_token_classification_reads_letter_case_here_and_without_the_package(tokenizer_dir, tmp_path):
    tokenizer = with_case_ids(AutoTokenizer.from_pretrained(tokenizer_dir))
    tags = {"id2label": {0: "O", 1: "B-PER", 2: "I-PER"}, "label2id": {"O": 0, "B-PER": 1, "I-PER": 2}}
    torch.manual_seed(0)
    model = SineBertForTokenClassification(
        tiny_config(vocab_size=len(tokenizer), max_position_embeddings=32, letter_case=True, **tags)
    ).eval()
    with torch.no_grad():
        model.sinebert.embeddings.case_embeddings.normal_()  # trained vectors: case changes the tags' scores
    folder = tmp_path / "tagger"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    text = "Maria went to Paris with the BBC"
    served = [entity["score"] for entity in pipeline("token-classification", model=str(folder), ignore_labels=[])(text)]
    inputs = tokenizer(text, return_tensors="pt")
    with torch.no_grad():
        cased = model(**inputs).logits.softmax(-1)[0, 1:-1].max(-1).values  # (tokens,) without [CLS] and [SEP]
        lower = model(**(inputs | {"case_ids": torch.zeros_like(inputs["case_ids"])})).logits.softmax(-1)
    assert served == pytest.approx(cased.tolist(), rel=1e-5)
    assert not torch.allclose(cased, lower[0, 1:-1].max(-1).values)
    script = f"""
        import sys, json
        sys.modules["sinebert"] = None
        from transformers import pipeline
        tag = pipeline("token-classification", model={str(folder)!r}, trust_remote_code=True, ignore_labels=[])
        print(json.dumps([float(entity["score"]) for entity in tag({text!r})]))
    """
    remote = json.loads(_run_without_package(script, tmp_path).strip().splitlines()[-1])
    assert remote == pytest.approx(served, rel=1e-5)


def test_extractive_question_answering_passes_letter_case_to_every_window(tokenizer_dir, tmp_path):
    tokenizer = with_case_ids(AutoTokenizer.from_pretrained(tokenizer_dir))
    torch.manual_seed(0)
    model = SineBertForQuestionAnswering(tiny_config(vocab_size=len(tokenizer), max_position_embeddings=32,
                                                     letter_case=True))
    with torch.no_grad():
        model.sinebert.embeddings.case_embeddings.normal_()
    model.save_pretrained(tmp_path / "cased")
    tokenizer.save_pretrained(tmp_path / "cased")
    context = " ".join(["The film was written by Maria and shot in Oslo ."] * 4)  # several windows of 32 tokens
    qa = pipeline("extractive-question-answering", model=str(tmp_path / "cased"))
    # The model raises without case_ids, so an answer means every window carried them.
    answer = qa(question="Who wrote the film ?", context=context, doc_stride=8, max_answer_len=5, max_seq_len=32)
    assert context[answer["start"] : answer["end"]] == answer["answer"] and answer["answer"]
    with torch.no_grad():
        model.sinebert.embeddings.case_embeddings.normal_()  # other case vectors, other scores
    model.save_pretrained(tmp_path / "recased")
    tokenizer.save_pretrained(tmp_path / "recased")
    again = pipeline("extractive-question-answering", model=str(tmp_path / "recased"))(
        question="Who wrote the film ?", context=context, doc_stride=8, max_answer_len=5, max_seq_len=32
    )
    assert again["score"] != pytest.approx(answer["score"], rel=1e-6)


@pytest.mark.parametrize("allow_null", [False, True])
@pytest.mark.parametrize("max_answer_len", [1, 3])
def test_top_spans_are_the_most_probable_spans_of_every_one_there_is(max_answer_len, allow_null):
    generator = torch.Generator().manual_seed(max_answer_len)
    for _ in range(10):
        start, end = torch.randn(2, 9, generator=generator)
        context = torch.tensor([False, False, True, True, True, False, True, True, False])  # [CLS] q [SEP] ... [SEP]
        allowed = context.clone()
        allowed[0] = allow_null
        p_start, p_end = (logits.masked_fill(~allowed, -torch.inf).softmax(-1) for logits in (start, end))
        every = sorted(((float(p_start[a] * p_end[b]), a, b) for a in range(9) for b in range(9)
                        if context[a] and context[b] and a <= b < a + max_answer_len), reverse=True)
        spans, null = top_spans(start, end, context, max_answer_len, top_k=4, allow_null=allow_null)
        assert [(a, b) for _, a, b in spans] == [(a, b) for _, a, b in every[:4]]
        assert [score for score, _, _ in spans] == pytest.approx([score for score, _, _ in every[:4]], rel=1e-5)
        assert null == (pytest.approx(float(p_start[0] * p_end[0]), rel=1e-5) if allow_null else None)


def test_answers_over_windows_keep_each_span_once_at_its_best_and_no_answer_at_its_least_confident():
    """Two windows of one context that overlap on 'maria' (characters 24-29); the second is surer of it, and less
    sure that there is no answer."""
    context = "the film was written by maria ."
    offsets = [(0, 0), (0, 3), (4, 8), (9, 12), (13, 20), (21, 23), (24, 29), (30, 31)]

    def window(tokens: list[int], start: list[float], end: list[float]) -> dict:
        mask = torch.tensor([False] + [True] * (len(tokens) - 1))  # [CLS], then context tokens
        return {"start_logits": torch.tensor(start), "end_logits": torch.tensor(end), "context_mask": mask,
                "offsets": torch.tensor([offsets[0]] + [offsets[t] for t in tokens[1:]])}

    first = window([0, 4, 5, 6], [1.0, 0.0, 0.0, 1.0], [1.0, 0.0, 0.0, 1.0])
    second = window([0, 6, 7], [0.0, 3.0, 0.0], [0.0, 3.0, 0.0])
    spans = {}
    for one in (first, second):
        found, one["null"] = top_spans(one["start_logits"], one["end_logits"], one["context_mask"], 30, 10, True)
        for score, a, b in found:
            where = (int(one["offsets"][a][0]), int(one["offsets"][b][1]))
            spans[where] = max(spans.get(where, 0.0), score)
    answers = extract_answers([first, second], context, top_k=20, handle_impossible_answer=True)
    assert {(a["start"], a["end"]): a["score"] for a in answers if a["answer"]} == pytest.approx(spans)
    swapped = extract_answers([second, first], context, top_k=20, handle_impossible_answer=True)
    by_span = lambda answer: (answer["start"], answer["end"])  # noqa: E731
    assert sorted(swapped, key=by_span) == sorted(answers, key=by_span)  # (ties may come in another order)
    (empty,) = [a for a in answers if not a["answer"]]
    assert second["null"] < first["null"] and empty["score"] == pytest.approx(second["null"])
    assert [a["score"] for a in answers] == sorted((a["score"] for a in answers), reverse=True)
    assert all(context[a["start"]:a["end"]] == a["answer"] for a in answers)
    assert extract_answers([first, second], context, top_k=1)[0]["answer"] == "maria"


def test_the_context_is_found_on_either_side_of_the_question(tokenizer_dir):
    """A tokenizer that pads on the left puts the context first (as transformers' pipeline did): the mask follows."""
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    for side in ("right", "left"):
        tokenizer.padding_side = side
        encoding, mask = encode_windows(tokenizer, "who wrote it ?", CONTEXT, max_seq_len=64, doc_stride=16)
        ids = encoding["input_ids"][0][mask[0]].tolist()
        assert tokenizer.decode(ids) == CONTEXT.replace(" .", ".")  # the whole context, and nothing else


def test_feature_extraction(saved_heads):
    extract = pipeline("feature-extraction", model=str(saved_heads["AutoModel"]))
    features = extract("a short sentence")
    tokens = len(AutoTokenizer.from_pretrained(saved_heads["AutoModel"])("a short sentence")["input_ids"])
    assert len(features[0]) == tokens and len(features[0][0]) == 32


@pytest.mark.parametrize(("task", "auto", "text"), [
    ("fill-mask", "AutoModelForMaskedLM", "a [MASK] film \ud800"),
    ("text-classification", "AutoModelForSequenceClassification", ["a fine film", "a dull \udfff film"]),
    ("token-classification", "AutoModelForTokenClassification", "maria \udc80 wrote it"),
    ("feature-extraction", "AutoModel", "a short \ud83d sentence"),
])
def test_text_with_a_lone_surrogate_is_one_sentence_in_every_pipeline(saved_heads, task, auto, text):
    """Half a surrogate pair (from a JSON "\\ud800", or bytes decoded with errors="surrogateescape") is named, where
    `tokenizers` alone raised "TextEncodeInput must be Union[...]"."""
    serve = pipeline(task, model=str(saved_heads[auto]))
    with pytest.raises(ValueError, match=r"holds a lone surrogate \(U\+D[89A-F][0-9A-F]{2}\) at character \d+"):
        serve(text)
    assert serve("a fine film [MASK]" if task == "fill-mask" else "a fine film")  # a valid text still goes through


def test_question_answering_names_a_lone_surrogate_in_the_question_or_the_context(saved_heads):
    qa = pipeline("extractive-question-answering", model=str(saved_heads["AutoModelForQuestionAnswering"]))
    with pytest.raises(ValueError, match="at character 4"):
        qa(question="who \ud800 wrote it ?", context=CONTEXT)
    with pytest.raises(ValueError, match="at character 9"):
        qa(question="who wrote it ?", context="the film \udfff was written by maria")


def test_extractive_question_answering_spans_long_contexts(saved_heads):
    qa = pipeline("extractive-question-answering", model=str(saved_heads["AutoModelForQuestionAnswering"]))
    long_context = " ".join([CONTEXT] * 4)  # about 90 tokens: several windows of 32 tokens
    answer = qa(question="who wrote the film ?", context=long_context, doc_stride=8, max_answer_len=5, max_seq_len=32)
    assert set(answer) == {"score", "start", "end", "answer"}
    assert long_context[answer["start"] : answer["end"]] == answer["answer"] and answer["answer"]
    top = qa({"question": "where was it shot ?", "context": CONTEXT}, top_k=3)
    assert len(top) == 3 and top[0]["score"] >= top[1]["score"] >= top[2]["score"]
    assert len({(t["start"], t["end"]) for t in top}) == 3
    batch = qa(question=["who ?", "where ?"], context=[CONTEXT, CONTEXT])
    assert isinstance(batch, list) and len(batch) == 2
    with pytest.raises(ValueError, match="doc_stride=30"):
        qa(question="who wrote the film ?", context=long_context, doc_stride=30, max_seq_len=32)


def test_question_answering_without_the_package_via_remote_code(saved_heads, tmp_path):
    folder = saved_heads["AutoModelForQuestionAnswering"]
    expected = pipeline("extractive-question-answering", model=str(folder))(question="who wrote it ?", context=CONTEXT)
    script = f"""
        import sys, json
        sys.modules["sinebert"] = None  # the package must not be importable here
        from transformers import pipeline
        qa = pipeline("question-answering", model={str(folder)!r}, trust_remote_code=True)
        print(json.dumps(qa(question="who wrote it ?", context={CONTEXT!r})))
    """
    result = _run_without_package(script, tmp_path)
    answer = json.loads(result.strip().splitlines()[-1])
    assert answer["answer"] == expected["answer"] and answer["start"] == expected["start"]
    assert answer["score"] == pytest.approx(expected["score"], rel=1e-5)


def test_every_head_loads_without_the_package_via_remote_code(saved_heads, tmp_path):
    tokenizer = AutoTokenizer.from_pretrained(saved_heads["AutoModel"])
    inputs = tokenizer(["a fine film", "the plot of the film is thin and dull"], padding=True, return_tensors="pt")
    expected = {}
    for auto, folder in saved_heads.items():
        model = HEADS[auto].from_pretrained(folder).eval()
        with torch.no_grad():
            expected[auto] = model(**inputs, return_dict=False)[0].contiguous()
    save_file({k: v for k, v in inputs.items()}, str(tmp_path / "inputs.safetensors"))
    save_file(expected, str(tmp_path / "expected.safetensors"))
    folders = {auto: str(folder) for auto, folder in saved_heads.items()}
    script = f"""
        import sys
        sys.modules["sinebert"] = None
        import torch, transformers
        from safetensors.torch import load_file
        inputs = load_file({str(tmp_path / "inputs.safetensors")!r})
        expected = load_file({str(tmp_path / "expected.safetensors")!r})
        for auto, folder in {folders!r}.items():
            model = getattr(transformers, auto).from_pretrained(folder, trust_remote_code=True).eval()
            assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
            with torch.no_grad():
                out = model(**inputs, return_dict=False)[0]
            # Not bit for bit: the fresh process may use another number of threads, hence another summation order.
            torch.testing.assert_close(out, expected[auto], atol=1e-5, rtol=1e-5)
            print("ok", auto)
    """
    output = _run_without_package(script, tmp_path)
    assert output.count("ok ") == len(HEADS)


def _run_without_package(script: str, cwd) -> str:
    """Run `script` in a fresh interpreter whose working directory is not the project."""
    env = {"HF_HUB_OFFLINE": "1", "HF_HOME": str(cwd / "hf_home"), "PATH": "/usr/bin:/bin"}
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_sentence_transformers_mean_pooling_and_save_reload(saved_heads, tmp_path):
    from sentence_transformers import SentenceTransformer, models

    folder = str(saved_heads["AutoModel"])
    encoder = SentenceTransformer(modules=[models.Transformer(folder), models.Pooling(32, pooling_mode="mean")],
                                  device="cpu")
    sentences = ["a fine film", "the plot of the film is thin and dull"]
    embeddings = encoder.encode(sentences, convert_to_tensor=True)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    inputs = tokenizer(sentences, padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = AutoModel.from_pretrained(folder).eval()(**inputs).last_hidden_state
    mask = inputs["attention_mask"][..., None].float()
    torch.testing.assert_close(embeddings, (hidden * mask).sum(1) / mask.sum(1), atol=1e-5, rtol=1e-5)
    encoder.save(str(tmp_path / "st"))
    again = SentenceTransformer(str(tmp_path / "st"), device="cpu").encode(sentences, convert_to_tensor=True)
    torch.testing.assert_close(again, embeddings, atol=0, rtol=0)


def test_question_answering_starts_from_the_run_s_window_settings(saved_heads, tmp_path):
    folder = tmp_path / "qa"
    model = AutoModelForQuestionAnswering.from_pretrained(saved_heads["AutoModelForQuestionAnswering"])
    model.config.task_specific_params = {"question-answering": {"max_seq_len": 24, "doc_stride": 8,
                                                                "max_answer_len": 3}}
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(saved_heads["AutoModel"]).save_pretrained(folder)
    qa = pipeline("question-answering", model=str(folder), trust_remote_code=True)
    assert qa._preprocess_params == {"max_seq_len": 24, "doc_stride": 8}
    assert qa._postprocess_params == {"max_answer_len": 3}
    assert len(qa(question="who ?", context=CONTEXT)["answer"].split()) <= 3
    given = pipeline("question-answering", model=str(folder), trust_remote_code=True, max_seq_len=32)
    assert given._preprocess_params == {"max_seq_len": 32, "doc_stride": 8}  # what the caller gives wins
