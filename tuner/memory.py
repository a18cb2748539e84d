"""Host-memory budget checks: refuse a build at once, with the figures, when it cannot fit.

Generators and loaders estimate the peak host memory of what they are about to build from sizes they
know before allocating anything large, and call :func:`check_fits`; a spec such as ``rmat:40`` then
fails in microseconds with :class:`InsufficientMemoryError` instead of paging for minutes first.

The budget is :func:`available_bytes`: the kernel's ``MemAvailable``, lowered by a cgroup limit (a
container) and by ``$TUNER_HOST_MEMORY_LIMIT`` (bytes, or a figure such as ``8G`` or ``512M``).

>>> human_bytes(24_200_000_000_000)
'24.2 TB'
"""

from __future__ import annotations

import os
import re

__all__ = [
    "LIMIT_ENV",
    "InsufficientMemoryError",
    "available_bytes",
    "check_fits",
    "human_bytes",
    "human_count",
    "parse_bytes",
]

LIMIT_ENV = "TUNER_HOST_MEMORY_LIMIT"

_DECIMAL_UNITS = ("B", "kB", "MB", "GB", "TB", "PB", "EB", "ZB", "YB")
_COUNT_UNITS = ("", "k", "M", "G", "T", "P", "E", "Z", "Y")
# Suffixes of parse_bytes: k, M, G, T, P are powers of 1000 (as human_bytes prints them, so a printed
# figure can be pasted back); Ki, Mi, Gi, Ti, Pi are powers of 1024. A trailing "B" is optional.
_SUFFIX_POWER = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4, "p": 5}
_BYTE_FIGURE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([kmgtp]?)(i?)b?\s*", re.IGNORECASE)
# A cgroup "limit" this large means no limit (cgroup v1 reports 2**63 rounded down to a page).
_NO_LIMIT = 1 << 60


class InsufficientMemoryError(MemoryError):
    """What was to be built needs more host memory than is available; raised before allocating it.

    Attributes:
        what: the thing that was to be built (a spec, a file, a function call).
        need_bytes: the estimated peak host memory of building it.
        available_bytes: the budget it was checked against.
        how: how the estimate was made (e.g. ``24 B per drawn edge x 17.6T drawn edges``), or ''.
        hint: what the user could do instead, or ''.

    Example:
        >>> error = InsufficientMemoryError("rmat:40", 422 * 10**12, 20 * 10**9, "24 B per drawn edge x 17.6T")
        >>> print(error)  # doctest: +NORMALIZE_WHITESPACE
        rmat:40 would need about 422.0 TB of host memory to build (24 B per drawn edge x 17.6T);
        20.0 GB is available
    """

    def __init__(self, what: str, need_bytes: int, available_bytes: int, how: str = "", hint: str = ""):
        self.what = what
        self.need_bytes = int(need_bytes)
        self.available_bytes = int(available_bytes)
        self.how = how
        self.hint = hint
        basis = f" ({how})" if how else ""
        advice = f"; {hint}" if hint else ""
        super().__init__(
            f"{what} would need about {human_bytes(need_bytes)} of host memory to build{basis}; "
            f"{human_bytes(available_bytes)} is available{advice}"
        )

    def __reduce__(self):
        # Rebuild from the fields (the default would pass the message as the only argument).
        return type(self), (self.what, self.need_bytes, self.available_bytes, self.how, self.hint)


def human_bytes(n) -> str:
    """A byte count in decimal units (B, kB, MB, GB, TB, ...), one decimal above 1 kB.

    Example:
        >>> human_bytes(512), human_bytes(1536), human_bytes(8_796_093_022_208)
        ('512 B', '1.5 kB', '8.8 TB')
    """
    return _scaled(n, _DECIMAL_UNITS, " ")


def human_count(n) -> str:
    """A count with a decimal multiplier (k, M, G, T, ...), as in ``17.6T edges``.

    Example:
        >>> human_count(999), human_count(17_592_186_044_416)
        ('999', '17.6T')
    """
    return _scaled(n, _COUNT_UNITS, "")


def _scaled(n, units, space: str) -> str:
    value = float(n)
    power = 0
    while abs(value) >= 999.95 and power < len(units) - 1:
        value /= 1000.0
        power += 1
    if power == 0:
        return f"{int(n)}{space}{units[0]}".rstrip()
    return f"{value:.1f}{space}{units[power]}"


def parse_bytes(text: str) -> int:
    """A byte figure such as ``8G``, ``512M``, ``1.5GB``, ``4GiB`` or ``1000000``, in bytes.

    k, M, G, T, P are powers of 1000; Ki, Mi, Gi, Ti, Pi powers of 1024; the trailing B is optional
    and case does not matter. Raises ValueError naming the text otherwise.

    Example:
        >>> parse_bytes("8G"), parse_bytes("512 MiB"), parse_bytes("1000")
        (8000000000, 536870912, 1000)
    """
    match = _BYTE_FIGURE.fullmatch(str(text))
    if not match or (match.group(3) and not match.group(2)):
        raise ValueError(f"{text!r} is not a byte figure (expected e.g. 8G, 512M, 4GiB or 1000000)")
    number, suffix, binary = match.groups()
    base = 1024 if binary else 1000
    return int(float(number) * base ** _SUFFIX_POWER[suffix.lower()])


def available_bytes() -> int:
    """Host memory this process may still allocate, in bytes: the smallest of the kernel's
    ``MemAvailable`` (else free physical pages), the room left under a cgroup memory limit, and
    ``$TUNER_HOST_MEMORY_LIMIT`` when set.

    Raises ValueError naming the variable when ``$TUNER_HOST_MEMORY_LIMIT`` is not a byte figure.

    Example:
        >>> import os
        >>> from unittest import mock
        >>> with mock.patch.dict(os.environ, {"TUNER_HOST_MEMORY_LIMIT": "1M"}):
        ...     available_bytes()
        1000000
    """
    counts = [_system_available(), _cgroup_available()]
    limit = os.environ.get(LIMIT_ENV, "").strip()
    if limit:
        try:
            counts.append(parse_bytes(limit))
        except ValueError as exc:
            raise ValueError(f"${LIMIT_ENV}: {exc}") from None
    return min(count for count in counts if count is not None)


def check_fits(need_bytes: int, what: str, how: str = "", *, hint: str = "") -> None:
    """Raise :class:`InsufficientMemoryError` when ``need_bytes`` exceed :func:`available_bytes`.

    ``what`` names the thing to build, ``how`` says how ``need_bytes`` was estimated and ``hint`` what
    to do instead; all go into the message.

    Example:
        >>> check_fits(1000, "a small matrix")
        >>> check_fits(10**18, "rmat:40", "24 B per drawn edge x 17.6T")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        tuner.memory.InsufficientMemoryError: rmat:40 would need about 1.0 EB of host memory to build ...
    """
    available = available_bytes()
    if need_bytes > available:
        raise InsufficientMemoryError(what, need_bytes, available, how, hint)


def _system_available() -> int | None:
    """``MemAvailable`` (free memory plus what the kernel can reclaim), else free physical pages."""
    try:
        with open("/proc/meminfo", "rb") as meminfo:
            for line in meminfo:
                if line.startswith(b"MemAvailable:"):
                    return int(line.split()[1]) * 1024  # reported in kiB
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # not a POSIX system
        return None


def _cgroup_available(root: str = "/sys/fs/cgroup") -> int | None:
    """Room left under this container's cgroup memory limit (v2, else v1), or None without a limit.

    ``MemAvailable`` describes the whole host, so inside a container with a memory limit it can be far
    above what the container may use before the OOM killer stops it. Page cache the cgroup could drop
    (its inactive file pages) counts as room, as ``MemAvailable`` counts it.
    """
    for folder, limit_name, usage_name, stat_key in (
        (root, "memory.max", "memory.current", b"inactive_file"),
        (os.path.join(root, "memory"), "memory.limit_in_bytes", "memory.usage_in_bytes", b"total_inactive_file"),
    ):
        try:
            with open(os.path.join(folder, limit_name), "rb") as stream:
                limit = stream.read().strip()
            if limit == b"max" or int(limit) >= _NO_LIMIT:
                return None
            with open(os.path.join(folder, usage_name), "rb") as stream:
                usage = int(stream.read())
        except (OSError, ValueError):
            continue
        reclaimable = _cgroup_stat(os.path.join(folder, "memory.stat"), stat_key)
        return max(0, int(limit) - usage + reclaimable)
    return None


def _cgroup_stat(path: str, key: bytes) -> int:
    try:
        with open(path, "rb") as stream:
            for line in stream:
                name, _, value = line.partition(b" ")
                if name == key:
                    return int(value)
    except (OSError, ValueError):
        pass
    return 0


def traced_peak(fn, *args, **kwargs):
    """(``fn(*args, **kwargs)``, the most host memory its Python and NumPy allocations held at once, in
    bytes, beyond what was allocated before): tracemalloc sees NumPy's buffers, not the CUDA driver's.

    Example:
        >>> import numpy as np
        >>> _, peak = traced_peak(lambda: np.ones(10**6).sum())
        >>> peak >= 8 * 10**6
        True
    """
    import tracemalloc
    started = not tracemalloc.is_tracing()
    if started:
        tracemalloc.start()
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    try:
        out = fn(*args, **kwargs)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        if started:
            tracemalloc.stop()
    return out, peak


STATUS = "/proc/self/status"
CLEAR_REFS = "/proc/self/clear_refs"


def _status_kib(field: str) -> int | None:
    try:
        with open(STATUS) as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def peak_rss(fn, *args, **kwargs):
    """(``fn(*args, **kwargs)``, the most resident host memory the process held while it ran beyond what it
    held before, in bytes): Linux's high-water mark (VmHWM), reset before the call. Every allocation counts
    (NumPy's, SciPy's, the CUDA driver's pinned buffers) and nothing slows down; where /proc cannot reset it,
    :func:`traced_peak` (NumPy's buffers through tracemalloc, which slows Python's allocations) instead.

    Example:
        >>> import numpy as np
        >>> _, peak = peak_rss(lambda: np.ones(5 * 10**7).sum())  # 400 MB, some of it in pages already held
        >>> peak > 3 * 10**8
        True
    """
    before = _status_kib("VmRSS")
    try:
        with open(CLEAR_REFS, "w") as f:
            f.write("5")  # resets VmHWM to the current resident set
    except OSError:
        before = None
    if before is None:
        return traced_peak(fn, *args, **kwargs)
    out = fn(*args, **kwargs)
    high = _status_kib("VmHWM")
    return out, max(0, (high or before) - before) * 1024
