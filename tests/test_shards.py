"""The test suite's --shard K/N option (tests/conftest.py), which splits the GPU tests over several calls of a
time-limited GPU machine."""
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import shard_part


def test_the_parts_of_a_shard_split_are_disjoint_cover_every_item_and_interleave():
    items = [f"t{i}" for i in range(11)]
    parts = [shard_part(items, f"{k}/3")[0] for k in (1, 2, 3)]
    assert parts == [["t0", "t3", "t6", "t9"], ["t1", "t4", "t7", "t10"], ["t2", "t5", "t8"]]
    assert sorted(sum(parts, []), key=lambda t: int(t[1:])) == items
    kept, dropped = shard_part(items, "2/3")
    assert sorted(kept + dropped, key=lambda t: int(t[1:])) == items and not set(kept) & set(dropped)


@pytest.mark.parametrize("spec", ["0/2", "3/2", "1", "a/b", "1/0"])
def test_a_shard_spec_outside_1_to_n_or_not_k_of_n_is_refused_by_name(spec):
    with pytest.raises(pytest.UsageError, match="--shard"):
        shard_part(["t0", "t1"], spec)


def test_two_shards_of_the_gpu_tests_collect_every_gpu_test_once():
    root = Path(__file__).resolve().parent.parent

    def collected(*args):
        out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                              "-m", "gpu", "tests/test_shards.py", "tests/test_device_sort.py", *args],
                             cwd=root, capture_output=True, text=True, check=True).stdout
        return [line for line in out.splitlines() if "::" in line]
    every = collected()
    halves = [collected("--shard", "1/2"), collected("--shard", "2/2")]
    assert len(every) > 2 and all(halves)
    assert sorted(halves[0] + halves[1]) == sorted(every)
    assert not set(halves[0]) & set(halves[1])
