"""downpour.clicklog: the synthetic generator (same seed, same rows; shards;
the planted model's AUC on a sample against its expected value) and the
Criteo TSV reader (its rows and its errors), through the Python binding."""

from __future__ import annotations

import os

import numpy as np
import pytest

import downpour
from conftest import work_dir
from downpour import clicklog


def test_same_seed_same_rows():
    a = clicklog.Generator(seed=3, scale=0.01).rows(0, 2000)
    b = clicklog.Generator(seed=3, scale=0.01).rows(0, 2000)
    c = clicklog.Generator(seed=4, scale=0.01).rows(0, 2000)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    assert not np.array_equal(a.categorical, c.categorical)
    assert a.dense.dtype == np.float32 and a.dense.shape == (2000, 13)
    assert a.categorical.dtype == np.int64 and a.categorical.shape == (2000, 26)
    assert a.labels.dtype == np.float32 and a.labels.shape == (2000,)
    assert set(np.unique(a.labels)) <= {0.0, 1.0}


def test_streams_shard_by_row_index():
    gen = clicklog.Generator(seed=1, scale=0.01)
    whole = gen.rows(0, 300)
    for rank in range(3):
        got = list(gen.stream(rank, 3, batch_size=25, batches=4))
        assert len(got) == 4
        cat = np.concatenate([b.categorical for b in got])
        np.testing.assert_array_equal(cat, whole.categorical[rank::3])
    # A stream can start where another stopped.
    late = next(gen.stream(1, 3, batch_size=25, start=75))
    np.testing.assert_array_equal(late.categorical,
                                  whole.categorical[1 + 75 * 3::3][:25])


def test_cardinalities_and_ids():
    gen = clicklog.Generator(seed=1, scale=0.01)
    cards = np.array(gen.cardinalities)
    full = np.array(clicklog.CRITEO_CARDINALITIES)
    assert full.sum() == 33762577
    np.testing.assert_array_equal(
        cards, np.maximum(np.minimum(full, 16), np.round(full * 0.01)))
    b = gen.rows(0, 20000)
    assert (b.categorical >= 0).all() and (b.categorical < cards).all()
    # A power law: id 0 is the most frequent id of the largest field.
    counts = np.bincount(b.categorical[:, 2])
    assert counts.argmax() == 0 and counts[0] > 20 * np.median(counts)


def test_planted_auc_within_tolerance_of_its_expected_value():
    """The planted probabilities scored against the labels drawn, on 200k
    training rows, reach the AUC that planted() computes with the label
    noise integrated out on 500k other (held-out) rows: the AUC's standard
    deviation here is about 0.0013, the tolerance 0.007."""
    gen = clicklog.Generator(seed=2, scale=0.01)
    planted = gen.planted(500_000)
    assert 0.78 < planted["auc"] < 0.85
    b = gen.rows(0, 200_000)
    p = gen.probabilities(0, 200_000)
    assert abs(clicklog.auc(p.astype(np.float32), b.labels)
               - planted["auc"]) < 0.007
    assert abs(clicklog.log_loss(p.astype(np.float32), b.labels)
               - planted["log_loss"]) < 0.007
    assert abs(clicklog.expected_auc(p) - planted["auc"]) < 0.007
    # A model that knows nothing is at 0.5.
    assert abs(clicklog.auc(np.zeros(200_000, np.float32), b.labels)
               - 0.5) < 1e-9


def _line(label="1", counts=None, ids=None):
    counts = counts if counts is not None else [str(i) for i in range(13)]
    ids = ids if ids is not None else [f"{0x10 + i:08x}" for i in range(26)]
    return "\t".join([label] + counts + ids) + "\n"


def test_tsv_reader_reads_criteo_lines(tmp_path):
    path = os.path.join(work_dir("clicklog_tsv"), "day.tsv")
    empty_counts = [""] * 13
    empty_ids = [""] * 25 + ["deadbeef"]
    with open(path, "w") as f:
        f.write(_line() + _line("0", empty_counts, empty_ids) + _line("1"))
    batches = list(clicklog.read_tsv(path, batch_size=2))
    assert [len(b) for b in batches] == [2, 1]
    first, second = batches[0], batches[1]
    np.testing.assert_array_equal(first.labels, [1, 0])
    np.testing.assert_allclose(first.dense[0], np.log1p(np.arange(13)),
                               rtol=1e-6)
    assert (first.dense[1] == 0).all()
    assert first.categorical[0, 25] == 0x29
    assert (first.categorical[1, :25] == clicklog.MISSING_ID).all()
    assert first.categorical[1, 25] == 0xDEADBEEF
    assert len(second) == 1
    # Shards: lines 1, 3, ... for rank 1 of 2.
    only = list(clicklog.read_tsv(path, rank=1, num_shards=2))
    assert len(only) == 1 and len(only[0]) == 1
    np.testing.assert_array_equal(only[0].labels, [0])


@pytest.mark.parametrize("bad,message", [
    (_line("x"), r"day\.tsv:2: field 1 \(label\): 'x' is not a label"),
    (_line("1", ["12a"] + [""] * 12),
     r"day\.tsv:2: field 2 \(I1\): '12a' is not an integer"),
    (_line("1", None, ["nothex!"] + [""] * 25),
     r"day\.tsv:2: field 15 \(C1\): 'nothex!' is not a hex id"),
    ("1\t2\n", r"day\.tsv:2: 2 tab-separated fields, expected 40"),
])
def test_tsv_reader_errors_name_file_and_line(bad, message):
    path = os.path.join(work_dir("clicklog_tsv_errors"), "day.tsv")
    with open(path, "w") as f:
        f.write(_line() + bad + _line())
    with pytest.raises(downpour.InvalidArgumentError, match=message):
        list(clicklog.read_tsv(path, batch_size=10))
    with pytest.raises(downpour.NotFoundError, match="nonexistent"):
        list(clicklog.read_tsv("/nonexistent/day.tsv"))


def test_generator_rows_read_back_from_tsv():
    """clicklog_gen --tsv writes what the reader reads: the same bits."""
    gen = clicklog.Generator(seed=5, scale=0.01)
    dense, cat, labels, counts = gen._gen.fill(0, 300, counts=True)
    path = os.path.join(work_dir("clicklog_roundtrip"), "gen.tsv")
    with open(path, "w") as f:
        for r in range(300):
            f.write(_line(str(int(labels[r])),
                          [str(c) for c in counts[r]],
                          [f"{i:08x}" for i in cat[r]]))
    back = next(clicklog.read_tsv(path, batch_size=1000))
    np.testing.assert_array_equal(back.dense, dense)
    np.testing.assert_array_equal(back.categorical, cat)
    np.testing.assert_array_equal(back.labels, labels)
