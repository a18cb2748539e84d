import pickle

import pytest

from tuner import memory
from tuner.memory import (
    InsufficientMemoryError,
    available_bytes,
    check_fits,
    human_bytes,
    human_count,
    parse_bytes,
)


# --- figures -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (0, "0 B"),
        (999, "999 B"),
        (1000, "1.0 kB"),
        (999_960, "1.0 MB"),
        (20_100_000_000, "20.1 GB"),
        (24_200_000_000_000, "24.2 TB"),
        (8 * 2**40, "8.8 TB"),
        (10**18, "1.0 EB"),
    ],
)
def test_human_bytes_uses_decimal_units_with_one_decimal(n, text):
    assert human_bytes(n) == text


def test_human_count_uses_decimal_multipliers():
    assert human_count(17_592_186_044_416) == "17.6T"
    assert human_count(16 * 2**25) == "536.9M"
    assert human_count(7) == "7"


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1000000", 1_000_000),
        ("8G", 8_000_000_000),
        ("8g", 8_000_000_000),
        ("512M", 512_000_000),
        ("512MB", 512_000_000),
        ("1.5G", 1_500_000_000),
        ("4GiB", 4 * 2**30),
        ("16 Ki", 16 * 1024),
        (" 2T ", 2 * 10**12),
    ],
)
def test_parse_bytes_takes_decimal_and_binary_suffixes(text, value):
    assert parse_bytes(text) == value


@pytest.mark.parametrize("text", ["", "lots", "8X", "-1G", "G", "8 i"])
def test_parse_bytes_rejects_other_text_naming_it(text):
    with pytest.raises(ValueError, match="is not a byte figure"):
        parse_bytes(text)


# --- the budget --------------------------------------------------------------------------------------


def test_available_bytes_is_at_most_the_kernels_mem_available_without_a_limit():
    with open("/proc/meminfo") as meminfo:
        fields = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in meminfo}
    # A cgroup limit may lower it; other processes move MemAvailable between the two reads.
    assert 0 < available_bytes() <= fields["MemAvailable"] + 0.1 * fields["MemTotal"]


def test_environment_limit_lowers_the_budget(monkeypatch):
    monkeypatch.setenv("TUNER_HOST_MEMORY_LIMIT", "1M")
    assert available_bytes() == 1_000_000


def test_environment_limit_above_the_memory_available_does_not_raise_it(monkeypatch):
    monkeypatch.setenv("TUNER_HOST_MEMORY_LIMIT", "1000P")
    assert available_bytes() < 10**18


def test_bad_environment_limit_names_the_variable(monkeypatch):
    monkeypatch.setenv("TUNER_HOST_MEMORY_LIMIT", "lots")
    with pytest.raises(ValueError, match=r"\$TUNER_HOST_MEMORY_LIMIT: 'lots' is not a byte figure"):
        available_bytes()


def test_cgroup_v2_limit_counts_room_left_plus_inactive_page_cache(tmp_path):
    (tmp_path / "memory.max").write_text("8000000000\n")
    (tmp_path / "memory.current").write_text("3000000000\n")
    (tmp_path / "memory.stat").write_text("anon 2000000000\ninactive_file 500000000\n")
    assert memory._cgroup_available(str(tmp_path)) == 5_500_000_000


def test_cgroup_v1_limit_is_read_from_the_memory_controller(tmp_path):
    v1 = tmp_path / "memory"
    v1.mkdir()
    (v1 / "memory.limit_in_bytes").write_text("4000000000\n")
    (v1 / "memory.usage_in_bytes").write_text("1000000000\n")
    assert memory._cgroup_available(str(tmp_path)) == 3_000_000_000


@pytest.mark.parametrize("limit", ["max\n", "9223372036854771712\n"])
def test_unlimited_or_absent_cgroup_sets_no_budget(tmp_path, limit):
    assert memory._cgroup_available(str(tmp_path)) is None
    (tmp_path / "memory.max").write_text(limit)
    assert memory._cgroup_available(str(tmp_path)) is None


# --- the check ---------------------------------------------------------------------------------------


def test_check_fits_passes_what_fits(monkeypatch):
    monkeypatch.setenv("TUNER_HOST_MEMORY_LIMIT", "1M")
    check_fits(1_000_000, "exactly the budget")


def test_check_fits_refuses_with_what_the_figures_and_how(monkeypatch):
    monkeypatch.setenv("TUNER_HOST_MEMORY_LIMIT", "20.1G")
    with pytest.raises(InsufficientMemoryError) as info:
        check_fits(24_200_000_000_000, "rmat:40", "22 B per drawn edge x 17.6T drawn edges", hint="try rmat:23")
    assert str(info.value) == (
        "rmat:40 would need about 24.2 TB of host memory to build (22 B per drawn edge x 17.6T drawn edges); "
        "20.1 GB is available; try rmat:23"
    )
    assert isinstance(info.value, MemoryError)
    assert (info.value.need_bytes, info.value.available_bytes) == (24_200_000_000_000, 20_100_000_000)


def test_insufficient_memory_error_survives_pickling():
    error = InsufficientMemoryError("kron:g.npz:30", 10**15, 10**9, "49 B per output edge", "use k=3")
    copy = pickle.loads(pickle.dumps(error))
    assert str(copy) == str(error) and copy.how == "49 B per output edge" and copy.hint == "use k=3"


def test_peak_rss_counts_memory_held_during_the_call_and_falls_back_to_tracemalloc(monkeypatch, tmp_path):
    import numpy as np
    from tuner import memory

    def hold():
        a = np.ones(3 * 10**7)  # 240 MB touched, then freed before the call returns
        return float(a.sum())
    total, peak = memory.peak_rss(hold)
    assert total == 3e7 and peak > 2 * 10**8
    small, peak_small = memory.peak_rss(lambda: 1)
    assert small == 1 and peak_small < 10**8
    monkeypatch.setattr(memory, "CLEAR_REFS", str(tmp_path / "missing" / "clear_refs"))
    total, traced = memory.peak_rss(hold)
    assert total == 3e7 and traced >= 2.4 * 10**8  # tracemalloc sees the NumPy buffer itself
