import errno
import fcntl
import json
import logging
import multiprocessing as mp
import os
import pickle
import stat
import threading
from pathlib import Path

import pytest

from tuner import paths
from tuner.cache import Cache, CacheError, atomic_write, make_key


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


FIX = "set TUNER_CACHE_DIR or --cache-dir to a writable folder"


def test_cache_root_that_is_a_file_is_refused_at_once_naming_it(tmp_path):
    root = tmp_path / "cache"
    root.write_text("not a folder")
    with pytest.raises(CacheError) as info:
        Cache(root)
    assert str(info.value) == f"cache directory {root} is not a directory; {FIX}"
    assert isinstance(info.value, OSError) and info.value.path == root and info.value.errno == errno.ENOTDIR


def test_cache_root_under_a_file_is_refused_naming_the_file(tmp_path):
    (tmp_path / "f").write_text("")
    with pytest.raises(CacheError) as info:
        Cache(tmp_path / "f" / "cache")
    assert str(info.value) == (f"cache directory {tmp_path / 'f' / 'cache'} cannot be made: "
                               f"{tmp_path / 'f'} is not a directory; {FIX}")


def test_missing_cache_root_is_made_at_the_first_write(tmp_path):
    c = Cache(tmp_path / "a" / "b")
    assert not c.root.exists()
    c.put("plan", make_key("k"), b"x")
    assert c.get("plan", make_key("k")) == b"x"


def test_write_after_the_root_became_a_file_names_entry_reason_and_fix(tmp_path, caplog):
    c = Cache(tmp_path / "cache")
    key = make_key("k")
    c.root.write_text("")
    with caplog.at_level(logging.WARNING, logger="tuner.cache"):
        assert c.get("plan", key) is None
    assert "Not a directory" in caplog.text and str(c.path("plan", key)) in caplog.text
    with pytest.raises(CacheError) as info:
        c.put("plan", key, b"x")
    assert str(info.value) == (f"cannot write cache file {c.path('plan', key)}: Not a directory "
                               f"({c.root} is not a directory); {FIX}")
    assert info.value.path == c.path("plan", key)


def test_entry_that_is_a_directory_is_reported_once_as_absent_and_its_rewrite_names_it(tmp_path, caplog):
    c = Cache(tmp_path)
    key = make_key("k")
    path = c.path("cubin", key)
    path.mkdir(parents=True)
    with caplog.at_level(logging.WARNING, logger="tuner.cache"):
        assert c.get("cubin", key) is None
        assert c.get_entry("cubin", key) is None
    reports = [r.getMessage() for r in caplog.records if str(path) in r.getMessage()]
    assert reports == [f"cache entry {path} is unusable (Is a directory): rebuilding it"]
    with pytest.raises(CacheError) as info:
        c.put("cubin", key, b"fresh")
    assert str(info.value) == f"cannot write cache file {path}: Is a directory ({path} is a directory); {FIX}"
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # the temporary file is gone


def test_unreadable_entry_is_reported_once_and_treated_as_absent(tmp_path, caplog, monkeypatch):
    c = Cache(tmp_path)
    key = make_key("k")
    path = c.put("plan", key, b"x")
    real = Path.read_bytes

    def read_bytes(self):
        if self == path:  # root reads through permission bits, so the refusal is simulated
            raise PermissionError(errno.EACCES, "Permission denied", str(self))
        return real(self)

    monkeypatch.setattr(Path, "read_bytes", read_bytes)
    with caplog.at_level(logging.WARNING, logger="tuner.cache"):
        assert c.get("plan", key) is None
        assert c.get_json("plan", key) is None
    reports = [r.getMessage() for r in caplog.records if str(path) in r.getMessage()]
    assert reports == [f"cache entry {path} is unusable (Permission denied): rebuilding it"]


def test_unwritable_folder_raises_cache_error_naming_the_entry(tmp_path, monkeypatch):
    c = Cache(tmp_path)
    key = make_key("k")
    real = os.open

    def refuse_temporary(path, flags, mode=0o777, **kw):
        if str(path).endswith(".tmp"):  # root writes through permission bits, so the refusal is simulated
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real(path, flags, mode, **kw)

    monkeypatch.setattr(os, "open", refuse_temporary)
    with pytest.raises(CacheError) as info:
        c.put("plan", key, b"x")
    assert str(info.value) == f"cannot write cache file {c.path('plan', key)}: Permission denied; {FIX}"
    assert info.value.errno == errno.EACCES


def test_full_disk_raises_cache_error_and_leaves_no_temporary_file(tmp_path, monkeypatch):
    c = Cache(tmp_path)
    key = make_key("k")

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(CacheError) as info:
        c.put("cubin", key, b"x" * 1000)
    assert str(info.value) == f"cannot write cache file {c.path('cubin', key)}: No space left on device; {FIX}"
    assert info.value.errno == errno.ENOSPC and isinstance(info.value.__cause__, OSError)
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []


def test_atomic_write_names_the_path_in_an_os_error_that_named_none(tmp_path, monkeypatch):
    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError) as info:
        atomic_write(tmp_path / "f", b"x")
    assert str(info.value) == f"[Errno 28] No space left on device: '{tmp_path / 'f'}'"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("umask, file_mode, dir_mode", [(0o022, 0o644, 0o755), (0o002, 0o664, 0o775),
                                                        (0o077, 0o600, 0o700)])
def test_entries_and_folders_get_the_normal_creation_mode(tmp_path, umask, file_mode, dir_mode):
    old = os.umask(umask)
    try:
        c = Cache(tmp_path / "cache")
        path = c.put("plan", make_key("k"), b"x")
        src = c.write(c.root / "src" / "k.cu", b"//")
        with c.lock("cubin", make_key("k")) as lock:
            pass
    finally:
        os.umask(old)
    for f in (path, src, lock):
        assert stat.S_IMODE(f.stat().st_mode) == file_mode, f
    for d in (c.root, c.root / "plan", path.parent, src.parent, lock.parent):
        assert stat.S_IMODE(d.stat().st_mode) == dir_mode, d


def test_lock_makes_a_second_thread_wait_until_the_first_releases(tmp_path):
    c = Cache(tmp_path)
    key = make_key("k")
    order = []
    held = threading.Event()

    def second():
        held.wait()
        with c.lock("cubin", key):
            order.append("second locked")

    t = threading.Thread(target=second)
    t.start()
    with c.lock("cubin", key) as path:
        held.set()
        t.join(0.5)
        assert t.is_alive() and order == []  # blocked on the lock held here, in the same process
        order.append("first released")
    t.join(5)
    assert order == ["first released", "second locked"]
    assert path == tmp_path / "lock" / "cubin" / key[:2] / f"{key}.lock" and path.is_file()


def test_locks_of_different_keys_do_not_wait_for_each_other(tmp_path):
    c = Cache(tmp_path)
    done = []

    def other_key():
        with c.lock("cubin", make_key("b")):
            done.append("b locked")

    with c.lock("cubin", make_key("a")):
        t = threading.Thread(target=other_key)
        t.start()
        t.join(5)
        assert done == ["b locked"]


def _hold_lock(root, key, ready, release):
    with Cache(root).lock("plan", key):
        ready.set()
        release.wait(30)


def test_lock_excludes_another_process(tmp_path):
    key = make_key("k")
    ctx = mp.get_context("spawn")
    ready, release = ctx.Event(), ctx.Event()
    p = ctx.Process(target=_hold_lock, args=(str(tmp_path), key, ready, release))
    p.start()
    try:
        assert ready.wait(60)
        fd = os.open(Cache(tmp_path).lock_path("plan", key), os.O_RDONLY)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            release.set()
            p.join(30)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free once the holder left
        finally:
            os.close(fd)
    finally:
        release.set()
        p.join(30)
    assert p.exitcode == 0


def test_lock_file_that_cannot_be_made_raises_cache_error_naming_it(tmp_path):
    c = Cache(tmp_path)
    key = make_key("k")
    (tmp_path / "lock").write_text("")
    with pytest.raises(CacheError) as info:
        with c.lock("cubin", key):
            pass
    assert str(info.value) == (f"cannot write lock file {c.lock_path('cubin', key)}: Not a directory "
                               f"({tmp_path / 'lock'} is not a directory); {FIX}")


def test_cache_error_survives_pickling_with_path_and_errno(tmp_path):
    e = pickle.loads(pickle.dumps(CacheError("cannot write x", tmp_path, errno.ENOSPC)))
    assert (str(e), e.path, e.errno) == ("cannot write x", tmp_path, errno.ENOSPC)
