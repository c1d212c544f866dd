"""Extractive question answering for transformers 5, which removed its `question-answering` pipeline.

`import sinebert` registers `ExtractiveQuestionAnsweringPipeline` as `pipeline("question-answering")` (and under
its older name, `extractive-question-answering`); question-answering checkpoints also carry this file, so
`pipeline("question-answering", model=path, trust_remote_code=True)` serves them in a process with or without
sinebert. Like this pipeline in transformers 4: a question and a context in, `{"score", "start", "end", "answer"}`
out, long contexts split into overlapping windows. A checkpoint of `scripts/finetune_qa.py` stores its run's window
settings in `config.task_specific_params["question-answering"]`, and the pipeline starts from them, so that it
answers as the run was evaluated.

The span search (`top_spans`, `extract_answers`) is also what the fine-tuning script scores with, so the pipeline
and the script's predictions agree. Imports only torch and transformers: a checkpoint carries this file.
"""

import torch
from transformers import Pipeline


def top_spans(
    start_logits: torch.Tensor,
    end_logits: torch.Tensor,
    context_mask: torch.Tensor,
    max_answer_len: int,
    top_k: int,
    allow_null: bool = False,
) -> tuple[list[tuple[float, int, int]], float | None]:
    """The `top_k` most probable spans of one window and, with `allow_null`, the probability of "no answer".

    start_logits, end_logits: `(seq,)`; context_mask: `(seq,)` bool, True on context tokens. A span is
    (start, end) with start <= end < start + max_answer_len, both on context tokens, scored p_start * p_end with
    the softmax taken over the context tokens (plus token 0, [CLS], when `allow_null`).
    Returns ([(probability, start_token, end_token), ...] best first, null probability or None).
    """
    allowed = context_mask.clone()
    if allow_null:
        allowed[0] = True
    log_start = torch.log_softmax(start_logits.float().masked_fill(~allowed, float("-inf")), dim=-1)
    log_end = torch.log_softmax(end_logits.float().masked_fill(~allowed, float("-inf")), dim=-1)
    scores = log_start[:, None] + log_end[None, :]  # (seq start, seq end)
    seq = scores.shape[0]
    ones = torch.ones(seq, seq, dtype=torch.bool, device=scores.device)
    band = torch.triu(ones) & ~torch.triu(ones, diagonal=max_answer_len)  # start <= end < start + max_len
    valid = band & context_mask[:, None] & context_mask[None, :]
    scores = scores.masked_fill(~valid, float("-inf")).flatten()
    k = min(top_k, int(valid.sum()))
    best = torch.topk(scores, k) if k > 0 else None
    spans = [] if best is None else [
        (float(score.exp()), int(index) // seq, int(index) % seq) for score, index in zip(best.values, best.indices)
    ]
    null = float((log_start[0] + log_end[0]).exp()) if allow_null else None
    return spans, null


def extract_answers(
    windows: list[dict],
    context: str,
    top_k: int = 1,
    max_answer_len: int = 30,
    handle_impossible_answer: bool = False,
) -> list[dict]:
    """Best answers over all windows of one (question, context) pair.

    Each window is a dict with `start_logits`, `end_logits` `(seq,)`, `offsets` `(seq, 2)` character offsets into
    `context`, and `context_mask` `(seq,)`. Returns up to `top_k` dicts {score, start, end, answer} (character
    offsets), best first, one per distinct answer span; with `handle_impossible_answer`, the empty answer
    competes with the score of its least confident window.
    """
    candidates = {}
    null_scores = []
    for window in windows:
        spans, null = top_spans(
            window["start_logits"], window["end_logits"], window["context_mask"],
            max_answer_len, top_k, handle_impossible_answer,
        )
        if null is not None:
            null_scores.append(null)
        for score, start, end in spans:
            char_span = (int(window["offsets"][start][0]), int(window["offsets"][end][1]))
            if score > candidates.get(char_span, -1.0):
                candidates[char_span] = score
    answers = [
        {"score": score, "start": start, "end": end, "answer": context[start:end]}
        for (start, end), score in candidates.items()
    ]
    if null_scores:
        answers.append({"score": min(null_scores), "start": 0, "end": 0, "answer": ""})
    answers.sort(key=lambda answer: answer["score"], reverse=True)
    return answers[:top_k]


def tokenize_windows(tokenizer, questions: list[str], contexts: list[str], max_seq_len: int, doc_stride: int,
                     **kwargs):
    """Tokenize (question, context) pairs into overlapping windows of at most `max_seq_len` tokens.

    The one place that decides how windows are cut, shared by the pipeline and the fine-tuning script so both see
    the same tokens. `doc_stride` is the overlap between consecutive windows, in tokens; `kwargs` go to the
    tokenizer (padding, return_tensors). The encoding has `offset_mapping` and `overflow_to_sample_mapping`.
    """
    pad_right = tokenizer.padding_side == "right"
    return tokenizer(
        questions if pad_right else contexts,
        contexts if pad_right else questions,
        truncation="only_second" if pad_right else "only_first",
        max_length=max_seq_len,
        stride=doc_stride,
        return_overflowing_tokens=True,
        return_offsets_mapping=True,
        **kwargs,
    )


def context_token_mask(tokenizer, encoding, window: int) -> list[bool]:
    """True on the tokens of window `window` that belong to the context (not question, special or padding)."""
    context_index = 1 if tokenizer.padding_side == "right" else 0
    return [sid == context_index for sid in encoding.sequence_ids(window)]


def encode_windows(tokenizer, question: str, context: str, max_seq_len: int, doc_stride: int):
    """Tokenize one (question, context) into overlapping windows of at most `max_seq_len` tokens.

    Returns the fast tokenizer's encoding (tensors `(windows, seq)`, offset_mapping included) and a boolean
    `(windows, seq)` mask of context tokens. `doc_stride` is the overlap between consecutive windows, in tokens.
    """
    encoding = tokenize_windows(
        tokenizer, [question], [context], max_seq_len, doc_stride, padding=True, return_tensors="pt"
    )
    context_mask = torch.tensor(
        [context_token_mask(tokenizer, encoding, i) for i in range(len(encoding["input_ids"]))], dtype=torch.bool
    )
    return encoding, context_mask


PREPROCESS_PARAMETERS = ("doc_stride", "max_seq_len")
POSTPROCESS_PARAMETERS = ("top_k", "max_answer_len", "handle_impossible_answer")


class ExtractiveQuestionAnsweringPipeline(Pipeline):
    """Answer questions by extracting a span of the context.

    ```python
    qa = pipeline("question-answering", model="runs/qa", trust_remote_code=True)
    qa(question="Who wrote it?", context="It was written by Ada.")  # {'score': .., 'start': 18, 'end': 21, 'answer': 'Ada'}
    ```
    Parameters (at construction or per call): top_k (1), doc_stride (128), max_answer_len (15), max_seq_len
    (384; sinebert has no length limit, so longer windows work, best with a sliding-window model) and
    handle_impossible_answer (False). The checkpoint's `task_specific_params["question-answering"]` replace these
    defaults; a value passed here replaces both.
    """

    _load_processor = False
    _load_image_processor = False
    _load_feature_extractor = False
    _load_tokenizer = True

    def _sanitize_parameters(
        self, top_k=None, doc_stride=None, max_answer_len=None, max_seq_len=None, handle_impossible_answer=None,
        **kwargs,
    ):
        if kwargs:
            raise ValueError(
                f"Unknown parameters {sorted(kwargs)} for the extractive-question-answering pipeline; valid ones are "
                "top_k, doc_stride, max_answer_len, max_seq_len and handle_impossible_answer."
            )
        values = {k: v for k, v in (("doc_stride", doc_stride), ("max_seq_len", max_seq_len), ("top_k", top_k),
                                    ("max_answer_len", max_answer_len),
                                    ("handle_impossible_answer", handle_impossible_answer)) if v is not None}
        preprocess = {k: values[k] for k in PREPROCESS_PARAMETERS if k in values}
        postprocess = {k: values[k] for k in POSTPROCESS_PARAMETERS if k in values}
        for name, value in {**preprocess, **postprocess}.items():
            if name != "handle_impossible_answer" and (not isinstance(value, int) or value < (name != "doc_stride")):
                raise ValueError(f"{name} must be a positive integer (doc_stride may be 0), got {value!r}.")
        return preprocess, {}, postprocess

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # The window settings the checkpoint's fine-tuning run evaluated with (none for other checkpoints), under
        # those given at construction.
        params = getattr(self.model.config, "task_specific_params", None) or {}
        run = params.get("question-answering", {})
        self._preprocess_params = {
            **{k: run[k] for k in PREPROCESS_PARAMETERS if k in run}, **self._preprocess_params}
        self._postprocess_params = {
            **{k: run[k] for k in POSTPROCESS_PARAMETERS if k in run}, **self._postprocess_params}

    def __call__(self, *args, **kwargs):
        """Accepts `question=..., context=...` (strings or equal-length lists), a dict with those keys, or a list
        of such dicts. A single question returns a dict (a list of them when top_k > 1); a list returns a list."""
        if args:
            inputs = args[0]
        elif "question" in kwargs and "context" in kwargs:
            question, context = kwargs.pop("question"), kwargs.pop("context")
            if isinstance(question, list):
                if not isinstance(context, list) or len(context) != len(question):
                    raise ValueError("question and context lists must have the same length.")
                inputs = [{"question": q, "context": c} for q, c in zip(question, context)]
            else:
                inputs = {"question": question, "context": context}
        else:
            raise ValueError("Pass question=... and context=..., or a dict {'question': ..., 'context': ...}.")
        return super().__call__(inputs, **kwargs)

    def preprocess(self, example, max_seq_len=384, doc_stride=128):
        if not isinstance(example, dict) or not {"question", "context"} <= set(example):
            raise ValueError(f"Each input must be a dict with 'question' and 'context', got {example!r:.80}.")
        question, context = example["question"], example["context"]
        if not isinstance(question, str) or not question.strip() or not isinstance(context, str) or not context:
            raise ValueError(f"question and context must be non-empty strings, got {question!r:.60}, {context!r:.60}.")
        question_len = len(self.tokenizer(question, add_special_tokens=False)["input_ids"])
        if doc_stride >= max_seq_len - question_len - 3:
            raise ValueError(
                f"doc_stride={doc_stride} leaves no room for new context in windows of max_seq_len={max_seq_len} "
                f"tokens with a {question_len}-token question; use a smaller doc_stride."
            )
        encoding, context_mask = encode_windows(self.tokenizer, question, context, max_seq_len, doc_stride)
        model_inputs = {name: encoding[name] for name in self.tokenizer.model_input_names if name in encoding}
        return {
            "model_inputs": model_inputs, "offsets": encoding["offset_mapping"], "context_mask": context_mask,
            "context": context,
        }

    def _forward(self, inputs):
        outputs = self.model(**inputs["model_inputs"])
        return {
            "start_logits": outputs.start_logits, "end_logits": outputs.end_logits,
            "offsets": inputs["offsets"], "context_mask": inputs["context_mask"], "context": inputs["context"],
        }

    def postprocess(self, outputs, top_k=1, max_answer_len=15, handle_impossible_answer=False):
        windows = [
            {
                "start_logits": outputs["start_logits"][i], "end_logits": outputs["end_logits"][i],
                "offsets": outputs["offsets"][i], "context_mask": outputs["context_mask"][i],
            }
            for i in range(len(outputs["start_logits"]))
        ]
        answers = extract_answers(windows, outputs["context"], top_k, max_answer_len, handle_impossible_answer)
        if not answers:
            answers = [{"score": 0.0, "start": 0, "end": 0, "answer": ""}]
        return answers[0] if top_k == 1 else answers
