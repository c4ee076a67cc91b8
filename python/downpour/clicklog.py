"""Click logs for recommendation models, as NumPy batches: a deterministic
synthetic generator shaped like Criteo Kaggle (13 dense and 26 categorical
fields, ids drawn from power laws, labels from a planted logistic model
whose accuracy is the best achievable), and a reader of Criteo's own TSV
files. Both are C++ (clicklog/), filling the arrays without the GIL::

    from downpour import clicklog

    gen = clicklog.Generator(seed=1, scale=0.01)   # tables at 1% of Criteo's
    for batch in gen.stream(rank=r, num_shards=n, batch_size=256):
        batch.dense        # float32 [256, 13]: log(1 + count)
        batch.categorical  # int64 [256, 26]: ids in [0, cardinality)
        batch.labels       # float32 [256]: 0 or 1
    test = gen.held_out(100_000)                   # never among training rows
    gen.planted(1_000_000)    # {'auc': 0.806, 'log_loss': 0.453, ...}

    for batch in clicklog.read_tsv("train.txt", batch_size=4096):
        ...

Rows. Training row i (i < 2**40) is a pure function of (options, i), so a
stream never holds more than a batch, any rank can make its rows alone,
and the same seed gives the same rows everywhere; ``stream(rank, n)`` takes
rows rank, rank + n, ... Held-out rows start at HELD_OUT_FIRST_ROW.

Fields. Categorical field f has CRITEO_CARDINALITIES[f] * scale ids
(rounded, never below min(size, 16)), id 0 the most frequent, drawn from a
Zipf law with exponent ``zipf_exponent`` (1.1 by default). Dense fields
are exponential counts with Criteo-like means, reported as log(1 + count)
(the TSV reader reports Criteo's counts the same way).

Labels. P(click) = sigmoid(bias + sum_f w_f(id_f) + sum_j v_j * dense_j
standardized), w_f(id) a hidden weight per id that is a hash of
(seed, f, id) scaled to ``id_weight_stddev`` (nothing of the tables' size
is ever stored). ``planted(rows)`` is the best achievable AUC and log loss:
those of the true probabilities on held-out rows, with the label noise
integrated out (``expected_auc``); clicklog/generator.h says more.

Keys. Categorical ids become table keys through ``feature_keys(ids,
feature)``: a bijection of the id per feature, mixing ids over the 64-bit
key space (downpour.embedding uses it).
"""

from __future__ import annotations

from typing import Iterator, NamedTuple, Optional, Sequence, Union

import numpy as np

from downpour import _downpour

NUM_DENSE: int = _downpour.CLICKLOG_NUM_DENSE
NUM_CATEGORICAL: int = _downpour.CLICKLOG_NUM_CATEGORICAL
CRITEO_CARDINALITIES = tuple(_downpour.CLICKLOG_CRITEO_CARDINALITIES)
HELD_OUT_FIRST_ROW: int = _downpour.CLICKLOG_HELD_OUT_FIRST_ROW
MISSING_ID: int = _downpour.CLICKLOG_MISSING_ID


class Batch(NamedTuple):
    """Rows of click logs: dense float32 [B, 13], categorical int64
    [B, 26], labels float32 [B]."""

    dense: np.ndarray
    categorical: np.ndarray
    labels: np.ndarray

    def __len__(self) -> int:  # rows, not fields
        return len(self.labels)


class Generator:
    """The synthetic Criteo-shaped click logs (see the module docstring).
    Thread-safe; cheap to share."""

    def __init__(self, *, seed: int = 1, scale: float = 1.0,
                 zipf_exponent: float = 1.1, **planted_model: float):
        """planted_model: id_weight_stddev, dense_weight_stddev, bias
        (clicklog/generator.h's defaults when absent). Raises
        InvalidArgumentError for a scale outside (0, 1000] or a bad
        parameter."""
        self._gen = _downpour.ClickLogGenerator(
            seed=seed, scale=scale, zipf_exponent=zipf_exponent,
            **planted_model)

    @property
    def cardinalities(self) -> tuple:
        """Ids per categorical field after scaling."""
        return tuple(self._gen.cardinalities)

    @property
    def seed(self) -> int:
        return self._gen.seed

    def rows(self, first_row: int, count: int, stride: int = 1) -> Batch:
        """Rows first_row, first_row + stride, ... (count of them)."""
        return Batch(*self._gen.fill(first_row, count, stride))

    def probabilities(self, first_row: int, count: int,
                      stride: int = 1) -> np.ndarray:
        """The planted model's click probabilities (float64) of those rows."""
        return self._gen.fill(first_row, count, stride, probabilities=True)[3]

    def held_out(self, count: int) -> Batch:
        """The first `count` held-out rows (never in a training stream)."""
        return self.rows(HELD_OUT_FIRST_ROW, count)

    def stream(self, rank: int = 0, num_shards: int = 1, batch_size: int = 256,
               start: int = 0, batches: Optional[int] = None
               ) -> Iterator[Batch]:
        """Batches of this rank's rows (rank, rank + num_shards, ...), from
        its start'th row on; endless unless `batches` is given."""
        s = _downpour.ClickLogStream(self._gen, rank, num_shards, start)
        n = 0
        while batches is None or n < batches:
            yield Batch(*s.next(batch_size))
            n += 1

    def planted(self, rows: int = 1_000_000) -> dict:
        """{'auc', 'log_loss', 'click_rate'} of the planted model on `rows`
        held-out rows: the best achievable figures."""
        return self._gen.planted(rows)

    def id_weight(self, field: int, id: int) -> float:
        """The planted model's hidden weight of (field, id)."""
        return self._gen.id_weight(field, id)


def read_tsv(path: str, batch_size: int = 4096, *, rank: int = 0,
             num_shards: int = 1) -> Iterator[Batch]:
    """Batches from a file in Criteo's TSV format (label, 13 integers, 26 hex
    ids, tab-separated, empty fields allowed); lines rank, rank +
    num_shards, ... The last batch may be short. Raises NotFoundError for a
    missing file and InvalidArgumentError naming the file, line and field
    of a malformed line."""
    reader = _downpour.CriteoTsvReader(path, rank=rank, num_shards=num_shards)
    while True:
        b = Batch(*reader.read(batch_size))
        if len(b) == 0:
            return
        yield b


def auc(scores, labels) -> float:
    """ROC AUC (ties count one half); 0.5 if a class is empty."""
    return _downpour.clicklog_auc(scores, labels)


def log_loss(probabilities, labels) -> float:
    """Mean binary cross-entropy (nats), probabilities clamped to
    [1e-7, 1 - 1e-7]."""
    return _downpour.clicklog_log_loss(probabilities, labels)


def expected_auc(probabilities) -> float:
    """The AUC of scoring by p when each label is Bernoulli(p): the best
    achievable AUC of rows whose true click probabilities are p."""
    return _downpour.clicklog_expected_auc(
        np.ascontiguousarray(probabilities, dtype=np.float64))


def feature_keys(ids, feature: Union[int, Sequence[int]] = 0) -> np.ndarray:
    """Table keys (uint64, ids' shape) of int64 ids: SplitMix64(id ^
    salt(feature)), a bijection of the id per feature (clicklog/
    feature_key.h). `feature` is one feature for all, or one per position
    of the last dimension (e.g. range(26) for a [B, 26] batch)."""
    if not isinstance(feature, int):
        feature = list(feature)
    return _downpour.feature_keys(np.asarray(ids), feature)
