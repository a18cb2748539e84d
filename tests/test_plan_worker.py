"""The planner in a process of its own: the same candidates and predictions as in the caller's process, its
shared files removed, and a failure leaving the planning to the caller."""
import logging
import os

import numpy as np
import pytest

from tuner import loaders, plan_worker
from tuner.families.base import known_layout, ordered_matrix
from tuner.families.tiles import TILE_ORDER
from tuner.matrix import canonicalize
from tuner.model import load_profile
from tuner.model.lookup import predicted_candidates

pytestmark = pytest.mark.skipif(not plan_worker.available(), reason="no /dev/shm to share arrays through")


@pytest.fixture(scope="module")
def profile():
    return load_profile("NVIDIA H200")


def _relabelled(A):
    m = canonicalize(A)
    ordered_matrix(m, TILE_ORDER)
    return m, known_layout(m, ("permuted", TILE_ORDER)), known_layout(m, ("ordering", TILE_ORDER))


def _source(name):
    if name == "rectangular":  # rows and columns relabelled by permutations of their own
        return loaders.load("rmat:13")[:5000]
    return loaders.load(name)


@pytest.mark.parametrize("source", ["rmat:14", "rmat:12:4", "rectangular"])
def test_the_planner_process_gives_the_callers_candidates_and_predictions(source, profile, monkeypatch, tmp_path):
    monkeypatch.setattr(plan_worker, "SHARED_DIR", str(tmp_path))
    monkeypatch.setattr(plan_worker, "INLINE_BYTES", 64)  # the index arrays cross through files
    A = _source(source)
    assert plan_worker.start()
    m, view, ordering = _relabelled(A)
    specs, predicted, seconds = plan_worker.plan_apart(m, view, ordering, profile)
    here_specs, here_predicted = predicted_candidates(_relabelled(A)[0], profile)
    assert [s.label() for s in specs] == [s.label() for s in here_specs]
    assert predicted == here_predicted and len(predicted) > 20
    assert specs == here_specs  # the same objects' values: what the compile builds and caches
    assert 0 <= seconds["share"] <= seconds["plan"] and 0 < seconds["child"] <= seconds["plan"]
    # The caller's column indices stay in the caller's process: the child reads them through the view.
    assert seconds["shared_bytes"] == sum(x.nbytes for x in (m.indptr, view.indptr, view.indices,
                                                             ordering.row_order, ordering.row_rank)
                                          + (() if ordering.symmetric else (ordering.col_order,)))
    assert seconds["child_peak_bytes"] > 10 << 20
    assert os.listdir(tmp_path) == []  # the shared files go once the answer is in


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="VmHWM is Linux's")
def test_the_planner_processs_peak_memory_is_its_own_not_the_callers_at_its_start(profile):
    plan_worker.stop()
    held = np.ones(384 << 20, np.uint8)  # the caller's resident memory when the child starts: 384 MiB more
    assert plan_worker.start()
    m, view, ordering = _relabelled(loaders.load("rmat:12"))
    _, _, seconds = plan_worker.plan_apart(m, view, ordering, profile)
    assert 10 << 20 < seconds["child_peak_bytes"] < held.nbytes
    assert plan_worker._peak_bytes() > held.nbytes  # this process's own, which holds it
    plan_worker.stop()


@pytest.mark.parametrize("source", ["rmat:12", "rectangular"])
def test_the_callers_indices_read_through_the_view_equal_its_own(source):
    m, view, ordering = _relabelled(_source(source))
    assert ordering.symmetric == (m.n_rows == m.n_cols)
    through = plan_worker.ViewIndices(m.indptr, view, ordering, m.index_dtype)
    assert through.size == m.nnz and through.dtype == m.index_dtype and through.shape == m.indices.shape
    rng = np.random.default_rng(4)
    rows = rng.choice(m.n_rows, 300, replace=False)
    lengths, cols = m.row_entries(rows)
    at = np.concatenate([np.arange(m.indptr[r], m.indptr[r + 1]) for r in rows])
    assert np.array_equal(through[at], cols) and through[at].dtype == m.index_dtype
    picked = rng.integers(0, m.nnz, 1000)  # any positions, in any order
    assert np.array_equal(through[picked], m.indices[picked])
    with pytest.raises(TypeError, match="row by row"):
        np.asarray(through)


def test_column_lengths_counted_beside_the_ordering_are_the_planners_own(profile):
    import dataclasses
    A = loaders.load("rmat:13")
    m, view, ordering = _relabelled(A)
    counted = dataclasses.replace(ordering, col_lengths=m.col_lengths[ordering.col_order])  # as the GPU leaves it
    assert plan_worker.start()
    specs, predicted, _ = plan_worker.plan_apart(m, view, counted, profile)
    here_specs, here_predicted = predicted_candidates(_relabelled(A)[0], profile)
    assert specs == here_specs and predicted == here_predicted


def test_a_failing_planner_process_leaves_the_planning_to_the_caller(profile, caplog):
    m, view, ordering = _relabelled(loaders.load("rmat:10"))
    assert plan_worker.start()
    with caplog.at_level(logging.WARNING, logger="tuner.plan_worker"):
        assert plan_worker.plan_apart(m, view, ordering, profile=None) is None  # the child's planner raises
    assert "planning in this process" in caplog.text and "AttributeError" in caplog.text
    assert plan_worker._child is None  # stopped; the next start makes a new one, which plans
    assert plan_worker.start()
    specs, predicted, _ = plan_worker.plan_apart(m, view, ordering, profile)
    assert len(specs) == len(predicted) > 0 and all(p is not None and p > 0 for p in predicted)


def test_planning_apart_is_left_out_where_it_would_take_over_half_the_free_host_memory(profile, monkeypatch):
    m, view, ordering = _relabelled(loaders.load("rmat:12"))
    need = plan_worker.host_bytes(m, view, ordering)
    shared = sum(x.nbytes for x in (m.indptr, view.indptr, view.indices, ordering.row_order, ordering.row_rank))
    assert need == plan_worker.CHILD_SHARE_FACTOR * shared + plan_worker.CHILD_BASE_BYTES
    assert plan_worker.start()
    monkeypatch.setenv("TUNER_HOST_MEMORY_LIMIT", str(2 * need - 2))
    assert plan_worker.plan_apart(m, view, ordering, profile) is None
    monkeypatch.setenv("TUNER_HOST_MEMORY_LIMIT", str(2 * need + 2))
    assert plan_worker.plan_apart(m, view, ordering, profile) is not None


def test_without_a_planner_process_plan_apart_returns_none(profile, monkeypatch):
    monkeypatch.setattr(plan_worker, "_child", None)
    m, view, ordering = _relabelled(loaders.load("rmat:10"))
    assert plan_worker.plan_apart(m, view, ordering, profile) is None


def test_a_full_shared_folder_leaves_the_planning_to_the_caller(profile, monkeypatch, tmp_path, caplog):
    def no_room(fd, offset, length):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(plan_worker, "SHARED_DIR", str(tmp_path))
    monkeypatch.setattr(plan_worker, "INLINE_BYTES", 64)
    monkeypatch.setattr(os, "posix_fallocate", no_room)
    m, view, ordering = _relabelled(loaders.load("rmat:10"))
    assert plan_worker.start()
    with caplog.at_level(logging.WARNING, logger="tuner.plan_worker"):
        assert plan_worker.plan_apart(m, view, ordering, profile) is None
    assert "No space left" in caplog.text
    assert os.listdir(tmp_path) == []


def test_shared_arrays_cross_inline_and_through_files_unchanged(tmp_path, monkeypatch):
    monkeypatch.setattr(plan_worker, "SHARED_DIR", str(tmp_path))
    monkeypatch.setattr(plan_worker, "INLINE_BYTES", 100)
    shared = plan_worker._SharedArrays()
    rng = np.random.default_rng(3)
    arrays = [rng.integers(0, 1 << 30, 1000).astype(np.int32), np.arange(5, dtype=np.int64),
              np.empty(0, np.int32), rng.random((40, 3))]
    descs = [shared.put(a) for a in arrays]
    assert [d[0] for d in descs] == ["file", "inline", "inline", "file"]
    for a, d in zip(arrays, descs):
        back = plan_worker._array(d)
        assert back.dtype == a.dtype and back.shape == a.shape and np.array_equal(back, a)
    shared.close()
    assert os.listdir(tmp_path) == []


class _WritesToStdout:
    """Unpickled in the planner process, it writes to file descriptor 1, as a library's C code might."""

    def __reduce__(self):
        return (os.write, (1, b"noise on stdout\n"))


def test_what_the_planner_process_writes_to_stdout_does_not_reach_its_answers():
    import time
    assert plan_worker.start()
    child = plan_worker._child
    plan_worker._send(child.stdin, {"noise": _WritesToStdout()})  # not a request: the child answers an error
    reply = plan_worker._receive(child.stdout.fileno(), time.monotonic() + 60)
    assert reply[0] == "error" and "KeyError" in reply[1]
    assert child.poll() is None  # and serves on
