"""Word tags as a well-formed IOB2 sequence: the most probable one, found by Viterbi search.

A tagger scores each word alone, so its most probable tag per word can be an I-X that continues nothing (after O, or
after a tag of another type), a span that strict scoring drops and conlleval's convention opens with a wrong
boundary. The search keeps the model's own per-word probabilities and adds only the IOB2 rule that every I-X
continues a B-X or I-X; what it gains: docs/QUALITY.md, "Tag decoding". `scripts/finetune_ner.py` scores with
`best_tag_path`, and `IOB2TaggingPipeline` serves the same tags:

    pipeline("token-classification", model=folder, pipeline_class=IOB2TaggingPipeline)
"""

import functools

import numpy as np
import torch
from transformers.pipelines.token_classification import AggregationStrategy, TokenClassificationPipeline


@functools.lru_cache(maxsize=8)
def iob2_transitions(labels: tuple[str, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """(allowed, first): allowed[a, b] says whether tag b may follow tag a, and first[b] whether b may open a
    sentence. An I-X may only follow B-X or I-X; every other tag may follow anything. Built once per tag set (an
    evaluation decodes thousands of sentences with one); the tensors are shared, so callers must not change them."""
    def continues(previous: str, tag: str) -> bool:
        return not tag.startswith("I-") or (previous[:2] in ("B-", "I-") and previous[2:] == tag[2:])

    allowed = torch.tensor([[continues(a, b) for b in labels] for a in labels])  # (tags, tags)
    first = torch.tensor([not tag.startswith("I-") for tag in labels])  # (tags,)
    return allowed, first


def best_tag_path(log_probs: torch.Tensor, allowed: torch.Tensor, first: torch.Tensor) -> list[int]:
    """The tag ids of the most probable well-formed sequence. log_probs: `(words, tags)`, each word's log-probabilities
    (any per-word scores whose sum ranks sequences); allowed, first: from `iob2_transitions`."""
    if log_probs.shape[0] == 0:
        return []
    log_probs = log_probs.float()
    barrier = torch.zeros(allowed.shape).masked_fill(~allowed, float("-inf"))  # (tags, tags)
    score = log_probs[0].masked_fill(~first, float("-inf"))  # (tags,): best path ending in each tag
    back = []
    for word in log_probs[1:]:
        score, previous = (score[:, None] + barrier).max(dim=0)  # over the previous tag
        score = score + word
        back.append(previous)
    path = [int(score.argmax())]
    for previous in reversed(back):
        path.append(int(previous[path[-1]]))
    return path[::-1]


class IOB2TaggingPipeline(TokenClassificationPipeline):
    """transformers' token-classification pipeline, with the words' tags taken as the best well-formed IOB2 sequence
    (`best_tag_path`) instead of one by one. Words are scored as the aggregation strategy says: "first" (the default
    here, as `scripts/finetune_ner.py` trains and scores), "average" or "max"; "none" and "simple", which tag
    sub-tokens, are refused."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("aggregation_strategy", "first")
        super().__init__(*args, **kwargs)

    def gather_pre_entities(self, *args, word_ids=None, **kwargs) -> list[dict]:
        entities = super().gather_pre_entities(*args, word_ids=word_ids, **kwargs)
        if word_ids is not None:  # words given split: they are the words, as the script tags them ("AL-AIN" is one)
            previous = None
            for entity in entities:
                word = word_ids[entity["index"]]
                entity["is_subword"] = word is not None and word == previous
                previous = word
        return entities

    def aggregate(self, pre_entities: list[dict], aggregation_strategy: AggregationStrategy) -> list[dict]:
        if aggregation_strategy in (AggregationStrategy.NONE, AggregationStrategy.SIMPLE):
            raise ValueError(f"IOB2TaggingPipeline tags words, and aggregation_strategy={aggregation_strategy.value!r} "
                             "tags sub-tokens; pass 'first' (as training scored), 'average' or 'max'.")
        return super().aggregate(pre_entities, aggregation_strategy)

    def aggregate_words(self, entities: list[dict], aggregation_strategy: AggregationStrategy) -> list[dict]:
        words = []  # per word its sub-token entries
        for entity in entities:
            if words and entity["is_subword"]:
                words[-1].append(entity)
            else:
                words.append([entity])
        if not words:  # a text without any word
            return []
        scores = np.stack([self._word_scores(word, aggregation_strategy) for word in words])  # (words, tags)
        labels = tuple(self.model.config.id2label[i] for i in range(len(self.model.config.id2label)))
        path = best_tag_path(torch.from_numpy(np.log(scores + 1e-12)), *iob2_transitions(labels))
        return [
            {"entity": labels[tag], "score": scores[i, tag], "start": word[0]["start"], "end": word[-1]["end"],
             "word": self.tokenizer.convert_tokens_to_string([part["word"] for part in word])}
            for i, (word, tag) in enumerate(zip(words, path))
        ]

    @staticmethod
    def _word_scores(word: list[dict], strategy: AggregationStrategy) -> np.ndarray:
        """A word's tag probabilities `(tags,)`, as transformers' pipeline reads them under `strategy`."""
        if strategy == AggregationStrategy.FIRST:
            return word[0]["scores"]
        if strategy == AggregationStrategy.MAX:
            return max(word, key=lambda part: part["scores"].max())["scores"]
        return np.nanmean(np.stack([part["scores"] for part in word]), axis=0)
