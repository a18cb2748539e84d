"""The SpGEMM model: each family's time predicted from exact product counts, an estimate of C's size and
phase rates measured by ``python -m tuner profile``.

Every phase's time is its work in the unit that bounds it times a measured rate (milliseconds per unit),
plus its launches:

- outer_product: the expansion writes every product as a 64-bit key and a value; the radix sort moves them
  once per 8-bit digit of the key; the reduction reads them once; the CSR pass touches C's entries.
- row_hash: the symbolic and numeric phases cost per scalar product (a B entry read and a hash insert),
  at one rate for rows whose tables are in shared memory and another for rows in global-memory tables;
  the segmented sort moves C's entries; the scan and binning between the phases pass over C's rows.

C's size (which the numeric phase writes and the sorts move) is estimated before anything runs from rows
sampled with probability proportional to their products: the mean of their distinct-to-product ratios is
an unbiased estimate of nnz(C) / products.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from ..formats.row_bins import caps, row_products
from ..matrix import CanonicalMatrix

SAMPLE_ROWS = 512
SAMPLE_PRODUCTS = 20_000_000  # what the sampled rows may cost SciPy (about a quarter of a second)
KEY_BYTES = 8  # outer_product's (row * n_cols + column) keys

# Milliseconds per unit of each phase as measured on an H100 80GB HBM3 by `python -m tuner profile` (the
# "spgemm" section of models/nvidia-h100-80gb-hbm3/profile.json, with that profile's copy bandwidth); GPUs
# without a measured section scale them by their copy bandwidth, since every phase moves its units through
# device memory or L2.
REFERENCE_BANDWIDTH_GBS = 3006.0
REFERENCE_RATES = {
    "outer.csr": 1.0886e-09, "outer.expand": 3.0113e-09, "outer.reduce": 6.5076e-10, "outer.sort": 9.0816e-10,
    "hash.rows": 2.7146e-05, "hash.symbolic_global": 1.9908e-08, "hash.symbolic_shared": 5.2142e-08,
    "hash.numeric_global": 5.4780e-08, "hash.numeric_shared": 6.1473e-08, "hash.sort": 5.3514e-09,
}


@dataclass(frozen=True)
class ProductStats:
    """What the model knows of C = A B before anything runs.

    Attributes:
        n_rows, n_cols: C's shape.
        products: scalar products (exact).
        nnz_c: estimated entries of C (exact when ``exact``).
        symbolic_global, numeric_global: products in rows whose symbolic / numeric tables exceed shared memory.
        value_bytes, col_bytes: sizes of a value and of a column index.
        key_bits: bits of outer_product's keys.
        bins: shared bins of each row_hash phase (their launches).
        exact: whether ``nnz_c`` is exact (every row sampled).
        a_entries: entries of A that meet a non-empty row of B (each starts a walk of a B row).
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
                  value_bytes: int, sample: int = SAMPLE_ROWS) -> ProductStats:
    """Exact products, the estimated nnz(C) and the products in rows beyond shared memory (a row's numeric
    size estimated as its products times the sample's mean ratio).

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
    return ProductStats(
        n_rows=a.n_rows, n_cols=n_cols, products=int(products.sum()), nnz_c=nnz_c,
        symbolic_global=int(products[products > sym_cap].sum()),
        numeric_global=int(products[products * mean_ratio > num_cap].sum()),
        value_bytes=value_bytes, col_bytes=4 if n_cols <= np.iinfo(np.int32).max else 8,
        key_bits=max(1, (a.n_rows * n_cols - 1).bit_length()),
        bins=len(symbolic_tables) + len(numeric_tables) + 2, exact=exact,
        a_entries=int(np.count_nonzero(np.diff(np.asarray(b.indptr, np.int64))[a.indices])))


def work(family: str, s: ProductStats) -> dict[str, float]:
    """Each phase's units of work (bytes, products or rows) for ``family``.

    Example:
        >>> s = ProductStats(10, 10, 100, 50.0, 0, 0, 8, 4, 7, 4)
        >>> work("outer_product", s)["outer.sort"], work("row_hash", s)["hash.numeric_shared"]
        (1600.0, 100.0)
    """
    pair = KEY_BYTES + s.value_bytes
    entry = s.col_bytes + s.value_bytes
    if family == "outer_product":
        passes = -(-s.key_bits // 8)
        return {"outer.expand": float(s.products * pair), "outer.sort": float(s.products * pair * passes),
                "outer.reduce": float(s.products * pair), "outer.csr": s.nnz_c * pair}
    return {"hash.rows": float(s.n_rows),
            "hash.symbolic_shared": float(s.products - s.symbolic_global),
            "hash.symbolic_global": float(s.symbolic_global),
            "hash.numeric_shared": float(s.products - s.numeric_global),
            "hash.numeric_global": float(s.numeric_global), "hash.sort": s.nnz_c * entry}


def lanes_for(s: "ProductStats") -> int:
    """row_hash's lanes: the power of two nearest the mean length of the B rows its products come from
    (threads beyond a B row's length idle, fewer walk it in several rounds), 16 to 128.

    Example:
        >>> lanes_for(ProductStats(10, 10, 14000, 1.0, 0, 0, 4, 4, 7, 4, a_entries=100))
        128
    """
    mean = s.products / max(s.a_entries, 1)
    return int(min(128, max(16, 1 << int(round(np.log2(max(mean, 1.0)))))))


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


LAUNCHES = {"outer_product": lambda s: 6, "row_hash": lambda s: s.bins + 6}


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
    """The profile's measured SpGEMM rates, else the reference GPU's scaled by this GPU's copy bandwidth.

    Example:
        >>> from tuner.model.profile_data import Profile
        >>> r = rates_from(Profile({}, {"copy_bandwidth_gbs": 1503.0, "launch_overhead_ms": 0.004}, {}, ""))
        >>> round(r.per_unit["outer.expand"] / REFERENCE_RATES["outer.expand"], 3), r.source
        (2.0, 'reference rates scaled by copy bandwidth')
    """
    constants = profile.constants if profile is not None else {}
    launch = float(constants.get("launch_overhead_ms", 0.005))
    measured = (profile.spgemm or {}).get("rates") if profile is not None else None
    if measured:
        return Rates(dict(measured), launch, "measured")
    scale = REFERENCE_BANDWIDTH_GBS / float(constants.get("copy_bandwidth_gbs", REFERENCE_BANDWIDTH_GBS))
    return Rates({k: v * scale for k, v in REFERENCE_RATES.items()}, launch,
                 "reference rates scaled by copy bandwidth")


def predict(family: str, s: ProductStats, rates: Rates) -> float:
    """Predicted milliseconds of one whole product (both phases for row_hash) by ``family``.

    Example:
        >>> s = ProductStats(10, 10, 10**6, 5e5, 0, 0, 8, 4, 20, 4)
        >>> r = Rates({k: 1e-6 for k in REFERENCE_RATES}, 0.005, "test")
        >>> predict("row_hash", s, r) < predict("outer_product", s, r)
        True
    """
    units = work(family, s)
    return float(sum(n * rates.per_unit.get(k, 0.0) for k, n in units.items())
                 + LAUNCHES[family](s) * rates.launch_ms)


def fit_rates(runs: list[dict]) -> dict:
    """Each phase's ms per unit from measured runs ({"work": {phase: units}, "ms": {phase: ms}}): total time
    over total work, so that large products, which the rates matter for, weigh most.

    Example:
        >>> fit_rates([{"work": {"a": 100.0}, "ms": {"a": 2.0}}, {"work": {"a": 300.0}, "ms": {"a": 2.0}}])
        {'a': 0.01}
    """
    phases = sorted({k for r in runs for k in r["work"]})
    out = {}
    for k in phases:
        units = sum(r["work"].get(k, 0.0) for r in runs if k in r["ms"])
        ms = sum(r["ms"][k] for r in runs if k in r["ms"])
        if units > 0:
            out[k] = ms / units
    return out
