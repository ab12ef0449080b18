"""Pretraining instances: BERT's reference algorithm (shared spec `pretraining-instances.md`).

Two modes over the same data types:

- reference: `create_instances_reference` follows one `random.Random(random_seed)` stream in the
  exact call order of BERT's `create_pretraining_data.py` (google-research/bert), so for the same
  documents, vocabulary, seed and options its instances equal the reference's, in the same order.
- scalable: `plan_document` -> `fill_random_next` (random-next plans only) -> `finalize_instances`
  (a batch, vectorised; `finalize_instance` for one gives the same instance). Nothing shares a
  stream: the walk of a document draws from `random.Random(stream_key(seed, pass, doc, 0))`, the
  random start of a random B from `stream_key(seed, pass, doc, instance, 2)` and truncation and
  masking from the SplitMix64 stream `uniforms(stream_key(seed, pass, doc, instance, 1), k)`, so
  a Beam job gives the same instances on any number of workers. Random-next documents are drawn
  from the whole corpus (`random_doc_index`), not from a worker's partition.

Both modes walk a document with the same code (`_walk_document`), so the segment splitting, the
random-next decision and the "put back" of unused segments cannot drift apart.

Label convention: `next_sentence_label = 1` means B is a *random* segment, 0 means B actually
follows A (as in the reference and Hugging Face's `next_sentence_label`); -1 = MLM-only.

Kept whole: the one implementation of the spec's algorithm. Both modes share its data types and
the document walk, and each step of the scalable mode (truncation, masking, the random B) is a
step of the reference re-seeded per instance and vectorised: in one file a reader checks each
against the step it must agree with, as tests/pipelines/shards/test_reference_parity.py and
test_scalable_instances.py check their outputs.
"""
from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from common.masking import (
    MaskingConfig,
    num_to_predict,
    reference_replacement,
    replace_tokens,
    take_word_groups,
    word_groups,
)
from common.settings import check
from common.tokenization import (
    CLS,
    MASK,
    SEP,
    WORDPIECE,
    continuation_flags,
    encode_like_reference,
    splitting_special_tokens,
)

Document = list[np.ndarray]  # one int32 token-id array per segment (sentence)

RANDOM_NEXT, ACTUAL_NEXT, NO_NSP = 1, 0, -1
_RANDOM_DOC_TRIES = 10  # tries to draw a document other than the current one (the reference's)


# ----------------------------------------------------------------------------------------------
# Configuration and vocabulary
# ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class InstanceConfig(MaskingConfig):
    """Options of instance creation, with the reference generator's names and defaults; the
    masking options (`masked_lm_prob`, `max_predictions_per_seq`, the MASK/SAME/RND split,
    `do_whole_word_mask`) are `common.masking.MaskingConfig`'s."""
    max_seq_length: int = 128
    """Tokens per instance including [CLS] and the [SEP]s."""
    short_seq_prob: float = 0.1
    """Probability that a document pass uses a random shorter target length."""
    dupe_factor: int = 10
    """Passes over the corpus, each with different splits and masks."""
    random_seed: int = 12345
    """Seed of every random draw."""
    next_sentence: bool = True
    """False = MLM-only: [CLS] A [SEP], no next-sentence pair, label -1 (--no_next_sentence)."""
    random_next_prob: float = 0.5
    """Probability that B is drawn from another document when A's chunk has two or more
    segments (the reference's coin is 0.5; a one-segment chunk always takes a random B)."""

    def __post_init__(self):
        MaskingConfig.__post_init__(self)
        # [CLS] A [SEP] B [SEP] with A and B non-empty, and target lengths randint(2, max - 3);
        # the shard format stores positions as uint16
        check(5 <= self.max_seq_length <= 65535, "max_seq_length",
              f"must be in [5, 65535], got {self.max_seq_length}")
        check(0.0 <= self.short_seq_prob <= 1.0, "short_seq_prob",
              f"must be in [0, 1], got {self.short_seq_prob}")
        check(self.dupe_factor >= 1, "dupe_factor", f"must be >= 1, got {self.dupe_factor}")
        check(self.random_seed >= 0, "random_seed", f"must be >= 0, got {self.random_seed}")
        check(0.0 <= self.random_next_prob <= 1.0, "random_next_prob",
              f"must be in [0, 1], got {self.random_next_prob}")

    @property
    def max_num_tokens(self) -> int:
        """Tokens of A and B together: max_seq_length less [CLS] and one or two [SEP]."""
        return self.max_seq_length - (3 if self.next_sentence else 2)


@dataclass(frozen=True, eq=False)
class Vocab:
    """What instance creation needs from a vocabulary (ids are line numbers of `vocab.txt`)."""
    cls_id: int
    """Id of [CLS]."""
    sep_id: int
    """Id of [SEP]."""
    mask_id: int
    """Id of [MASK]."""
    vocab_size: int
    """Number of ids."""
    is_subword: np.ndarray
    """(vocab_size,) bool: the token continues the word before it (WordPiece's `##`, a BPE
    piece without the space prefix: `common.tokenization.is_continuation`); whole-word masking
    joins it to the previous piece."""
    replacement_ids: np.ndarray
    """(K,) int32: ids the random replacement draws from, in the reference's `vocab_words`
    order (all ids unless the vocabulary repeats a token: the reference keeps one of each)."""

    @classmethod
    def from_path(cls, vocab_path: str) -> Vocab:
        """The vocabulary of a folder or `vocab.txt`, of the kind its folder is."""
        from common.tokenization import read_vocab, vocab_kind

        return cls.from_tokens(read_vocab(vocab_path), vocab_kind(vocab_path))

    @classmethod
    def from_tokens(cls, tokens: list[str], kind: str = WORDPIECE) -> Vocab:
        """The vocabulary of `tokens` in id order (as `tokenization.read_vocab` returns them), a
        vocabulary of `kind` (`common.tokenization.VOCAB_KINDS`)."""
        ids: dict[str, int] = {}
        for i, token in enumerate(tokens):
            ids[token] = i  # the reference's load_vocab: a repeated token keeps its last id
        missing = [t for t in (CLS, SEP, MASK) if t not in ids]
        if missing:
            raise ValueError(f"vocabulary lacks special tokens {missing}")
        return cls(cls_id=ids[CLS], sep_id=ids[SEP], mask_id=ids[MASK], vocab_size=len(tokens),
                   is_subword=np.array(continuation_flags(tokens, kind), dtype=bool),
                   replacement_ids=np.fromiter(ids.values(), dtype=np.int32, count=len(ids)))


@dataclass
class Instance:
    """One pretraining instance, unpadded. T = number of tokens, M = masked positions."""
    input_ids: np.ndarray
    """(T,) int32: [CLS] A [SEP] B [SEP] (MLM-only: [CLS] A [SEP]) with the masks applied."""
    segment_ids: np.ndarray
    """(T,) uint8: 0 through the first [SEP], then 1."""
    masked_lm_positions: np.ndarray
    """(M,) int32, ascending."""
    masked_lm_ids: np.ndarray
    """(M,) int32: the original ids at those positions."""
    next_sentence_label: int
    """1 = B is random, 0 = B is the actual next, -1 = MLM-only."""


# ----------------------------------------------------------------------------------------------
# The document walk, shared by both modes
# ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Chunk:
    """Segments [start, a_end) form A; [a_end, stop) the actual next B unless random_doc is set."""
    start: int
    a_end: int
    stop: int
    random_doc: int | None
    target_length: int


def _walk_document(segment_lengths: list[int], doc_index: int, num_docs: int,
                   rng: random.Random, cfg: InstanceConfig) -> Iterator[_Chunk]:
    """Split a document into chunks, drawing from `rng` in the reference's order.

    A generator: the caller's draws for one chunk (random start, truncation, masking) happen
    between two `yield`s, which is exactly where the reference makes them.
    """
    target = cfg.max_num_tokens
    if rng.random() < cfg.short_seq_prob:
        target = rng.randint(2, cfg.max_num_tokens)
    n = len(segment_lengths)
    start, length, i = 0, 0, 0
    while i < n:
        length += segment_lengths[i]
        if i == n - 1 or length >= target:
            size = i + 1 - start
            if not cfg.next_sentence:
                yield _Chunk(start, i + 1, i + 1, None, target)
            else:
                a_end = start + (rng.randint(1, size - 1) if size >= 2 else 1)
                if size == 1 or rng.random() < cfg.random_next_prob:
                    random_doc = doc_index
                    for _ in range(_RANDOM_DOC_TRIES):
                        random_doc = rng.randint(0, num_docs - 1)
                        if random_doc != doc_index:
                            break
                    yield _Chunk(start, a_end, i + 1, random_doc, target)
                    i = a_end - 1  # put the unused segments back
                else:
                    yield _Chunk(start, a_end, i + 1, None, target)
            start, length = i + 1, 0
        i += 1


def _random_next_segments(segments: list, first: int, target_b_length: int) -> int:
    """End of the segments [first, end) taken from a random document: at least one, until the
    target length is reached or the document ends."""
    total, end = 0, first
    while end < len(segments):
        total += len(segments[end])
        end += 1
        if total >= target_b_length:
            break
    return end


# ----------------------------------------------------------------------------------------------
# Reference mode: one random.Random stream
# ----------------------------------------------------------------------------------------------

def read_reference_text(lines: Iterable[str], tokenizer, batch_size: int = 4096) -> list[Document]:
    """Documents from the reference text format, as the reference reads it.

    Each line is stripped; an empty line starts a new document; a line with tokens is one segment
    of the current document; empty documents are dropped. `tokenizer` is a `tokenizers.Tokenizer`
    (`common.tokenization.load_tokenizer(..., split_special_tokens=True)`; without the flag a
    copy with it is made once), used through `encode_like_reference`. Pass the lines of all input files in order (a file
    boundary does not end a document in the reference), split on "\\n" only as the reference
    does: read with `open(..., newline="\\n")`, not `str.splitlines` (which also splits on
    "\\x1c", "\\x85", "\\u2028", ...).
    """
    tokenizer = splitting_special_tokens(tokenizer)  # "[MASK]" in text is a word (reference)
    documents: list[Document] = [[]]
    pending: list[str] = []

    def flush() -> None:
        for ids in encode_like_reference(tokenizer, pending):
            if ids:
                documents[-1].append(np.asarray(ids, dtype=np.int32))
        pending.clear()

    for line in lines:
        line = line.strip()
        if not line:
            flush()
            documents.append([])
        else:
            pending.append(line)
            if len(pending) >= batch_size:
                flush()
    flush()
    return [doc for doc in documents if doc]


def create_instances_reference(documents: list[Document], vocab: Vocab,
                               cfg: InstanceConfig) -> list[Instance]:
    """The reference generator's instances, in its order, for documents in input order.

    `documents` is what the reference builds from its input (see `read_reference_text`); the one
    `random.Random(random_seed)` stream shuffles them, walks every document in every pass and
    shuffles the instances, as `create_training_instances` does.
    """
    documents = [[np.asarray(seg).tolist() for seg in doc] for doc in documents if len(doc)]
    _check_segments(documents)
    rng = random.Random(cfg.random_seed)
    rng.shuffle(documents)
    instances: list[Instance] = []
    for _ in range(cfg.dupe_factor):
        for doc_index in range(len(documents)):
            instances.extend(_reference_document(documents, doc_index, vocab, cfg, rng))
    rng.shuffle(instances)
    return instances


def _check_segments(documents: list[list]) -> None:
    for d, doc in enumerate(documents):
        for s, segment in enumerate(doc):
            if not len(segment):
                raise ValueError(f"document {d}: segment {s} is empty (segments need tokens)")


def _reference_document(documents: list[list[list[int]]], doc_index: int, vocab: Vocab,
                        cfg: InstanceConfig, rng: random.Random) -> list[Instance]:
    doc = documents[doc_index]
    instances = []
    for chunk in _walk_document([len(s) for s in doc], doc_index, len(documents), rng, cfg):
        tokens_a = [t for seg in doc[chunk.start:chunk.a_end] for t in seg]
        tokens_b: list[int] = []
        if chunk.random_doc is not None:
            random_doc = documents[chunk.random_doc]
            first = rng.randint(0, len(random_doc) - 1)
            end = _random_next_segments(random_doc, first, chunk.target_length - len(tokens_a))
            tokens_b = [t for seg in random_doc[first:end] for t in seg]
        elif cfg.next_sentence:
            tokens_b = [t for seg in doc[chunk.a_end:chunk.stop] for t in seg]
        _reference_truncate(tokens_a, tokens_b, cfg.max_num_tokens, rng)
        tokens = [vocab.cls_id] + tokens_a + [vocab.sep_id]
        if cfg.next_sentence:
            tokens += tokens_b + [vocab.sep_id]
        label = NO_NSP if not cfg.next_sentence else (
            RANDOM_NEXT if chunk.random_doc is not None else ACTUAL_NEXT)
        instances.append(_reference_mask(tokens, len(tokens_a) + 2, label, vocab, cfg, rng))
    return instances


def _reference_truncate(tokens_a: list[int], tokens_b: list[int], max_num_tokens: int,
                        rng: random.Random) -> None:
    """Trim the longer side (ties: B) one token at a time, from the front or the back by a coin."""
    while len(tokens_a) + len(tokens_b) > max_num_tokens:
        trunc = tokens_a if len(tokens_a) > len(tokens_b) else tokens_b
        if rng.random() < 0.5:
            del trunc[0]
        else:
            trunc.pop()


def _word_groups(tokens: list[int], vocab: Vocab) -> list[list[int]]:
    """Maskable positions grouped by word (`common.masking.word_groups`): as in the
    reference, a `##` piece joins the last group even across a [SEP] (the specials are skipped
    before the check), and a `##` piece with no group before it starts one."""
    ids = np.asarray(tokens)
    candidates = np.flatnonzero((ids != vocab.cls_id) & (ids != vocab.sep_id))
    group = word_groups(ids[candidates], vocab.is_subword)  # (C,) ascending group ids
    starts = np.flatnonzero(np.r_[True, group[1:] != group[:-1]]) if len(group) else []
    return [part.tolist() for part in np.split(candidates, starts[1:])] if len(group) else []


def _reference_mask(tokens: list[int], len_segment_0: int, label: int, vocab: Vocab,
                    cfg: InstanceConfig, rng: random.Random) -> Instance:
    if cfg.do_whole_word_mask:
        groups = _word_groups(tokens, vocab)
    else:  # one position per group: shuffling positions draws the same numbers, and is faster
        cls_id, sep_id = vocab.cls_id, vocab.sep_id
        groups = [(i,) for i, t in enumerate(tokens) if t != cls_id and t != sep_id]
    rng.shuffle(groups)
    n = num_to_predict(len(tokens), cfg)
    output = list(tokens)
    chosen: list[int] = []
    masking, mask_id, replacements = cfg, vocab.mask_id, vocab.replacement_ids
    for group in groups:
        if len(chosen) >= n:
            break
        if len(chosen) + len(group) > n:
            continue
        for index in group:  # groups are disjoint: the reference's overlap check never fires
            output[index] = reference_replacement(tokens[index], rng, masking, mask_id,
                                                  replacements)
            chosen.append(index)
    chosen.sort()
    segment_ids = np.zeros(len(tokens), dtype=np.uint8)
    segment_ids[len_segment_0:] = 1
    return Instance(input_ids=np.asarray(output, dtype=np.int32), segment_ids=segment_ids,
                    masked_lm_positions=np.asarray(chosen, dtype=np.int32),
                    masked_lm_ids=np.asarray([tokens[i] for i in chosen], dtype=np.int32),
                    next_sentence_label=label)


# ----------------------------------------------------------------------------------------------
# Scalable mode: counter-based seeding per (seed, pass, document, instance)
# ----------------------------------------------------------------------------------------------

_MASK64 = (1 << 64) - 1
_GOLDEN_GAMMA = 0x9E3779B97F4A7C15
_MIX1, _MIX2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB


def _mix64(z: int) -> int:
    """SplitMix64's output function (Steele, Lea & Flood 2014) on a Python int."""
    z = ((z ^ (z >> 30)) * _MIX1) & _MASK64
    z = ((z ^ (z >> 27)) * _MIX2) & _MASK64
    return z ^ (z >> 31)


def _mix64_array(z: np.ndarray) -> np.ndarray:
    """`_mix64` on a uint64 array (products wrap mod 2**64 as intended)."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(_MIX1)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(_MIX2)
    return z ^ (z >> np.uint64(31))


def stream_key(*parts: int) -> int:
    """The 64-bit key of the random stream of (seed, pass, document, instance, purpose): distinct
    tuples give unrelated keys, so no two instances share numbers whatever the worker layout."""
    key = 0
    for part in parts:
        key = _mix64((key + _GOLDEN_GAMMA + (part & _MASK64)) & _MASK64)
    return key


def _stream_keys(*parts: np.ndarray | int) -> np.ndarray:
    """`stream_key` for arrays of tuples (N,) -> (N,) uint64."""
    key = np.zeros(1, dtype=np.uint64)
    for part in parts:
        key = _mix64_array(key + np.uint64(_GOLDEN_GAMMA) + np.atleast_1d(part).astype(np.uint64))
    return key


def uniforms(key: int, n: int) -> np.ndarray:
    """(n,) float64 in [0, 1): the first n numbers of the SplitMix64 stream seeded with `key`.

    Counter-based, so a batch of instances draws all its numbers in one vectorised call
    (`_batch_uniforms`): a numpy Generator per instance costs ~15 us to create, more than the
    whole per-instance budget.
    """
    z = _mix64_array(np.arange(1, n + 1, dtype=np.uint64) * np.uint64(_GOLDEN_GAMMA)
                     + np.uint64(key))
    return (z >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def _batch_uniforms(keys: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Concatenated `uniforms(keys[i], counts[i])` for all i: (sum counts,) float64."""
    starts = np.cumsum(counts) - counts
    counters = (np.arange(1, counts.sum() + 1, dtype=np.uint64)
                - np.repeat(starts, counts).astype(np.uint64))  # (sum counts,) 1, 2, .. per stream
    z = _mix64_array(counters * np.uint64(_GOLDEN_GAMMA) + np.repeat(keys, counts))
    return (z >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


_PLAN, _FINALIZE, _RANDOM_START = 0, 1, 2  # stream purposes


@dataclass(frozen=True, eq=False)
class InstancePlan:
    """One instance before random-next fill, truncation and masking."""
    doc_index: int
    """Document id (index in the whole corpus); with the two below, seeds the later steps."""
    pass_index: int
    """Pass over the corpus (0 .. dupe_factor - 1)."""
    instance_index: int
    """Index of the instance within its document and pass."""
    tokens_a: np.ndarray
    """(La,) int32: the A segments concatenated (MLM-only: the whole chunk)."""
    tokens_b: np.ndarray | None
    """(Lb,) int32: B; None until `fill_random_next` when B is random; None in MLM-only mode."""
    random_doc_index: int | None
    """Document to draw the random B from (drawn from all documents), else None."""
    target_b_length: int
    """Tokens a random B should reach (the chunk's target length less len(A))."""
    next_sentence_label: int
    """1 = random next, 0 = actual next, -1 = MLM-only."""
    a_segments: tuple[int, int] = (0, 0)
    """Segments [start, end) of the document that form A."""
    b_segments: tuple[int, int] | None = None
    """Segments [start, end) of B: of this document (actual next) or of the random document."""
    chunk_segments: int = 0
    """Segments of the chunk A came from (1 forces a random next: P(random) = p + (1 - p) * f1
    with p = random_next_prob)."""


def plan_document(doc: Document, doc_index: int, num_docs: int, pass_index: int,
                  cfg: InstanceConfig) -> list[InstancePlan]:
    """The instances of one document in one pass, before random fill, truncation and masking.

    The walk is the reference's (`_walk_document`) on a `random.Random` seeded by
    (random_seed, pass_index, doc_index); `doc_index` must be the document's id in the whole
    corpus of `num_docs` documents, from which random-next documents are drawn.
    """
    if not 0 <= doc_index < num_docs:
        raise ValueError(f"document {doc_index}: not an index of a corpus of {num_docs} documents")
    lengths = [len(segment) for segment in doc]
    if not lengths or min(lengths) == 0:
        raise ValueError(f"document {doc_index}: needs at least one segment and no empty segment")
    rng = random.Random(stream_key(cfg.random_seed, pass_index, doc_index, _PLAN))
    plans = []
    for chunk in _walk_document(lengths, doc_index, num_docs, rng, cfg):
        tokens_a = _concat(doc[chunk.start:chunk.a_end])
        actual = cfg.next_sentence and chunk.random_doc is None
        label = NO_NSP if not cfg.next_sentence else (ACTUAL_NEXT if actual else RANDOM_NEXT)
        plans.append(InstancePlan(
            doc_index=doc_index, pass_index=pass_index, instance_index=len(plans),
            tokens_a=tokens_a,
            tokens_b=_concat(doc[chunk.a_end:chunk.stop]) if actual else None,
            random_doc_index=chunk.random_doc,
            target_b_length=chunk.target_length - len(tokens_a),
            next_sentence_label=label,
            a_segments=(chunk.start, chunk.a_end),
            b_segments=(chunk.a_end, chunk.stop) if actual else None,
            chunk_segments=chunk.stop - chunk.start))
    return plans


def _concat(segments: list[np.ndarray]) -> np.ndarray:
    if len(segments) == 1:
        return np.asarray(segments[0], dtype=np.int32)
    return np.concatenate(segments).astype(np.int32, copy=False)


def fill_random_next(plan: InstancePlan, random_doc: Document, cfg: InstanceConfig) -> InstancePlan:
    """Draw B from `random_doc` (the document `plan.random_doc_index` names): whole segments from a
    uniformly drawn start until `target_b_length` tokens or the document's end, at least one."""
    if plan.random_doc_index is None:
        raise ValueError(f"document {plan.doc_index} instance {plan.instance_index}: "
                         "not a random-next plan")
    if not len(random_doc):
        raise ValueError(f"random-next document {plan.random_doc_index} has no segments")
    key = stream_key(cfg.random_seed, plan.pass_index, plan.doc_index, plan.instance_index,
                     _RANDOM_START)
    first = (key * len(random_doc)) >> 64  # a uniform index from 64 random bits (Lemire 2019)
    end = _random_next_segments(random_doc, first, plan.target_b_length)
    return InstancePlan(
        doc_index=plan.doc_index, pass_index=plan.pass_index, instance_index=plan.instance_index,
        tokens_a=plan.tokens_a, tokens_b=_concat(random_doc[first:end]),
        random_doc_index=plan.random_doc_index, target_b_length=plan.target_b_length,
        next_sentence_label=plan.next_sentence_label, a_segments=plan.a_segments,
        b_segments=(first, end), chunk_segments=plan.chunk_segments)


def _removals(len_a, len_b, max_num_tokens: int):
    """Tokens the reference's truncation removes from A and from B (ints, or (N,) arrays).

    It always trims the longer side, B on ties, so the counts follow from the lengths alone;
    only front-or-back is random.
    """
    if isinstance(len_a, int):
        excess = max(len_a + len_b - max_num_tokens, 0)
        from_longer = min(excess, abs(len_a - len_b))
        rest = excess - from_longer  # equal lengths from here on: B, A, B, A, ...
        if len_a > len_b:
            return rest // 2 + from_longer, rest - rest // 2
        return rest // 2, rest - rest // 2 + from_longer
    excess = np.maximum(len_a + len_b - max_num_tokens, 0)
    from_longer = np.minimum(excess, np.abs(len_a - len_b))
    rest = excess - from_longer
    a_longer = len_a > len_b
    cut_a = rest // 2 + np.where(a_longer, from_longer, 0)
    cut_b = rest - rest // 2 + np.where(a_longer, 0, from_longer)
    return cut_a, cut_b


def finalize_instance(plan: InstancePlan, vocab: Vocab, cfg: InstanceConfig) -> Instance:
    """Truncate, add the special tokens and mask one plan: the same instance as
    `finalize_instances` gives (prefer that one for many plans: it is several times faster)."""
    nsp = cfg.next_sentence
    _check_has_b(plan, nsp)
    if cfg.do_whole_word_mask:
        return finalize_instances([plan], vocab, cfg)[0]
    a = plan.tokens_a
    b = plan.tokens_b if nsp else a[:0]
    cut_a, cut_b = _removals(len(a), len(b), cfg.max_num_tokens)
    keep_a = len(a) - cut_a
    num_tokens = keep_a + len(b) - cut_b + (3 if nsp else 2)
    n = num_to_predict(num_tokens, cfg)
    cuts = cut_a + cut_b
    u = uniforms(stream_key(cfg.random_seed, plan.pass_index, plan.doc_index, plan.instance_index,
                            _FINALIZE), cuts + num_tokens + n)
    if cuts:
        front_a = int(np.count_nonzero(u[:cut_a] < 0.5))
        front_b = int(np.count_nonzero(u[cut_a:cuts] < 0.5))
        a = a[front_a:front_a + keep_a]
        b = b[front_b:front_b + len(b) - cut_b]
    if nsp:
        tokens = np.concatenate(([vocab.cls_id], a, [vocab.sep_id], b, [vocab.sep_id]))
    else:
        tokens = np.concatenate(([vocab.cls_id], a, [vocab.sep_id]))
    tokens = tokens.astype(np.int32, copy=False)  # (T,)
    segment_ids = np.zeros(num_tokens, dtype=np.uint8)
    segment_ids[keep_a + 2:] = 1
    candidates = np.flatnonzero((tokens != vocab.cls_id) & (tokens != vocab.sep_id))
    if n < len(candidates):
        keys = u[cuts:cuts + num_tokens][candidates]
        candidates = np.sort(candidates[np.argpartition(keys, n - 1)[:n]])
    positions = candidates.astype(np.int32)
    masked_ids = tokens[positions]
    replace_tokens(tokens, positions, u[cuts + num_tokens:cuts + num_tokens + len(positions)],
                   cfg, vocab.mask_id, vocab.replacement_ids)
    return Instance(input_ids=tokens, segment_ids=segment_ids, masked_lm_positions=positions,
                    masked_lm_ids=masked_ids, next_sentence_label=plan.next_sentence_label)


def _check_has_b(plan: InstancePlan, nsp: bool) -> None:
    if nsp and plan.tokens_b is None:
        raise ValueError(f"document {plan.doc_index} instance {plan.instance_index}: "
                         "random-next plan without B (call fill_random_next first)")


def finalize_instances(plans: Sequence[InstancePlan], vocab: Vocab,
                       cfg: InstanceConfig) -> list[Instance]:
    """Truncate, add the special tokens and mask, vectorised over a batch of plans.

    Each instance uses its own stream, `uniforms(stream_key(seed, pass, doc, instance, 1), k)`,
    so the result does not depend on how plans are batched: its first numbers pick front or
    back for each truncated token (< 0.5 = front), the next T are sort keys that shuffle the
    mask candidates (the n smallest are masked), and one number per masked position picks
    [MASK], unchanged or a random token (`common.masking.replace_tokens`; at 80/10/10 the
    reference's split per wordpiece).
    """
    n_plans = len(plans)
    if not n_plans:
        return []
    nsp = cfg.next_sentence
    for plan in plans:
        _check_has_b(plan, nsp)
    a_list = [plan.tokens_a for plan in plans]
    b_list = [plan.tokens_b for plan in plans] if nsp else []
    len_a = np.fromiter(map(len, a_list), dtype=np.int64, count=n_plans)
    len_b = np.fromiter(map(len, b_list), dtype=np.int64, count=n_plans) if nsp else len_a * 0
    cut_a, cut_b = _removals(len_a, len_b, cfg.max_num_tokens)
    keep_a, keep_b = len_a - cut_a, len_b - cut_b
    num_tokens = keep_a + keep_b + (3 if nsp else 2)  # (N,) T
    n_pred = num_to_predict(num_tokens, cfg)

    cuts = cut_a + cut_b
    counts = cuts + num_tokens + n_pred
    keys = _stream_keys(cfg.random_seed, [p.pass_index for p in plans],
                        [p.doc_index for p in plans], [p.instance_index for p in plans], _FINALIZE)
    u = _batch_uniforms(keys, counts)  # (sum counts,)
    u_start = np.cumsum(counts) - counts

    front = np.concatenate([[0], np.cumsum(u < 0.5)])  # coin counts: front(j) = # coins < j
    front_a = front[u_start + cut_a] - front[u_start]
    front_b = front[u_start + cuts] - front[u_start + cut_a]

    tokens, segment_ids, row_start = _assemble(a_list, b_list, len_a, front_a, keep_a, front_b,
                                               num_tokens, vocab, nsp)
    key_start = u_start + cuts
    if cfg.do_whole_word_mask:
        positions, num_masked = _choose_whole_words(tokens, row_start, num_tokens, u, key_start,
                                                    n_pred, vocab)
    else:
        positions, num_masked = _choose_positions(tokens, row_start, num_tokens, u, key_start,
                                                  n_pred, vocab)
    masked_start = np.cumsum(num_masked) - num_masked
    flat = np.repeat(row_start, num_masked) + positions  # (M,) indices into tokens
    masked_ids = tokens[flat]
    draw_index = (np.repeat(key_start + num_tokens - masked_start, num_masked)
                  + np.arange(len(flat)))
    replace_tokens(tokens, flat, u[draw_index], cfg, vocab.mask_id, vocab.replacement_ids)

    out = []
    for i, plan in enumerate(plans):
        r, t, m, k = row_start[i], num_tokens[i], masked_start[i], num_masked[i]
        out.append(Instance(input_ids=tokens[r:r + t], segment_ids=segment_ids[r:r + t],
                            masked_lm_positions=positions[m:m + k],
                            masked_lm_ids=masked_ids[m:m + k],
                            next_sentence_label=plan.next_sentence_label))
    return out


def _assemble(a_list, b_list, len_a, front_a, keep_a, front_b, num_tokens, vocab: Vocab,
              nsp: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """[CLS] A' [SEP] B' [SEP] for every row, flat: tokens (sum T,) int32, segment ids (sum T,)
    uint8 and row starts (N,), where A' = A[front_a : front_a + keep_a] (B' alike)."""
    flat_a = np.concatenate(a_list)
    flat_b = np.concatenate(b_list) if nsp else flat_a[:0]
    a_start = np.cumsum(len_a) - len_a
    b_start = (np.cumsum([len(b) for b in b_list]) - [len(b) for b in b_list]) if nsp else a_start
    source = np.concatenate([flat_a, flat_b, [vocab.cls_id, vocab.sep_id]]).astype(np.int32)
    cls_at, sep_at = len(source) - 2, len(source) - 1

    row_start = np.cumsum(num_tokens) - num_tokens
    pos = np.arange(num_tokens.sum()) - np.repeat(row_start, num_tokens)  # (sum T,) in-row position
    end_a = np.repeat(keep_a, num_tokens)  # last A position (A' occupies 1..keep_a)
    index = np.full(len(pos), sep_at, dtype=np.int64)
    in_a = (pos >= 1) & (pos <= end_a)
    index[in_a] = (np.repeat(a_start + front_a - 1, num_tokens) + pos)[in_a]
    if nsp:
        in_b = (pos >= end_a + 2) & (pos < np.repeat(num_tokens - 1, num_tokens))
        b_base = len(flat_a) + b_start + front_b - keep_a - 2
        index[in_b] = (np.repeat(b_base, num_tokens) + pos)[in_b]
    index[row_start] = cls_at
    segment_ids = (pos >= end_a + 2).astype(np.uint8)
    return source[index], segment_ids, row_start


def _choose_positions(tokens, row_start, num_tokens, u, key_start, n_pred,
                      vocab: Vocab) -> tuple[np.ndarray, np.ndarray]:
    """Per row, the n_pred candidates with the smallest sort keys, ascending.

    Returns positions (M,) int32 (rows concatenated) and the count per row (N,).
    """
    n_rows, width = len(num_tokens), int(num_tokens.max())
    row = np.repeat(np.arange(n_rows), num_tokens)
    pos = np.arange(len(tokens)) - np.repeat(row_start, num_tokens)
    candidate = (tokens != vocab.cls_id) & (tokens != vocab.sep_id)
    sort_keys = np.full((n_rows, width), 2.0)  # (N, Tmax); 2.0 = not a candidate
    sort_keys[row, pos] = np.where(candidate, u[np.repeat(key_start, num_tokens) + pos], 2.0)
    k = min(int(n_pred.max()), width)
    best = np.argpartition(sort_keys, k - 1, axis=1)[:, :k] if k < width else \
        np.broadcast_to(np.arange(width), (n_rows, width))  # (N, k) unordered
    best_keys = np.take_along_axis(sort_keys, best, axis=1)
    order = np.argsort(best_keys, axis=1, kind="stable")
    best = np.take_along_axis(best, order, axis=1)  # (N, k) by key
    chosen = (np.arange(k) < n_pred[:, None]) & (np.take_along_axis(best_keys, order, axis=1) < 2.0)
    chosen_pos = np.sort(np.where(chosen, best, width), axis=1)  # (N, k) ascending, unused = width
    num_masked = chosen.sum(axis=1)
    return chosen_pos[np.arange(k) < num_masked[:, None]].astype(np.int32), num_masked


def _choose_whole_words(tokens, row_start, num_tokens, u, key_start, n_pred,
                        vocab: Vocab) -> tuple[np.ndarray, np.ndarray]:
    """Whole-word masking: word groups (`common.masking.word_groups`) in the order of their sort keys,
    skipping a group that would exceed n_pred, as the reference's scan. One row at a time."""
    positions, counts = [], []
    for r, t, k, n in zip(row_start, num_tokens, key_start, n_pred):
        row = tokens[r:r + t]
        cand = np.flatnonzero((row != vocab.cls_id) & (row != vocab.sep_id))
        group = word_groups(row[cand], vocab.is_subword)  # (C,) group of each candidate
        sizes = np.bincount(group)
        chosen = take_word_groups(sizes, np.argsort(u[k:k + len(sizes)], kind="stable"), n)
        picked = cand[np.isin(group, chosen)]  # ascending
        positions.append(picked)
        counts.append(len(picked))
    return np.concatenate(positions).astype(np.int32), np.asarray(counts, dtype=np.int64)


def create_instances_scalable(documents: list[Document], vocab: Vocab, cfg: InstanceConfig,
                              batch_size: int = 512,
                              progress: Callable[[int], None] | None = None) -> list[Instance]:
    """Scalable mode on one machine: every pass of every document, in (pass, document) order.

    The Beam job distributes the same three steps; its output equals this one up to order.
    `progress`, if given, is called with the number of documents done after each document.
    """
    out: list[Instance] = []
    batch: list[InstancePlan] = []
    for plans in document_plans(documents, cfg):
        batch.extend(plans)
        if len(batch) >= batch_size:
            out.extend(finalize_instances(batch, vocab, cfg))
            batch = []
        if progress is not None:
            progress(1)
    out.extend(finalize_instances(batch, vocab, cfg))
    return out


def document_plans(documents: list[Document], cfg: InstanceConfig) -> Iterator[list[InstancePlan]]:
    """The plans of each (pass, document), random next filled, in (pass, document) order."""
    for pass_index in range(cfg.dupe_factor):
        for doc_index, doc in enumerate(documents):
            plans = []
            for plan in plan_document(doc, doc_index, len(documents), pass_index, cfg):
                if plan.random_doc_index is not None:
                    plan = fill_random_next(plan, documents[plan.random_doc_index], cfg)
                plans.append(plan)
            yield plans
