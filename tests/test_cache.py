import json
import logging
import multiprocessing as mp

import pytest

from tuner import paths
from tuner.cache import Cache, atomic_write, make_key


def test_entry_round_trips_and_misses_are_none(tmp_path):
    c = Cache(tmp_path)
    key = make_key("plan", "abc")
    assert c.get("plan", key) is None
    c.put("plan", key, b"payload", meta={"x": 1})
    header, body = c.get_entry("plan", key)
    assert body == b"payload" and header["meta"] == {"x": 1} and header["size"] == 7
    c.put_json("plan", key, {"a": [1, 2]})
    assert c.get_json("plan", key) == {"a": [1, 2]}


@pytest.mark.parametrize("damage", ["truncate", "flip", "garbage", "foreign"])
def test_corrupt_entry_is_reported_once_and_treated_as_absent(tmp_path, caplog, damage):
    c = Cache(tmp_path)
    key, other = make_key("k"), make_key("other")
    path = c.put("cubin", key, b"0123456789" * 10)
    raw = path.read_bytes()
    if damage == "truncate":
        path.write_bytes(raw[:-5])
    elif damage == "flip":
        path.write_bytes(raw[:-1] + bytes([raw[-1] ^ 1]))
    elif damage == "garbage":
        path.write_bytes(b"\x00\x01not json\n")
    else:  # an entry of another key copied over this one
        path.write_bytes(c.put("cubin", other, b"x").read_bytes())
    with caplog.at_level(logging.WARNING, logger="tuner.cache"):
        assert c.get("cubin", key) is None
        assert c.get("cubin", key) is None
    reports = [r for r in caplog.records if str(path) in r.getMessage()]
    assert len(reports) == 1 and "rebuilding" in reports[0].getMessage()
    c.put("cubin", key, b"fresh")
    assert c.get("cubin", key) == b"fresh"


def _writer(root, key, tag, rounds):
    c = Cache(root)
    for i in range(rounds):
        c.put("plan", key, json.dumps({"tag": tag, "i": i, "pad": "x" * 20000}).encode())


def test_concurrent_writers_never_leave_a_partial_entry(tmp_path):
    key = make_key("contended")
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(str(tmp_path), key, t, 40)) for t in range(4)]
    for p in procs:
        p.start()
    c = Cache(tmp_path)
    seen = 0
    while any(p.is_alive() for p in procs):
        body = c.get("plan", key)
        if body is not None:
            assert json.loads(body)["pad"] == "x" * 20000
            seen += 1
    for p in procs:
        p.join()
        assert p.exitcode == 0
    final = json.loads(c.get("plan", key))
    assert final["i"] == 39 and final["tag"] in range(4)
    leftovers = [p for p in (tmp_path / "plan").rglob("*") if p.is_file() and p.suffix == ".tmp"]
    assert leftovers == []


def test_atomic_write_leaves_no_temporary_file_on_failure(tmp_path):
    with pytest.raises(TypeError):
        atomic_write(tmp_path / "f", "not bytes")  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []


def test_make_key_separates_parts():
    assert make_key("ab", "c") != make_key("a", "bc")
    assert len(make_key("x")) == 64


def test_cache_dir_follows_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path / "here"))
    assert paths.cache_dir() == tmp_path / "here"
    monkeypatch.delenv("TUNER_CACHE_DIR")
    assert paths.cache_dir() == paths.CHECKOUT_DIR / "cache"


def test_gpu_slug():
    assert paths.gpu_slug("NVIDIA H200") == "nvidia-h200"
