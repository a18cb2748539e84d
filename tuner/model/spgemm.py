"""The SpGEMM model: each family's time predicted from exact product counts, an estimate of C's size and
phase rates measured by ``python -m tuner profile``.

Every phase's time is its work in the unit that bounds it times a measured rate (milliseconds per unit),
plus a fixed cost where it runs (what it costs whatever its work: its launches, the tails of its kernels,
round trips to the host):

- outer_product: the expansion writes every product as a 64-bit key and a value; the radix sort moves them
  once per 8-bit digit of the key; the reduction reads them once; the CSR pass touches C's entries.
- row_hash: the symbolic and numeric phases cost per scalar product (a B entry read and a hash insert),
  at one rate for rows whose tables are in shared memory, another for rows in global-memory tables and a
  third for rows with dense accumulators (a bit set and an add per product; their bitmap words, at most
  two per entry by the dense rule, are second to that); the segmented sort moves the entries of hashed
  rows (C's entries times the hashed rows' share of the products); the scan and binning between the phases
  pass over C's rows.

C's size (which the numeric phase writes and the sorts move) is estimated before anything runs from rows
sampled with probability proportional to their products: the mean of their distinct-to-product ratios is
an unbiased estimate of nnz(C) / products.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from ..formats.row_bins import NEVER_DENSE, caps, row_products
from ..matrix import CanonicalMatrix

SAMPLE_ROWS = 512
SAMPLE_PRODUCTS = 20_000_000  # what the sampled rows may cost SciPy (about a quarter of a second)
KEY_BYTES = 8  # outer_product's (row * n_cols + column) keys

# Milliseconds per unit of each phase as measured on an H100 80GB HBM3 by `python -m tuner profile` (the
# "spgemm" section of models/nvidia-h100-80gb-hbm3/profile.json, with that profile's copy bandwidth); GPUs
# without a measured section scale them by their copy bandwidth, since every phase moves its units through
# device memory or L2. The global-table phases are not in that section (the profile's products send their
# heaviest rows to dense accumulators): theirs come from products that had global rows.
REFERENCE_BANDWIDTH_GBS = 3006.0
REFERENCE_RATES = {
    "hash.bins": 5.1508e-02, "hash.numeric_dense": 9.6219e-09, "hash.numeric_dense/spans": 5.5474e-07,
    "hash.numeric_global": 5.4780e-08, "hash.numeric_shared": 4.0570e-08, "hash.rows": 1.8936e-08,
    "hash.sort": 0.0000e+00, "hash.symbolic_dense": 3.2822e-09, "hash.symbolic_global": 1.9908e-08,
    "hash.symbolic_shared": 3.1268e-08, "hash:fixed": 8.5958e-02, "outer.csr": 7.9260e-10,
    "outer.expand": 1.3131e-09, "outer.expand/pairs": 1.9918e-07, "outer.reduce": 6.8475e-10,
    "outer.sort": 8.9659e-10, "outer:fixed": 3.5326e-01,
}


@dataclass(frozen=True)
class ProductStats:
    """What the model knows of C = A B before anything runs.

    Attributes:
        n_rows, n_cols: C's shape.
        products: scalar products (exact).
        nnz_c: estimated entries of C (exact when ``exact``).
        symbolic_global, numeric_global: products in hashed rows whose symbolic / numeric tables exceed shared
            memory.
        value_bytes, col_bytes: sizes of a value and of a column index.
        key_bits: bits of outer_product's keys.
        bins: shared bins of each row_hash phase (their launches).
        exact: whether ``nnz_c`` is exact (every row sampled).
        a_entries: entries of A that meet a non-empty row of B (each starts a walk of a B row).
        symbolic_dense, numeric_dense: products in rows with dense accumulators in each phase.
        hashed_entries: entries of A that meet a non-empty row of B in rows the symbolic phase hashes (not dense).
        dense_entries: entries of A in the numeric phase's dense rows.
        dense_spans: spans of columns a numeric dense row is accumulated in (each walks the row's entries).
        pairs: indices k with a non-empty column k of A and a non-empty row k of B (outer_product's blocks).
        bins_used: row_hash's non-empty bins over both phases (shared, global and dense; each a launch, and on
            the shared ones, a stream of its own to wait for).
    """

    n_rows: int
    n_cols: int
    products: int
    nnz_c: float
    symbolic_global: int
    numeric_global: int
    value_bytes: int
    col_bytes: int
    key_bits: int
    bins: int
    exact: bool = False
    a_entries: int = 0
    symbolic_dense: int = 0
    numeric_dense: int = 0
    hashed_entries: int = 0
    dense_entries: int = 0
    dense_spans: int = 1
    pairs: int = 0
    bins_used: int = 0


def estimate_nnz(a: CanonicalMatrix, b: CanonicalMatrix, products: np.ndarray, sample: int = SAMPLE_ROWS,
                 seed: int = 0) -> tuple[float, np.ndarray, bool]:
    """nnz(C) estimated from ``sample`` rows drawn with probability proportional to their products (all rows
    when there are no more), with the sampled rows' distinct-to-product ratios; the draws stop where their
    products pass :data:`SAMPLE_PRODUCTS` (SciPy computes each drawn row). Returns (estimate, ratio of each
    sampled row, exact?).

    Example:
        >>> from tuner.matrix import canonicalize
        >>> a = canonicalize(sp.csr_matrix(np.array([[1.0, 1.0], [0.0, 1.0]])))
        >>> p = row_products(a.indptr, a.indices, a.indptr)
        >>> estimate_nnz(a, a, p)[0]
        3.0
    """
    total = int(products.sum())
    nonzero = np.flatnonzero(products)
    if total == 0:
        return 0.0, np.zeros(0), True
    exact = nonzero.size <= sample and total <= SAMPLE_PRODUCTS
    if exact:
        rows = nonzero
    else:  # the draws up to SAMPLE_PRODUCTS products (at least one): heavy rows cost SciPy their products
        draws = np.random.default_rng(seed).choice(a.n_rows, size=sample, p=products / total)
        rows = draws[:max(1, int(np.searchsorted(np.cumsum(products[draws]), SAMPLE_PRODUCTS)))]
    sub = sp.csr_matrix((np.ones(a.nnz), a.indices, a.indptr), shape=a.shape)[rows]
    pattern_b = sp.csr_matrix((np.ones(b.nnz), b.indices, b.indptr), shape=b.shape)
    distinct = np.diff((sub @ pattern_b).indptr)  # positive sums: no cancellation drops an entry
    ratio = distinct / products[rows]
    if exact:
        return float(distinct.sum()), ratio, True
    return float(total * ratio.mean()), ratio, False


def product_stats(a: CanonicalMatrix, b: CanonicalMatrix, symbolic_tables: tuple[int, ...],
                  numeric_tables: tuple[int, ...], symbolic_load: float, numeric_load: float,
                  value_bytes: int, sample: int = SAMPLE_ROWS, dense: int = NEVER_DENSE,
                  dense_width: int = 0) -> ProductStats:
    """Exact products, the estimated nnz(C) and the products in rows beyond shared memory and in dense rows
    (from ``dense`` products in the symbolic phase, entries in the numeric one; a row's numeric size
    estimated as its products times the sample's mean ratio; ``dense_width``: columns of a numeric dense
    span, 0 for one span).

    Example:
        >>> from tuner.matrix import canonicalize
        >>> a = canonicalize(sp.identity(4, format="csr"))
        >>> s = product_stats(a, a, (32,), (32,), 1.0, 0.5, 8)
        >>> s.products, s.nnz_c, s.symbolic_global, s.key_bits
        (4, 4.0, 0, 4)
    """
    products = row_products(a.indptr, a.indices, b.indptr)
    nnz_c, ratio, exact = estimate_nnz(a, b, products, sample)
    sym_cap = caps(symbolic_tables, symbolic_load).max() if symbolic_tables else 0
    num_cap = caps(numeric_tables, numeric_load).max() if numeric_tables else 0
    mean_ratio = nnz_c / max(int(products.sum()), 1)
    n_cols = b.n_cols
    sym_dense, num_dense = products >= dense, products * mean_ratio >= dense
    meets = np.zeros(a.nnz + 1, np.int64)  # entries of A whose B row is not empty, counted per row of A
    np.cumsum(np.diff(np.asarray(b.indptr, np.int64))[a.indices] > 0, out=meets[1:])
    entries = np.diff(meets[np.asarray(a.indptr, np.int64)])
    a_columns = np.bincount(np.asarray(a.indices), minlength=a.n_cols)[:b.n_rows] > 0
    pairs = int(np.count_nonzero(a_columns & (np.diff(np.asarray(b.indptr, np.int64)) > 0)))
    bins_used = 0
    for counts, tables, load, dense_rows in ((products, symbolic_tables, symbolic_load, sym_dense),
                                            (products * mean_ratio, numeric_tables, numeric_load, num_dense)):
        which = np.searchsorted(caps(tables, load), counts[(counts > 0) & ~dense_rows], side="left")
        bins_used += int(np.unique(which).size) + int(dense_rows.any())
    return ProductStats(
        n_rows=a.n_rows, n_cols=n_cols, products=int(products.sum()), nnz_c=nnz_c,
        symbolic_global=int(products[(products > sym_cap) & ~sym_dense].sum()),
        numeric_global=int(products[(products * mean_ratio > num_cap) & ~num_dense].sum()),
        value_bytes=value_bytes, col_bytes=4 if n_cols <= np.iinfo(np.int32).max else 8,
        key_bits=max(1, (a.n_rows * n_cols - 1).bit_length()),
        bins=len(symbolic_tables) + len(numeric_tables) + 2, exact=exact,
        a_entries=int(meets[-1]), symbolic_dense=int(products[sym_dense].sum()),
        numeric_dense=int(products[num_dense].sum()), hashed_entries=int(entries[~sym_dense].sum()),
        dense_entries=int(entries[num_dense].sum()),
        dense_spans=max(1, -(-n_cols // dense_width)) if dense_width else 1, pairs=pairs, bins_used=bins_used)


SHARE = "/"  # "phase/what": a second kind of work of one timed phase (its rate fitted beside the phase's own)
FIXED = ":fixed"  # a phase's fixed milliseconds are kept under its name with this suffix


def work(family: str, s: ProductStats) -> dict[str, float]:
    """Each phase's units of work (bytes, products or rows) for ``family``; a numeric dense row also walks its
    A entries once per span of columns (``hash.numeric_dense/spans``: entries x spans).

    Example:
        >>> s = ProductStats(10, 10, 100, 50.0, 0, 0, 8, 4, 7, 4)
        >>> work("outer_product", s)["outer.sort"], work("row_hash", s)["hash.numeric_shared"]
        (1600.0, 100.0)
    """
    pair = KEY_BYTES + s.value_bytes
    entry = s.col_bytes + s.value_bytes
    if family == "outer_product":
        passes = -(-s.key_bits // 8)
        return {"outer.expand": float(s.products * pair), "outer.expand" + SHARE + "pairs": float(s.pairs),
                "outer.sort": float(s.products * pair * passes),
                "outer.reduce": float(s.products * pair), "outer.csr": s.nnz_c * pair}
    return {"hash.rows": float(s.n_rows),
            "hash.symbolic_shared": float(s.products - s.symbolic_global - s.symbolic_dense),
            "hash.symbolic_global": float(s.symbolic_global), "hash.symbolic_dense": float(s.symbolic_dense),
            "hash.numeric_shared": float(s.products - s.numeric_global - s.numeric_dense),
            "hash.numeric_global": float(s.numeric_global), "hash.numeric_dense": float(s.numeric_dense),
            "hash.numeric_dense" + SHARE + "spans": float(s.dense_entries * s.dense_spans),
            "hash.bins": float(s.bins_used),
            "hash.sort": s.nnz_c * (1.0 - s.numeric_dense / max(s.products, 1)) * entry}


def lanes_for(s: "ProductStats") -> int:
    """row_hash's lanes: the power of two nearest the mean length of the B rows the hashed rows' products come
    from (threads beyond a B row's length idle, fewer walk it in several rounds), 16 to 128; dense rows, which
    meet the longest B rows, walk with lanes of their own.

    Example:
        >>> lanes_for(ProductStats(10, 10, 14000, 1.0, 0, 0, 4, 4, 7, 4, a_entries=100, hashed_entries=100))
        128
        >>> lanes_for(ProductStats(10, 10, 14000, 1.0, 0, 0, 4, 4, 7, 4, a_entries=100, symbolic_dense=10000,
        ...                        hashed_entries=90))
        32
    """
    mean = (s.products - s.symbolic_dense) / max(s.hashed_entries, 1)
    return int(min(128, max(16, 1 << int(round(np.log2(max(mean, 1.0)))))))


def outer_block_for(s: "ProductStats", wide: int = 256, narrow: int = 128) -> int:
    """outer_product's threads per block: ``narrow`` where the mean products of a block's pair (a column of A
    and a row of B) would not fill ``wide`` threads once (the rest of a wide block idles while it expands,
    and narrower blocks let more of them share a multiprocessor), else ``wide``.

    Example:
        >>> outer_block_for(ProductStats(10, 10, 16_000, 1.0, 0, 0, 4, 4, 7, 4, pairs=1000))   # 16 a pair
        128
        >>> outer_block_for(ProductStats(10, 10, 900_000, 1.0, 0, 0, 4, 4, 7, 4, pairs=1000))  # 900 a pair
        256
    """
    return narrow if s.products < wide * max(s.pairs, 1) else wide


def working_bytes(family: str, s: ProductStats) -> float:
    """Device memory a product's call needs beyond its operands: outer_product's expansion twice (the sort's
    input and output), row_hash's output twice (numeric buffer and sorted C).

    Example:
        >>> working_bytes("outer_product", ProductStats(10, 10, 100, 50.0, 0, 0, 8, 4, 7, 4))
        3200.0
    """
    if family == "outer_product":
        return float(2 * s.products * (KEY_BYTES + s.value_bytes))
    return float(2 * s.nnz_c * (s.col_bytes + s.value_bytes) + 16 * s.n_rows)


LAUNCHES = {"outer_product": lambda s: 6, "row_hash": lambda s: s.bins + 8}
PREFIX = {"outer_product": "outer", "row_hash": "hash"}  # each family's phases are named "prefix.phase"
PER_LAUNCH = ("hash.bins",)  # units that count launches and waits: their rates do not scale with bandwidth


@dataclass(frozen=True)
class Rates:
    """Milliseconds per unit of each phase and per launch.

    Attributes:
        per_unit: phase -> ms per unit (see :func:`work`).
        launch_ms: what each kernel launch (and its synchronisation) adds.
        source: where the rates came from.
    """

    per_unit: dict
    launch_ms: float
    source: str


def rates_from(profile) -> Rates:
    """The profile's measured SpGEMM rates, else the reference GPU's: its rates per unit scaled by this GPU's
    copy bandwidth, its fixed costs (launches, waits) as they are.

    Example:
        >>> from tuner.model.profile_data import Profile
        >>> r = rates_from(Profile({}, {"copy_bandwidth_gbs": 1503.0, "launch_overhead_ms": 0.004}, {}, ""))
        >>> round(r.per_unit["outer.expand"] / REFERENCE_RATES["outer.expand"], 3), r.source
        (2.0, 'reference rates scaled by copy bandwidth')
        >>> r.per_unit["outer:fixed"] == REFERENCE_RATES["outer:fixed"]
        True
    """
    constants = profile.constants if profile is not None else {}
    launch = float(constants.get("launch_overhead_ms", 0.005))
    measured = (profile.spgemm or {}).get("rates") if profile is not None else None
    scale = REFERENCE_BANDWIDTH_GBS / float(constants.get("copy_bandwidth_gbs", REFERENCE_BANDWIDTH_GBS))
    reference = {k: v if k.endswith(FIXED) or k in PER_LAUNCH else v * scale for k, v in REFERENCE_RATES.items()}
    if measured:  # units the measured products never had (global tables, say) keep the reference's rates
        units = {k: v for k, v in reference.items() if not k.endswith(FIXED)}
        return Rates({**units, **measured}, launch, "measured")
    return Rates(reference, launch, "reference rates scaled by copy bandwidth")


def predict(family: str, s: ProductStats, rates: Rates) -> float:
    """Predicted milliseconds of one whole product (both phases for row_hash) by ``family``.

    Example:
        >>> s = ProductStats(10, 10, 10**6, 5e5, 0, 0, 8, 4, 20, 4)
        >>> r = Rates({k: 1e-6 for k in REFERENCE_RATES}, 0.005, "test")
        >>> predict("row_hash", s, r) < predict("outer_product", s, r)
        True
    """
    units = work(family, s)
    fixed = rates.per_unit.get(PREFIX[family] + FIXED)
    if fixed is None:  # no whole products timed: each running phase's fixed part and the launches
        running = {k.split(SHARE)[0] for k, n in units.items() if n > 0}
        fixed = sum(rates.per_unit.get(k + FIXED, 0.0) for k in running) + LAUNCHES[family](s) * rates.launch_ms
    return float(sum(n * rates.per_unit.get(k, 0.0) for k, n in units.items()) + fixed)


def fit_rates(runs: list[dict]) -> dict:
    """Each timed phase's rates from measured runs ({"work": {unit: count}, "ms": {phase: ms}}): ms = fixed +
    the sum of rate x count over the phase's units (its own and its ``phase/...`` ones), fitted by non-negative
    least squares on relative errors (products of every size weigh alike, as picks among them do); the fixed
    part is kept under ``phase + FIXED`` where positive. With fewer runs than unknowns: total time over the
    phase's own units.

    Runs that also hold ``whole_ms`` (the product timed whole, with no waits between its phases) and their
    ``family`` replace that family's phase fixed parts by one (``prefix + FIXED``, see :data:`PREFIX`): the
    least-squares fixed part on relative errors of the whole times given the rates' part (the residuals
    weighted by 1 / whole_ms squared, so that the small products, whose time it mostly is, decide it),
    fitted together with the rates of units no phase times apart (``hash.bins``: a launch and a stream's wait
    per non-empty bin). Phases timed one by one each pay a wait for the GPU and run alone, which a whole
    product does not, so their fixed parts overstate a small product's.

    Example:
        >>> r = fit_rates([{"work": {"a": 100.0}, "ms": {"a": 2.0}}, {"work": {"a": 300.0}, "ms": {"a": 4.0}}])
        >>> {k: round(v, 6) for k, v in r.items()}
        {'a': 0.01, 'a:fixed': 1.0}
        >>> fit_rates([{"work": {"a": 100.0}, "ms": {"a": 2.0}}])
        {'a': 0.02}
        >>> r = fit_rates([{"family": "row_hash", "work": {"hash.a": w}, "ms": {"hash.a": 1 + w / 100},
        ...                 "whole_ms": 0.2 + w / 100} for w in (100.0, 300.0)])
        >>> {k: round(v, 6) for k, v in r.items()}
        {'hash.a': 0.01, 'hash:fixed': 0.2}
    """
    from scipy.optimize import nnls  # only the fit needs it: importing SciPy's optimize takes 0.2 s
    out = {}
    for phase in sorted({k.split(SHARE)[0] for r in runs for k in r["work"]}):
        keys = sorted({k for r in runs for k in r["work"] if k.split(SHARE)[0] == phase})
        done = [r for r in runs if phase in r["ms"] and any(r["work"].get(k, 0.0) > 0 for k in keys)]
        if not done:
            continue
        x = np.array([[r["work"].get(k, 0.0) for k in keys] + [1.0] for r in done])
        y = np.array([r["ms"][phase] for r in done])
        if len(done) <= len(keys) or not np.all(y > 0):
            own = sum(r["work"].get(phase, 0.0) for r in done)
            if own > 0:
                out[phase] = float(y.sum() / own)
            continue
        scale = x.max(axis=0)  # columns of one size, for the solver
        coef, _ = nnls(x / scale / y[:, None], np.ones_like(y))
        coef = coef / scale
        out.update({k: float(c) for k, c in zip(keys, coef[:-1])})
        if coef[-1] > 0:
            out[phase + FIXED] = float(coef[-1])
    for family, prefix in PREFIX.items():
        whole = [r for r in runs if r.get("family") == family and r.get("whole_ms")]
        if not whole:
            continue
        timed = {k for r in whole for k in r["ms"]}
        untimed = sorted({k for r in whole for k in r["work"] if k.split(SHARE)[0] not in timed})
        ms = np.array([r["whole_ms"] for r in whole])
        rest = ms - np.array([sum(n * out.get(k, 0.0) for k, n in r["work"].items()) for r in whole])
        for k in [k for k in out if k.startswith(prefix + ".") and k.endswith(FIXED)]:
            del out[k]
        x = np.array([[r["work"].get(k, 0.0) for k in untimed] + [1.0] for r in whole])
        scale = np.maximum(x.max(axis=0), 1e-30)
        coef, _ = nnls(x / scale / ms[:, None], rest / ms)
        coef = coef / scale
        out.update({k: float(c) for k, c in zip(untimed, coef[:-1])})
        out[prefix + FIXED] = float(coef[-1])
    return out
