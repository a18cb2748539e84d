"""The lookup-table model of paper 003: per-warp table performance combined by equations 1-5."""
from __future__ import annotations

import os
from typing import Callable

import numpy as np

from .. import families
from ..families.base import Specialization, ordered_structure, shared_layout
from ..formats.reorder import NONE
from ..matrix import CanonicalMatrix
from ..workers import pool as thread_pool
from .chains import ChainFit, chain_floor_ms
from .reuse import segment_fractions
from .locality import SECTOR_BYTES, cache_sectors
from .profile_data import Profile
from .tables import SegmentSums, block_threads, gather_fractions, sector_hit_rates, segment_sums, table_for
from .tiled import TILED_SUMS
from .warps import SEGMENTS, WARP, prebuild, segment_keys, warp_segments

DEFAULT_TAIL_FACTOR = 1.0  # a profile without the measured factor: the slowest warp as fast as alone
TAIL_START = 0.5  # rows of a segment come in no particular order: its slowest warp starts halfway through it

def predict_lookup(m: CanonicalMatrix, spec: Specialization, profile: Profile) -> float:
    """Predicted kernel milliseconds of ``spec`` on ``m``.

    Each warp's performance blends the table's three gather regimes by the matrix's share of gathers
    served by L1, L2 and memory (harmonically: times add). Equations 1-5 with the work-weighted mean of
    :func:`~tuner.model.waves.wave_time` then reduce to each warp's entries at its own rate, summed over all
    warps whatever the waves, so each segment of warps is summed once per matrix, by shape, and shared by
    every candidate. The kernel also lasts at least as long as the slot time of its warps alone; this and
    the work scale by :func:`sm_spread` (the busiest SM's share of the launch's blocks over an even share:
    a launch of fewer blocks than SMs leaves the others idle). It also lasts as long as
    the slowest warp of each launch segment: blocks are dispatched in index order, so that warp starts
    after the work of the segments launched before it plus, on average, half of its own segment's work,
    and runs for its time alone times the profile's tail factor for a kernel of this much work
    (:func:`tail_factor`). A long row in binned's last class therefore starts near the end. Where lanes walk
    whole rows, the launch lasts at least its longest lane's chain as the profile's launches of mixed rows
    measured it (:mod:`tuner.model.chains`).

    A relabelled candidate is predicted on the permuted matrix's lengths (its hot columns packed into
    few sectors) plus its two gathers, of x into its order and of y back (:func:`reorder_ms`).

    Example: see tests/test_model.py (needs a profile).
    """
    order = getattr(spec.params, "order", NONE)
    gathers = 0.0
    if order != NONE:
        gathers = reorder_ms(m.n_rows, m.n_cols, m.index_dtype.itemsize, m.value_dtype.itemsize,
                             profile.constants)
        m = ordered_structure(m, order)
    entry_bytes = m.index_dtype.itemsize + (0 if m.value_free else m.value_dtype.itemsize)
    s = launch_sums(m, spec, profile)
    seg_work = s.work * entry_bytes / s.profiled_bytes
    done = np.cumsum(seg_work)  # in launch order, as the blocks are dispatched
    work = float(done[-1]) if done.size else 0.0
    # A segment's slowest warp starts after the earlier segments' work and somewhere in its own; it runs
    # slower than alone by the tail factor of a bulk of this kernel's work, and the kernel ends when it
    # does, if after the bulk.
    start = np.concatenate(([0.0], done[:-1])) + TAIL_START * seg_work
    tail = float((start + tail_factor(profile, work) * s.alone_max).max(initial=0.0))
    alone_sum = float(np.cumsum(s.alone_sum)[-1]) if s.alone_sum.size else 0.0
    spread = sm_spread(int(s.blocks.sum()), int(profile.constants["sm_count"]))
    chain = chain_floor_ms(m, spec, ChainFit.from_profile(profile.chains))
    t = max(work * spread, alone_sum / max(s.max_active, 1) * spread, tail, occupancy_floor(s, profile), chain)
    return float(profile.constants["launch_overhead_ms"] + t + gathers)


def occupancy_floor(s: SegmentSums, profile: Profile) -> float:
    """Milliseconds beyond the launch that the launch of segments ``s`` lasts at least: the profile's
    measured launch of the narrowest rows through the shape that carries most of its work, with as many
    warps on the busiest SM (:meth:`~tuner.model.profile_data.Profile.occupancy_floor`; 0 without the
    measurement). A launch of a few warps per SM is far slower than the tables' full GPU at the same
    work (H100: 8 warps of 2 lanes per row over rows of 8 entries take 3x their table time), and no term
    above sees it: the busiest SM's warps are all resident, and none is long.

    A segment whose lanes walk their slots one after another (a shape the profile measured at several
    lane lengths: ALIGNED_COO's seg part) also lasts at least its own floor, at its lanes' length and
    its own warps per SM, whatever runs beside it: other warps do not shorten a lane's chain of
    dependent steps (H100, cit-HepPh: the hybrid, whose 40 blocks of seg lanes hold 31 slots each, takes
    7.6 us beyond the launch; the all-flat layout 4.5 us).

    Example:
        >>> from tuner.model.profile_data import Profile
        >>> p = Profile({}, {"sm_count": 2}, {}, "", occupancy={"shapes": {"k:1:128:v": {
        ...     "warps_per_sm": [4, 16], "busy_ms": [0.001, 0.002]}, "k:2:128:v": {
        ...     "warps_per_sm": [4, 16], "busy_ms": [0.01, 0.02]}}})
        >>> s = SegmentSums.of_rows([(2.0, 0.0, 0.0, 4.0, 3, 8, 64, "k:1:128:v"), (1.0, 0.0, 0.0, 4.0, 3, 8, 64, "k:2:128:v")])
        >>> round(occupancy_floor(s, p), 5)  # 6 blocks of 4 warps on 2 SMs: 12 warps each, the first shape's
        0.00179
        >>> p.occupancy["shapes"]["k:2:128:v"].update(width=4, by_width=[{"width": 32, "warps_per_sm": [4, 16],
        ...                                                                "busy_ms": [0.03, 0.04]}])
        >>> s = SegmentSums.of_rows([(2.0, 0.0, 0.0, 4.0, 3, 8, 64, "k:1:128:v"), (1.0, 0.0, 0.0, 32.0, 2, 8, 64, "k:2:128:v")])
        >>> round(occupancy_floor(s, p), 5)  # the chained shape's own 2 blocks: 4 warps on the busiest SM
        0.03
    """
    if not s.keys or not s.work.size:
        return 0.0
    key = s.keys[int(np.argmax(s.work))]
    sm = int(profile.constants["sm_count"])
    per_sm = -(-int(s.blocks.sum()) // sm) * block_threads(key) / WARP
    chained = {k for k in set(s.keys) if profile.has_chain(k)}  # a tiled launch has thousands of segments
    chains = [profile.occupancy_floor(k, -(-int(b) // sm) * block_threads(k) / WARP, width=w)
              for k, b, w in zip(s.keys, s.blocks, s.widths) if k in chained] if chained else []
    return max([profile.occupancy_floor(key, per_sm)] + chains)


def launch_sums(m: CanonicalMatrix, spec: Specialization, profile: Profile) -> SegmentSums:
    """The segments of ``spec``'s launch on view ``m``, summed (:class:`~tuner.model.tables.SegmentSums`): a
    tiled family's tiles all at once (:mod:`tuner.model.tiled`), memoised per candidate; other families
    one warp segment at a time.

    Example: see tests/test_tiles.py (needs a profile).
    """
    batched = TILED_SUMS.get(spec.family)
    if batched is None:
        return _segment_by_segment(m, spec, profile)
    return shared_layout(m, ("launch_sums", spec.family, spec.params, profile.digest),
                         lambda: batched(m, spec.params, profile))


def _segment_by_segment(m: CanonicalMatrix, spec: Specialization, profile: Profile) -> SegmentSums:
    """:func:`launch_sums` one warp segment at a time (:func:`~tuner.model.warps.warp_segments`), each
    segment's sums memoised per view: candidates share segments (binned's classes, csr_vector's rows). A
    segment's gathers that repeat a sector its block fetched before are L1 hits (:mod:`tuner.model.reuse`)."""
    rows = []
    for seg in warp_segments(m, spec.family, spec.params):
        if seg.warps.w.size == 0:
            continue
        key, profiled_bytes = table_for(profile, seg.key)
        # The gathers only where the sums are not memoised: the key (the table, which names the kernel's
        # lanes and block) fixes them too.
        sums = shared_layout(m, ("segment", seg.ident, key, profile.digest),
                             lambda: segment_sums(profile, key, seg.warps, segment_gathers(m, profile, seg)))
        blocks = -(-seg.warps.warps * WARP // block_threads(seg.key))
        rows.append((*sums, blocks, profiled_bytes, profile.max_active_warps(key), key))
    return SegmentSums.of_rows(rows)


def segment_gathers(m: CanonicalMatrix, profile: Profile, seg) -> np.ndarray:
    """Shares of the gathers of warp segment ``seg`` that L1, L2 and memory serve: those
    of its blocks, which repeat sectors they fetched before (:func:`~tuner.model.reuse.segment_fractions`),
    or of its columns where it gathers from a tile's."""
    if seg.cols is None:
        # A block's share of L1: the SM's, over the blocks of this shape resident on it at once.
        key = table_for(profile, seg.key)[0]
        per_sm = profile.max_active_warps(key) / profile.constants["sm_count"] * WARP / block_threads(seg.key)
        held = cache_sectors(profile.constants, "l1") / max(per_sm, 1.0)
        got = segment_fractions(m, seg.spec, seg.warps, sector_hit_rates(m, profile), held, (profile.digest,))
        if got is not None:
            return got
    return gather_fractions(m, profile, seg.cols)


def sm_spread(blocks: int, sm_count: int) -> float:
    """How much longer than an even share of the whole GPU the busiest SM works when a launch of
    ``blocks`` equal blocks is dealt out to ``sm_count`` SMs: it gets ceil(blocks / sm_count) of them.

    The tables measure a full GPU; a launch of fewer blocks than SMs runs on as many SMs as it has blocks,
    each at one SM's share of the table (H100: 4 blocks of 8 one-lane warps over rows of 32 entries take
    9.6 us beyond the launch; one SM's share of the table gives 9.9 us for its 8,192 entries, the whole
    GPU's 0.3 us).

    Example:
        >>> sm_spread(4, 132), sm_spread(132, 132), round(sm_spread(200, 132), 2), round(sm_spread(100_000, 132), 3)
        (33.0, 1.0, 1.32, 1.001)
    """
    if blocks <= 0:
        return 1.0
    return -(-blocks // sm_count) * sm_count / blocks


def tail_factor(profile: Profile, work_ms: float) -> float:
    """How much slower than alone a long row runs in a kernel whose bulk of other warps takes ``work_ms``:
    the profile's measured curve (:func:`tuner.profile.measure_tail`), interpolated in log work and held
    at its ends; a profile without the curve gives its one factor.

    A long row beside a bulk of a few microseconds runs as fast as alone, beside one of 0.17 ms 1.8 times
    as slow (H100), and the slowdown outlasts the bulk: it is not a share of the SM while the others run.

    Example:
        >>> from types import SimpleNamespace as P
        >>> p = P(constants={"tail_factor": 2.0}, tail={"curve": [{"work_ms": 0.01, "factor": 1.0},
        ...                                                      {"work_ms": 0.1, "factor": 2.0}]})
        >>> tail_factor(p, 0.001), round(tail_factor(p, 0.0316), 2), tail_factor(p, 1.0)
        (1.0, 1.5, 2.0)
        >>> tail_factor(P(constants={"tail_factor": 1.7}, tail=None), 0.5)
        1.7
    """
    curve = sorted((c["work_ms"], c["factor"]) for c in (profile.tail or {}).get("curve", ()) if c["work_ms"] > 0)
    if not curve:
        return float(profile.constants.get("tail_factor", DEFAULT_TAIL_FACTOR))
    x, f = zip(*curve)
    return float(np.interp(np.log(max(work_ms, 1e-9)), np.log(x), f))


def reorder_ms(n_rows: int, n_cols: int, index_bytes: int, value_bytes: int, constants: dict) -> float:
    """What a relabelled plan adds: the gathers of x into its order and of y back (:func:`gather_ms`).

    Example:
        >>> c = {"launch_overhead_ms": 0.004, "copy_bandwidth_gbs": 3000.0, "l2_sectors": 1e6}
        >>> round(reorder_ms(1_000_000, 1_000_000, 4, 4, c), 4)
        0.016
    """
    return (gather_ms(n_cols, index_bytes, value_bytes, constants)
            + gather_ms(n_rows, index_bytes, value_bytes, constants))


def gather_ms(n: int, index_bytes: int, value_bytes: int, constants: dict) -> float:
    """Milliseconds of one gather dst[i] = src[order[i]] over ``n`` elements (a relabelled plan's x or y).

    The order and dst stream at copy bandwidth; src is read once while it fits the measured L2, and
    the share of it that does not costs a 32-byte sector per element. The gather's launch costs what
    the profile measured a gather adding to a near-empty launch (``gather_launch_ms``: queued beside
    the product, it is far less than a launch alone; a profile without it: a whole launch).

    Example:
        >>> c = {"launch_overhead_ms": 0.004, "copy_bandwidth_gbs": 3000.0, "l2_sectors": 1e6}
        >>> round(gather_ms(1_000_000, 4, 4, c), 4), round(gather_ms(64_000_000, 4, 4, c), 3)
        (0.008, 0.857)
        >>> round(gather_ms(1_000_000, 4, 4, dict(c, gather_launch_ms=0.002)), 4)
        0.006
    """
    if n == 0:
        return 0.0
    src = n * value_bytes
    miss = max(0.0, 1.0 - cache_sectors(constants, "l2") * SECTOR_BYTES / src)
    nbytes = n * (index_bytes + value_bytes) + src + n * SECTOR_BYTES * miss
    launch = constants.get("gather_launch_ms", constants["launch_overhead_ms"])
    return launch + nbytes / (constants["copy_bandwidth_gbs"] * 1e6)


def can_predict(m: CanonicalMatrix, spec: Specialization, profile: Profile) -> bool:
    """True when ``profile`` measured every kernel shape the candidate's warps are looked up in (a profile
    made before a family existed lacks its shapes; ``python -m tuner profile`` resumes and adds them)."""
    view = ordered_structure(m, getattr(spec.params, "order", NONE))
    return all(profile.has(table_for(profile, key)[0]) for key in segment_keys(view, spec.family, spec.params))


def predict_many(m: CanonicalMatrix, specs: list[Specialization], profile: Profile, workers: int | None = None
                 ) -> list[float | None]:
    """:func:`predict_lookup` of every candidate, their warp segments built first, in parallel (on
    ``workers`` threads; default :func:`~tuner.model.warps.prebuild`'s); None for a candidate the profile
    cannot predict (:func:`can_predict`).

    Example: see tests/test_model.py (needs a profile).
    """
    ok = [can_predict(m, spec, profile) for spec in specs]
    _prebuild(m, [spec for spec, k in zip(specs, ok) if k], profile, workers)
    wanted = [spec for spec, k in zip(specs, ok) if k]
    threads = min(workers or min(8, os.cpu_count() or 1), len(wanted))
    if m.n_rows > PARALLEL_ROWS and threads > 1:
        # Each candidate's sums (its segments' gather shares, sampled blocks, tiles) are passes of their
        # own, many of which release the interpreter: side by side they overlap.
        with thread_pool(threads) as pool:
            predicted = list(pool.map(lambda spec: predict_lookup(m, spec, profile), wanted))
    else:
        predicted = [predict_lookup(m, spec, profile) for spec in wanted]
    done = iter(predicted)
    return [next(done) if k else None for k in ok]


PARALLEL_ROWS = 1 << 20  # from this many rows on, predict_many predicts its candidates on several threads


def predicted_candidates(m: CanonicalMatrix, profile: Profile, names: list[str] | None = None,
                         known: dict[str, float | None] | Callable[[], dict | None] | None = None
                         ) -> tuple[list[Specialization], list[float | None]]:
    """Every candidate of ``m`` (``families.specializations``) and its prediction (:func:`predict_many`),
    in that order. While the families whose space reads the profile (the tiled ones: they count every
    tile's rows and run Algorithm 2) build their candidates and are predicted, the other families'
    candidates are predicted on other threads, one per view (ordering) of the matrix, each building its
    view's warp histograms first (passes over the rows of each class, on threads of their own): none
    waits for another, so the other families' histograms are built while the tiled ones count their
    tiles (on rmat:23 the planning takes a tenth less time than predicting them after the tiled ones).
    ``known``: predictions already made, by candidate label (:func:`caller_order_predictions`, made while
    the GPU relabelled the matrix); those candidates are not predicted again. Or a callable that returns
    them (None where they could not be made), still being made on another thread: the candidates in the
    caller's order are left to it, and it is called once the others are predicted, so that nothing here
    waits for it before then (the candidates it did not predict are predicted after it).

    Example: see tests/test_model.py (needs a profile).
    """
    names = list(families.REGISTRY) if names is None else list(names)
    tiled = [n for n in names if families.get(n).uses_profile]
    later = known if callable(known) else None
    known = {} if later is not None or known is None else known

    def tiled_candidates():
        specs = families.specializations(m, tiled, profile=profile)
        return specs, predict_many(m, specs, profile)

    # The tiled families start first (their tile counting runs on the GPU where the matrix is there), so
    # that the other families' spaces (passes over the row lengths) are made beside it, not before it.
    with thread_pool(1) as lead:
        tiled_done = lead.submit(tiled_candidates)
        plain = families.specializations(m, [n for n in names if n not in tiled], profile=profile)
        predicted = {id(spec): known[spec.label()] for spec in plain if spec.label() in known}
        views: dict[str, list[Specialization]] = {}
        deferred = []  # the caller's order, left to ``later``
        for spec in plain:
            order = getattr(spec.params, "order", NONE)
            if later is not None and order == NONE:
                deferred.append(spec)
            elif id(spec) not in predicted:
                views.setdefault(order, []).append(spec)
        workers = view_workers()
        with thread_pool(max(len(views), 1)) as pool:
            pending = [(view, pool.submit(predict_many, m, view, profile, workers)) for view in views.values()]
            tiled_specs, tiled_predicted = tiled_done.result()
            predicted.update(zip(map(id, tiled_specs), tiled_predicted))
            for view, done in pending:
                predicted.update(zip(map(id, view), done.result()))
        if deferred:
            early = dict(later() or {})
            missing = [spec for spec in deferred if spec.label() not in early]
            if missing:
                early.update(zip((s.label() for s in missing), predict_many(m, missing, profile, workers)))
            predicted.update((id(spec), early[spec.label()]) for spec in deferred)
    made = {n: [] for n in names}
    for spec in plain + tiled_specs:
        made[spec.family].append(spec)
    specs = [spec for n in names for spec in made[n]]
    return specs, [predicted[id(spec)] for spec in specs]


def caller_order_predictions(m: CanonicalMatrix, profile: Profile, names: list[str] | None = None
                             ) -> dict[str, float | None]:
    """The predictions of the candidates that read ``m`` in its own order (the untiled families' 'none'
    order), by label, for :func:`predicted_candidates`' ``known``: they need nothing of a relabelled
    matrix, so a compile makes them while the GPU relabels ``m`` for the others (the relabelling keeps
    the GPU busy and leaves the host's cores idle), on :func:`view_workers` histogram threads.

    Example:
        >>> import scipy.sparse as sp
        >>> from tuner.matrix import canonicalize
        >>> from tuner.model.profile_data import load_profile
        >>> m = canonicalize(sp.random(300, 300, density=0.05, format="csr", random_state=0))
        >>> known = caller_order_predictions(m, load_profile("NVIDIA H100 80GB HBM3"))
        >>> all(label.endswith("order=none)") for label in known), len(known) > 1
        (True, True)
    """
    names = list(families.REGISTRY) if names is None else list(names)
    plain = [n for n in names if not families.get(n).uses_profile]
    specs = [s for s in families.specializations(m, plain, profile=profile) if getattr(s.params, "order", NONE) == NONE]
    return dict(zip((s.label() for s in specs), predict_many(m, specs, profile, view_workers())))


def view_workers() -> int:
    """Histogram threads each view's predictions get (:func:`predicted_candidates`, and
    :func:`caller_order_predictions`): the two views (the caller's order and degree order) share eight
    threads or the host's cores, whichever is fewer. A view predicted alone (the degree-order one, once the
    caller's order was predicted beside the relabelling) keeps its share, beside the tiled families' thread.

    Example:
        >>> 1 <= view_workers() <= 4
        True
    """
    return max(1, min(8, os.cpu_count() or 1) // 2)


def _prebuild(m: CanonicalMatrix, specs: list[Specialization], profile: Profile, workers: int | None = None
              ) -> None:
    """Build the warp histograms of ``specs`` (on ``workers`` threads) and each view's gather shares, view
    by view (the caller's order first: no relabelling); the tiled families' launches need no histograms
    (:mod:`tuner.model.tiled`)."""
    by_order: dict[str, list] = {}
    for spec in (s for s in specs if s.family not in TILED_SUMS):
        by_order.setdefault(getattr(spec.params, "order", NONE), []).append(spec)
    for order in sorted(by_order, key=lambda o: o != NONE):
        view = ordered_structure(m, order)
        prebuild(view, [s for spec in by_order[order] for _, s in SEGMENTS[spec.family](view, spec.params)],
                 workers)
        gather_fractions(view, profile)
