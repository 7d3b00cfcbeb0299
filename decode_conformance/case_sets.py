"""Named case sets, built from one axis table. Data first, generators after.

    parity   a pairwise covering array over the axis table (every pair of values of two axes
             in at least one valid case that each kernel can run, after its capability skips)
             plus the regression cases (regressions.py)
    smoke    a few parity cases that cover every axis value and kill every mutant that can be
             killed on the profile (fixtures/smoke_set.txt, written by `python ci/mutation.py`)
    full     parity plus the product of dtype x layout x heads x head dim (64, 128)
    fuzz     no fixed cases: suites/parity/test_fuzz.py draws them with hypothesis (fuzz.py)
    trace:PATH  the workloads of a FlashInfer-Trace workload file (trace.py)

One recipe list serves both profiles: a recipe is one value per axis, and `realize` sizes it:
`interpreter` (CPU, Triton's interpreter: two KV heads, a few hundred keys, "long" means more
than 256 keys) and `gpu` (eight KV heads, "long" means more than 8k keys, up to 128k keys).
`classify` maps any case back to its axis values; realize(recipe) must classify back to the
recipe exactly, so coverage is counted on the cases themselves (regression cases included).

How to add a case axis, or a value to one (a data kind, a layout): docs/cases.md, "How to
add an axis" and the two sections after it, the one list of every step.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import zlib
from dataclasses import dataclass
from typing import Iterable, Optional

from . import regressions
from .cases import KEYS_MATTER, QUERY_SCALAR_RATIO, Case, window_for
from .kernel_api import Capabilities
from .pairwise import Constraint, CoveringProblem

SET_NAMES = ("smoke", "parity", "full", "fuzz")
TRACE_PREFIX = "trace:"  # --case-set=trace:PATH
PROFILES = ("interpreter", "gpu")

# ---- the axis table ---------------------------------------------------------------------------
# Values in order of preference: on a tie the generator takes the earlier (cheaper) one.
AXES: dict[str, tuple[str, ...]] = {
    "kv_dtype": ("bf16", "fp16", "e4m3", "e5m2"),
    "layout": ("paged16", "contig", "paged1", "paged64", "paged256", "paged16-kv2"),
    "heads": ("g1", "g2", "g3", "g4", "g5", "g6", "g7", "g8", "mqa", "g29"),
    "head_dim": ("d64", "d80", "d96", "d128", "d256", "mla576", "mla288"),
    "window": ("none", "counts-current", "excludes-current"),
    "window_start": ("-", "page-start", "page-start+1", "page-end", "before-start"),
    "window_keys": ("-", "split", "split+1", "split-1"),
    "softcap": ("off", "30"),
    "sinks": ("off", "on"),
    "lengths": ("zero-one", "long-short", "all-long", "split-edge"),
    "data": ("structured", "large-scores", "late-spike", "large-v", "randn", "low-scores", "zero-q", "huge-scores"),
    "inputs": ("packed", "q-strided", "table-wide", "v-head-major"),
    "scale": ("head-dim", "query-scalar"),
}
AXIS_DOCS = {
    "kv_dtype": "KV cache dtype (fp8 caches pair with bf16 queries and non-unit, unequal k/v scales)",
    "layout": "contiguous slots, or pages of 1/16/64/256 slots; paged16-kv2: K and V pages interleaved in one "
              "tensor (a page stride that is not page_size slots)",
    "heads": "GQA group (query heads per KV head; g1 = MHA) with 2 KV heads (interpreter) or 8 (GPU); mqa: one KV "
             "head under 16 (interpreter) or 32 (GPU) query heads; g29: Falcon-180B's group (232 query heads over 8 "
             "KV heads), 16 or more yet odd and no multiple of 8 or 16, so a head tile must mask its last rows. MLA "
             "has one latent KV head: the value is its query-head count (mqa: 16 / 32)",
    "head_dim": "head dim 64/80/96/128/256 (V the same), or the MLA rope splits 576/512 (DeepSeek) and 288/256",
    "window": "no sliding window, or one given in either convention (counts the current token, or excludes it)",
    "window_start": "where the first visible key of the longest request falls: on a page's first slot, its second, "
                    "its last, or before the request (window wider than every request)",
    "window_keys": "visible keys vs the split unit U of the shipped split rules (64 interpreter, 128 GPU): a multiple "
                   "of U, one more (a 1-key last split/tile) or one less",
    "softcap": "no soft-cap, or cap 30 (Grok; Gemma-2 uses 50)",
    "sinks": "per-head attention sinks (denominator only)",
    "lengths": "the batch: a 0-length and a 1-length row next to a short one; a long request next to a short one; "
               "all long; three requests at a split boundary -1, +0, +1 of every shipped split rule",
    "data": "how q, K, V are drawn (cases.DATA_KINDS): structured (every key matters); large-scores (raw scores "
            "~ +96, past float32's exp range, no soft-cap); late-spike (keys ~100 nats above the rest late in the "
            "request, on every other row); large-v (V near the top of the storage type); randn; low-scores "
            "(-2e5 to -5e5); zero-q; huge-scores (soft-capped). Long requests only under the kinds where every key "
            "matters (cases.KEYS_MATTER)",
    "inputs": "how the tensors are handed over (cases.INPUT_FORMS): packed; q a view into a fused qkv row; a "
              "block table wider than the batch needs; V stored head-major behind its view, K not",
    "scale": "the softmax scale: the head dim's (MLA: the pre-absorption dim's), or that times sqrt(128/144) "
             "(Gemma-2 27B's query_pre_attn_scalar), so a kernel must take sm_scale rather than derive it",
}
MLA_SHAPES = {"mla576": (576, 512), "mla288": (288, 256)}


# ---- profile sizing ---------------------------------------------------------------------------
# The split rules of the shipped kernels, for window_keys and the split-edge lengths, read from
# the kernels' pure-python modules (split_rule, launch_constants): importing a Triton kernel
# module here would run before the interpreter is switched on.
EDGE_AT_LEAST = {"interpreter": 256, "gpu": 32768}


@functools.lru_cache(maxsize=None)
def split_unit(profile: str) -> int:
    """U: every shipped kernel's split or key-tile boundaries fall on multiples of it."""
    from decode_conformance_kernels import split_rule
    return math.lcm(_fixed_split()[1], split_rule.KEY_BLOCK, lean_block_n(profile))


def _fixed_split() -> tuple[int, int]:
    """(default splits, split alignment) of the fixed-split kernel."""
    from decode_conformance_kernels import launch_constants as kc
    return kc.FIXED_DEFAULT_SPLITS, kc.FIXED_SPLIT_ALIGN


def lean_block_n(profile: str) -> int:
    """Lean's key tile in a profile: the interpreter's, or NVIDIA's for head dims <= 128 (the
    generator's GQA shapes; ROCm's smaller tile divides it)."""
    from decode_conformance_kernels import launch_constants as kc
    if profile == "interpreter":
        return kc.LEAN_CPU_BLOCK_N
    return kc.LEAN_GPU_CONFIGS[kc.config_class(128, mla=False)][0][0]


@functools.lru_cache(maxsize=None)
def split_edge(profile: str) -> int:
    """A length at which every shipped rule's splits end exactly: fixed split's 8 x 32-aligned
    splits, adaptive's MIN_CHUNK chunks of KEY_BLOCK blocks, Lean's key tiles."""
    from decode_conformance_kernels import split_rule
    splits, align = _fixed_split()
    step = math.lcm(split_unit(profile), align * splits, 2 * split_rule.MIN_CHUNK)
    return -(-EDGE_AT_LEAST[profile] // step) * step


@dataclass(frozen=True)
class Sizing:
    long: int  # a request is long above this many keys
    kv_heads: int
    mqa_q_heads: int
    window_units: int  # windows span about this many split units
    lengths: dict  # regime -> lengths without a window (the longest may grow to place a window)


SIZES = {
    "interpreter": Sizing(long=256, kv_heads=2, mqa_q_heads=16, window_units=1,
                          lengths={"zero-one": (0, 45, 1), "long-short": (300, 17), "all-long": (477, 300)}),
    "gpu": Sizing(long=8192, kv_heads=8, mqa_q_heads=32, window_units=32,
                  lengths={"zero-one": (0, 3001, 1), "long-short": (40001, 17), "all-long": (131072, 65537)}),
}


def regime_lengths(profile: str, regime: str) -> tuple[int, ...]:
    if regime == "split-edge":
        b = split_edge(profile)
        return (b - 1, b, b + 1)
    return SIZES[profile].lengths[regime]


# ---- recipe -> case ---------------------------------------------------------------------------
BASE_FIELDS = dict(kv_dtype="bf16", num_q_heads=4, num_kv_heads=2, head_dim=64, seq_lens=(1,), layout="paged",
                   page_size=16)


def _page_size(layout: str) -> int:
    if layout == "contig":
        return 1
    return int(layout.split("-")[0][len("paged"):])


def _value_fields(axis: str, value: str, profile: str) -> dict:
    """The Case fields one axis value sets by itself (lengths and window sizes come from `_shape`)."""
    S = SIZES[profile]
    if axis == "kv_dtype":
        return {"kv_dtype": value}
    if axis == "layout":
        if value == "contig":
            return {"layout": "contig", "page_size": 1}
        return {"layout": "paged", "page_size": _page_size(value), "combined_kv": value.endswith("-kv2")}
    if axis == "heads":
        if value == "mqa":
            return {"num_kv_heads": 1, "num_q_heads": S.mqa_q_heads}
        g = int(value[1:])
        return {"num_kv_heads": S.kv_heads, "num_q_heads": g * S.kv_heads}
    if axis == "head_dim":
        if value in MLA_SHAPES:
            dk, dv = MLA_SHAPES[value]
            return {"head_dim": dk, "v_head_dim": dv, "mla": True, "num_kv_heads": 1}
        d = int(value[1:])
        return {"head_dim": d, "v_head_dim": d, "mla": False}
    if axis == "window":
        return {"window": None} if value == "none" else {"window": 5, "window_convention": value}
    if axis == "softcap":
        return {"softcap": None if value == "off" else float(value)}
    if axis == "sinks":
        return {"sinks": value == "on"}
    if axis == "data":
        return {"data": value}
    if axis == "inputs":
        return {"inputs": value}
    return {}  # lengths, window_start, window_keys: sizes; scale: from the other fields (_unseeded)


def _smallest_at_least(lo: int, residue: int, modulus: int) -> int:
    """The smallest n >= lo with n % modulus == residue."""
    return lo + (residue - lo) % modulus


def _shape(regime: str, page: int, window: str, wstart: str, wkeys: str, profile: str):
    """(lengths, visible keys or None) placing the window as asked, or None when impossible."""
    base = regime_lengths(profile, regime)
    if window == "none":
        return (base, None) if wstart == "-" and wkeys == "-" else None
    if wstart == "-":
        return None
    if wstart == "before-start":
        return (base, max(base) + 7) if wkeys == "-" else None
    if wkeys == "-":
        return None
    if page == 1 and wstart != "page-start":
        return None  # with one slot per page every key starts a page
    residue = {"page-start": 0, "page-start+1": 1, "page-end": page - 1}[wstart]
    delta = {"split": 0, "split+1": 1, "split-1": -1}[wkeys]
    U = split_unit(profile)
    k0 = SIZES[profile].window_units
    need_vis = 2 if window == "excludes-current" else 1
    if regime == "split-edge":  # the lengths are fixed: find a window size that lands right
        L = max(base)
        for k in sorted(range(1, L // U + 1), key=lambda k: (abs(k - k0), k)):
            vis = k * U + delta
            if need_vis <= vis < L and (L - vis) % page == residue:
                return base, vis
        return None
    vis = k0 * U + delta
    others = sorted(base)[:-1]
    lo = {"zero-one": 1, "long-short": SIZES[profile].long + 1, "all-long": max(others)}[regime]
    start = _smallest_at_least(max(1, lo - vis), residue, page)
    L = vis + start
    lengths = tuple(L if n == max(base) else n for n in base)
    return lengths, vis


def seeded(case: Case) -> Case:
    """Give a case a seed derived from its other fields: stable across runs and workers."""
    return case.replace(seed=zlib.crc32(case.replace(seed=0).id.encode()) & 0x7FFFFFFF)


def realize(recipe: dict, profile: str) -> Optional[Case]:
    """The case of a recipe (one value per axis) in a profile; None when the values cannot go
    together. The case classifies back to exactly the recipe."""
    case = _unseeded(recipe, profile)
    return None if case is None else seeded(case)


def _unseeded(recipe: dict, profile: str) -> Optional[Case]:
    fields = dict(BASE_FIELDS)
    for axis in AXES:
        fields.update(_value_fields(axis, recipe[axis], profile))
    if fields.get("mla"):
        heads = recipe["heads"]
        fields["num_q_heads"] = SIZES[profile].mqa_q_heads if heads == "mqa" else int(heads[1:])
        fields["num_kv_heads"] = 1
    shape = _shape(recipe["lengths"], fields["page_size"], recipe["window"], recipe["window_start"],
                   recipe["window_keys"], profile)
    if shape is None:
        return None
    lengths, vis = shape
    fields["seq_lens"] = tuple(lengths)
    fields["window"] = window_for(vis, recipe["window"])
    try:
        case = Case(**fields)
        if recipe["scale"] == "query-scalar":
            case = case.replace(scale=case.default_scale * QUERY_SCALAR_RATIO)
    except ValueError:
        return None
    if classify(case, profile) != dict(recipe):
        return None
    return case


# ---- case -> axis values ------------------------------------------------------------------------
def _regime(lens: tuple[int, ...], profile: str) -> Optional[str]:
    b = split_edge(profile)
    present = set(lens)
    if {b - 1, b, b + 1} <= present:
        return "split-edge"
    if 0 in present and 1 in present:
        return "zero-one"
    long = SIZES[profile].long
    if len(lens) >= 2 and all(n > long for n in lens):
        return "all-long"
    if max(lens) > long and min(lens) <= split_unit(profile):
        return "long-short"
    return None


def classify(case: Case, profile: str) -> dict[str, str]:
    """The axis values of any case (pairwise, regression, fuzz, trace); axes whose value is not
    in the table are left out."""
    out: dict[str, Optional[str]] = {"kv_dtype": case.kv_dtype}
    P = case.page_size if case.layout == "paged" else 1
    if case.layout == "contig":
        out["layout"] = "contig"
    else:
        out["layout"] = f"paged{P}" + ("-kv2" if case.combined_kv else "")
    S = SIZES[profile]
    if case.mla:
        out["heads"] = "mqa" if case.num_q_heads == S.mqa_q_heads else f"g{case.num_q_heads}"
        out["head_dim"] = next((k for k, v in MLA_SHAPES.items() if v == (case.head_dim, case.v_head_dim)), None)
    else:
        out["heads"] = "mqa" if case.num_kv_heads == 1 else f"g{case.group}"
        out["head_dim"] = f"d{case.head_dim}" if case.v_head_dim == case.head_dim else None
    out["window"] = "none" if case.window is None else case.window_convention
    L = max(case.seq_lens)
    if case.window is None:
        out["window_start"] = out["window_keys"] = "-"
    elif case.visible_keys > L:
        out["window_start"], out["window_keys"] = "before-start", "-"
    else:
        vis = case.visible_keys
        s = (L - vis) % P
        out["window_start"] = ("page-start" if s == 0 else "page-end" if s == P - 1 else
                               "page-start+1" if s == 1 else None)
        r = vis % split_unit(profile)
        out["window_keys"] = {0: "split", 1: "split+1", split_unit(profile) - 1: "split-1"}.get(r)
    out["softcap"] = "off" if case.softcap is None else (f"{case.softcap:g}" if f"{case.softcap:g}" in AXES["softcap"]
                                                          else None)
    out["sinks"] = "on" if case.sinks else "off"
    out["lengths"] = _regime(case.seq_lens, profile)
    out["data"] = case.data
    out["inputs"] = case.inputs
    if case.scale is None:
        out["scale"] = "head-dim"
    elif math.isclose(case.scale, case.default_scale * QUERY_SCALAR_RATIO, rel_tol=1e-9):
        out["scale"] = "query-scalar"
    return {a: v for a, v in out.items() if v is not None and v in AXES[a]}


# ---- constraints and capability groups --------------------------------------------------------
SHAPE_AXES = ("lengths", "layout", "window", "window_start", "window_keys")


@functools.lru_cache(maxsize=None)
def constraints() -> tuple[Constraint, ...]:
    """Value combinations that can exist, in both profiles."""
    def shape_ok(regime, layout, window, wstart, wkeys):
        recipe = dict(kv_dtype="bf16", layout=layout, heads="g2", head_dim="d64", window=window,
                      window_start=wstart, window_keys=wkeys, softcap="off", sinks="off", lengths=regime,
                      data="structured", inputs="packed", scale="head-dim")
        return all(_unseeded(recipe, p) is not None for p in PROFILES)

    return (
        Constraint.from_predicate(AXES, SHAPE_AXES, shape_ok,
                                  "lengths, page size and window placement must fit together (both profiles)"),
        Constraint.from_predicate(AXES, ("layout", "head_dim"),
                                  lambda lay, hd: not (lay.endswith("-kv2") and hd in MLA_SHAPES),
                                  "interleaved K/V pages hold separate K and V: not MLA"),
        Constraint.from_predicate(AXES, ("inputs", "head_dim"),
                                  lambda inp, hd: not (inp == "v-head-major" and hd in MLA_SHAPES),
                                  "MLA's V is K's view: it has no layout of its own"),
        Constraint.from_predicate(AXES, ("inputs", "heads"), lambda inp, h: not (inp == "v-head-major" and h == "mqa"),
                                  "with one KV head, head-major V is the same memory order"),
        Constraint.from_predicate(AXES, ("inputs", "layout"),
                                  lambda inp, lay: not (inp == "v-head-major" and lay in ("contig", "paged1",
                                                                                          "paged16-kv2")),
                                  "V head-major needs a V tensor of its own with pages of more than one slot "
                                  "(with one, head-major is the same memory order)"),
        Constraint.from_predicate(AXES, ("data", "softcap"), lambda d, cap: not (d == "huge-scores" and cap == "off"),
                                  "huge-scores tests the soft-cap's overflow: it needs a cap"),
        # A long row under a kind where keys weigh alike or the output averages to ~0 would let a
        # kernel drop keys within its budget: long requests keep a structured-based kind.
        Constraint.from_predicate(AXES, ("data", "lengths"), lambda d, reg: d in KEYS_MATTER or reg == "zero-one",
                                  "long requests only under a kind where every key matters (cases.KEYS_MATTER)"),
    )


# Kernel capability shapes the parity set is generated for: every shipped kernel has one of
# them (python -m decode_conformance.coverage checks each registered kernel on its own caps).
CAPABILITY_GROUPS = {
    "all features": Capabilities(),  # fixed_split, adaptive_split, dispatch, torch_gather
    "no soft-cap or sinks": Capabilities(softcap=False, sinks=False),  # lean, torch_sdpa
    "fp8 KV only": Capabilities(kv_dtypes=frozenset({"e4m3", "e5m2"})),  # adaptive_split_fp8mma
}


def _probe(fields: dict) -> Case:
    """A Case carrying `fields` without validation: capabilities look at single fields, so a
    probe answers 'does the kernel take this value' whatever the other fields are."""
    c = object.__new__(Case)
    for f in dataclasses.fields(Case):
        default = f.default if f.default is not dataclasses.MISSING else None
        object.__setattr__(c, f.name, fields.get(f.name, default))
    return c


def value_domains(caps: Capabilities, device_type: str = "cpu") -> dict[str, tuple[str, ...]]:
    """{axis: the values a kernel with `caps` can run}. Each value of an axis is probed on the
    same base case; the reasons every value of the axis shares come from the base's other
    fields, so a value is allowed when `caps.missing_for` gives it no reason of its own."""
    out = {}
    for axis, values in AXES.items():
        reasons = {}
        for v in values:
            fields = dict(BASE_FIELDS, v_head_dim=64)
            fields.update(_value_fields(axis, v, "interpreter"))
            reasons[v] = set(caps.missing_for(_probe(fields), device_type))
        common = set.intersection(*reasons.values())
        out[axis] = tuple(v for v in values if reasons[v] <= common)
    return out


def covering_problem(groups: Optional[dict[str, Capabilities]] = None, device_type: str = "cpu") -> CoveringProblem:
    groups = CAPABILITY_GROUPS if groups is None else groups
    return CoveringProblem(AXES, constraints(), {g: value_domains(c, device_type) for g, c in groups.items()})


PAIRWISE_FILE = "pairwise_rows.json"  # in the shipped data: the covering rows, with the fingerprint they came from
PAIRWISE_REGENERATE = "python -m decode_conformance.case_sets --write-pairwise"


def shipped_rows(problem: CoveringProblem, path=None) -> tuple[Optional[list[dict]], str]:
    """(the shipped covering rows, '') when PAIRWISE_FILE (or `path`) was generated from a
    problem with `problem`'s fingerprint, else (None, why not, with the command that writes
    them): covering_rows reads them, and `coverage --check` says why they would not be read."""
    import json
    from .resources import data_path
    p = data_path(PAIRWISE_FILE) if path is None else path
    try:
        shipped = json.loads(p.read_text())
        fingerprint = shipped.get("fingerprint")
    except (OSError, ValueError, AttributeError) as e:
        return None, f"{p}: unreadable ({e}); write it: {PAIRWISE_REGENERATE}"
    if fingerprint != problem.fingerprint():
        return None, (f"{p} was generated from another axis table, constraint set or generator: every pytest "
                      f"process generates the rows again (about a second of a core); write it: {PAIRWISE_REGENERATE}")
    return [dict(row) for row in shipped["rows"]], ""


def covering_rows(problem: CoveringProblem, path=None) -> list[dict]:
    """`problem.generate()`, read from the shipped rows (shipped_rows) when they were generated
    from a problem with the same fingerprint, else generated here. Generating takes 0.9-1.6 s
    of one core (a 2-core CPU), and every pytest process of a run needs the parity set: the
    controller and each xdist worker, during a GPU run's start-up when 24 processes import torch
    at once (docs/compile-ahead.md). Stale rows are never used; the selftest
    `test_shipped_pairwise_rows_are_fresh` fails until they are regenerated."""
    rows, _ = shipped_rows(problem, path)
    return rows if rows is not None else problem.generate()


def write_pairwise_rows(path=None) -> str:
    """Generate the covering rows and write them with their fingerprint (PAIRWISE_FILE, or
    `path`); returns the path written."""
    import json
    from .resources import data_path
    problem = covering_problem()
    rows = problem.generate()
    p = data_path(PAIRWISE_FILE) if path is None else path
    head = json.dumps({"regenerate": PAIRWISE_REGENERATE, "fingerprint": problem.fingerprint()})[:-1]
    lines = ",\n".join("  " + json.dumps({a: r[a] for a in AXES}) for r in rows)  # a row a line
    p.write_text(f'{head}, "rows": [\n{lines}\n]}}\n')
    return str(p)


@functools.lru_cache(maxsize=None)
def pairwise_recipes() -> tuple[tuple[tuple[str, str], ...], ...]:
    """The parity set's recipes: a pairwise covering array for every capability group."""
    rows = covering_rows(covering_problem())
    for r in rows:
        for p in PROFILES:
            if realize(r, p) is None:
                raise RuntimeError(f"pairwise recipe {r} does not realize in the {p} profile")
    return tuple(tuple((a, r[a]) for a in AXES) for r in rows)


def recipe_key(recipe: dict) -> str:
    return "pw:" + ",".join(f"{a}={recipe[a]}" for a in AXES)


# ---- the sets ----------------------------------------------------------------------------------
def _dedupe(entries: Iterable[tuple[str, Case]]) -> list[tuple[str, Case]]:
    seen, out = set(), []
    for key, c in entries:
        c = seeded(c) if c.seed == 0 else c
        if c.id not in seen:
            seen.add(c.id)
            out.append((key, c))
    return out


@functools.lru_cache(maxsize=None)
def _parity_entries(profile: str) -> tuple[tuple[str, Case], ...]:
    """(recipe key, case) of the parity set: the same key names the same recipe in both
    profiles (a pairwise recipe, or the i-th case of a regression record)."""
    entries = [(recipe_key(dict(r)), realize(dict(r), profile)) for r in pairwise_recipes()]
    for reg in regressions.REGRESSIONS:
        entries += [(f"{reg.label}#{i}", c) for i, c in enumerate(reg.cases(profile))]
    return tuple(_dedupe(entries))


def parity_keys(profile: str) -> dict[str, str]:
    """{case id: recipe key} of the parity set."""
    return {c.id: k for k, c in _parity_entries(profile)}


def product_grid(profile: str) -> list[Case]:
    out = []
    fixed = dict(window="none", window_start="-", window_keys="-", softcap="off", sinks="off", lengths="long-short",
                 data="structured", inputs="packed", scale="head-dim")
    for dt in AXES["kv_dtype"]:
        for lay in AXES["layout"]:
            for heads in AXES["heads"]:
                for hd in ("d64", "d128"):
                    c = realize(dict(fixed, kv_dtype=dt, layout=lay, heads=heads, head_dim=hd), profile)
                    if c is not None:
                        out.append(c)
    return out


SMOKE_FILE = "smoke_set.txt"  # in the shipped data (decode_conformance.fixtures)
SMOKE_REGENERATE = "python ci/mutation.py --jobs 2"
GPU_ONLY_PREFIX = "gpu "  # smoke_set.txt: a GPU-profile case with no interpreter twin


def _smoke_lines() -> tuple[frozenset, frozenset]:
    from .resources import data_path
    p = data_path(SMOKE_FILE)
    if not p.exists():
        raise FileNotFoundError(f"case set 'smoke': {p} is missing. It is derived from the mutation kill map; "
                                f"regenerate it with `{SMOKE_REGENERATE}`.")
    interp, gpu = set(), set()
    for line in p.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith(GPU_ONLY_PREFIX):
            gpu.add(line[len(GPU_ONLY_PREFIX):].strip())
        else:
            interp.add(line)
    if not interp:
        raise ValueError(f"case set 'smoke': {p} lists no case ids; regenerate it with `{SMOKE_REGENERATE}`.")
    return frozenset(interp), frozenset(gpu)


def smoke_ids() -> frozenset[str]:
    """The interpreter-profile ids of the smoke set (fixtures/smoke_set.txt, written by the
    mutation tool from the kill map and the axis table; checked by suites/selftest/test_mutants.py).
    A missing or empty file is an error, never a silent stand-in."""
    return _smoke_lines()[0]


def _smoke(profile: str) -> list[Case]:
    interp_ids, gpu_only = _smoke_lines()
    interp = _parity_entries("interpreter")
    stale = interp_ids - {c.id for _, c in interp}
    if stale:
        raise ValueError(f"case set 'smoke': {SMOKE_FILE} names {len(stale)} case(s) not in the interpreter parity "
                         f"set (e.g. {sorted(stale)[0]}); regenerate it with `{SMOKE_REGENERATE}`.")
    if profile == "interpreter":
        return [c for _, c in interp if c.id in interp_ids]
    # Other profiles: the same recipes (pairwise recipe or regression case), sized for the
    # profile, plus the cases that exist only there (the GPU's 2^31-element pools).
    keys = {k for k, c in interp if c.id in interp_ids}
    own = _parity_entries(profile)
    unknown = gpu_only - {c.id for _, c in own}
    if unknown:
        raise ValueError(f"case set 'smoke': {SMOKE_FILE} names {len(unknown)} {profile}-profile case(s) not in its "
                         f"parity set (e.g. {sorted(unknown)[0]}); regenerate it with `{SMOKE_REGENERATE}`.")
    return [c for k, c in own if k in keys or c.id in gpu_only]


def set_names() -> tuple[str, ...]:
    return SET_NAMES


def build_set(name: str, profile: str) -> list[Case]:
    if profile not in PROFILES:
        raise ValueError(f"case profile: expected one of {PROFILES}, got {profile!r}")
    if name.startswith(TRACE_PREFIX):
        from . import trace
        return trace.load_cases(name[len(TRACE_PREFIX):])
    if name not in SET_NAMES:
        raise ValueError(f"unknown case set {name!r}; expected one of {', '.join(SET_NAMES)}, "
                         f"or {TRACE_PREFIX}PATH (a FlashInfer-Trace workload file)")
    if name == "fuzz":
        return []  # drawn by suites/parity/test_fuzz.py
    parity = [c for _, c in _parity_entries(profile)]
    if name == "parity":
        return parity
    if name == "full":
        return [c for _, c in _dedupe([("", c) for c in parity + product_grid(profile)])]
    return _smoke(profile)


if __name__ == "__main__":
    import argparse
    ap = argparse.ArgumentParser(prog="python -m decode_conformance.case_sets", description="The parity set's shipped data.")
    ap.add_argument("--write-pairwise", action="store_true",
                    help=f"generate the pairwise covering rows and write them to the shipped {PAIRWISE_FILE}")
    args = ap.parse_args()
    from ._paths import alias_checkout
    alias_checkout()  # this checkout's data folder, not an editable install's of another checkout
    if args.write_pairwise:
        print(f"wrote {write_pairwise_rows()}")
