"""Named case sets, built from axis tables. Data first, generators after.

How to add a case axis: add a field to `Case` (cases.py: validation + id token), teach
`factories.build` and `reference.reference` what it means, then add its values to the axis
table below; `parity` varies each axis one at a time around a base case (every value of
every axis meets every kernel), `full` takes the product of the main axes.

Two profiles size the cases: `interpreter` (CPU, Triton's interpreter: a few hundred keys
per request, still enough that every split of every split count is non-empty somewhere)
and `gpu` (native sizes up to 128k keys).
"""
from __future__ import annotations

import itertools
import zlib

from .cases import Case
from . import regressions

SET_NAMES = ("smoke", "parity", "full")
PROFILES = ("interpreter", "gpu")

# ---- axis tables -------------------------------------------------------------------
DTYPE_AXIS = ("bf16", "fp16", "e4m3", "e5m2")
LAYOUT_AXIS = (("contig", 1), ("paged", 1), ("paged", 16), ("paged", 64), ("paged", 256))
# (num_q_heads, num_kv_heads): MHA, GQA groups 2, 4, 5, 8, 16, MQA
HEADS_AXIS = ((4, 4), (8, 4), (8, 2), (10, 2), (16, 2), (16, 1), (4, 1))
HEAD_DIM_AXIS = (64, 80, 96, 128, 256)
MLA_AXIS = ((576, 512), (288, 256))  # (Lk, Lv): latent + rope
SOFTCAP_VALUES = (30.0,)

# Request lengths. Long next to short, 1-length rows, 0-length CUDA-graph padding rows.
BATCHES = {
    "interpreter": {
        "base": (300, 1, 77, 129),
        "ragged": (1, 513, 7, 0, 200),
        "padding": (0, 257, 0, 3),
        "single": (1000,),
        "long": (2049,),
    },
    "gpu": {
        "base": (4097, 1, 300, 32769),
        "ragged": (1, 32769, 7, 4096, 0, 131072),
        "padding": (0, 8191, 0, 3),
        "single": (131072,),
        "long": (65537, 131072, 1024, 7),
    },
}
# Windows chosen so the first visible key falls inside a page and inside a split.
WINDOWS = {"interpreter": (37, 100, 250), "gpu": (37, 1000, 4095)}

BASE = dict(kv_dtype="bf16", num_q_heads=8, num_kv_heads=2, head_dim=64, layout="paged", page_size=16)


def seeded(case: Case) -> Case:
    """Give a case a seed derived from its other fields: stable across runs and workers."""
    return case.replace(seed=zlib.crc32(case.replace(seed=0).id.encode()) & 0x7FFFFFFF)


def _base(profile: str, lens: str = "base", **kw) -> Case:
    fields = dict(BASE, seq_lens=BATCHES[profile][lens])
    fields.update(kw)
    return Case(**fields)


def _layout(layout_page):
    layout, page = layout_page
    return dict(layout=layout, page_size=page)


def one_axis_at_a_time(profile: str) -> list[Case]:
    cases = []
    for dt in DTYPE_AXIS:
        cases.append(_base(profile, kv_dtype=dt))
    for lp in LAYOUT_AXIS:
        for dt in ("bf16", "e4m3"):
            cases.append(_base(profile, kv_dtype=dt, **_layout(lp)))
    for lp in (("paged", 1), ("paged", 16)):  # K/V pages interleaved: page stride != P slots
        cases.append(_base(profile, combined_kv=True, **_layout(lp)))
        cases.append(_base(profile, "ragged", combined_kv=True, kv_dtype="e5m2", window=WINDOWS[profile][0],
                           **_layout(lp)))
    for hq, hkv in HEADS_AXIS:
        cases.append(_base(profile, num_q_heads=hq, num_kv_heads=hkv))
    for d in HEAD_DIM_AXIS:
        cases.append(_base(profile, head_dim=d, kv_dtype="fp16"))
    for (lk, lv), dt, lp in itertools.product(MLA_AXIS, ("bf16", "e4m3"), (("paged", 1), ("paged", 64))):
        cases.append(_base(profile, "ragged", num_q_heads=16, num_kv_heads=1, head_dim=lk, v_head_dim=lv,
                           mla=True, kv_dtype=dt, **_layout(lp)))
    for w in WINDOWS[profile]:
        for conv in ("counts-current", "excludes-current"):
            cases.append(_base(profile, window=w, window_convention=conv))
        cases.append(_base(profile, window=w, kv_dtype="e4m3", page_size=64))
    cases.append(_base(profile, "ragged", num_q_heads=16, num_kv_heads=1, head_dim=576, v_head_dim=512, mla=True,
                       window=WINDOWS[profile][1]))
    for lens in ("ragged", "padding", "single", "long"):
        cases.append(_base(profile, lens))
    for cap in SOFTCAP_VALUES:
        cases.append(_base(profile, softcap=cap))
        cases.append(_base(profile, softcap=cap, kv_dtype="fp16", window=WINDOWS[profile][0]))
    cases.append(_base(profile, sinks=True))
    cases.append(_base(profile, "padding", sinks=True, window=WINDOWS[profile][0]))
    cases.append(_base(profile, sinks=True, softcap=SOFTCAP_VALUES[0], kv_dtype="e5m2"))
    return cases


def product_grid(profile: str) -> list[Case]:
    cases = []
    for dt, lp, (hq, hkv), d in itertools.product(DTYPE_AXIS, LAYOUT_AXIS, HEADS_AXIS, (64, 128)):
        cases.append(_base(profile, "ragged", kv_dtype=dt, num_q_heads=hq, num_kv_heads=hkv, head_dim=d, **_layout(lp)))
    return cases


def _dedupe(cases: list[Case]) -> list[Case]:
    seen, out = set(), []
    for c in cases:
        c = seeded(c) if c.seed == 0 else c
        if c.id not in seen:
            seen.add(c.id)
            out.append(c)
    return out


SMOKE_FILE = "fixtures/smoke_set.txt"
SMOKE_REGENERATE = "python -m decode_conformance.mutation --jobs 2"


def smoke_ids() -> frozenset[str]:
    """The smoke set is stored as case ids of the interpreter parity set (fixtures/smoke_set.txt),
    derived from the mutation kill map and kept in sync by suites/selftest/test_mutants.py.
    A missing or empty file is an error, never a silent stand-in."""
    from pathlib import Path
    p = Path(__file__).resolve().parent.parent / SMOKE_FILE
    if not p.exists():
        raise FileNotFoundError(f"case set 'smoke': {p} is missing. It is derived from the mutation kill map; "
                                f"regenerate it with `{SMOKE_REGENERATE}` (CPU, about 15 minutes).")
    ids = frozenset(line.strip() for line in p.read_text().splitlines() if line.strip() and not line.startswith("#"))
    if not ids:
        raise ValueError(f"case set 'smoke': {p} lists no case ids; regenerate it with `{SMOKE_REGENERATE}`.")
    return ids


def _recipe(case: Case) -> Case:
    """A case with its profile-sized fields blanked: the same recipe gives the same key in
    both profiles."""
    return case.replace(seq_lens=(0,), window=None if case.window is None else 1, seed=0)


def _smoke(parity: list[Case], profile: str) -> list[Case]:
    wanted = smoke_ids()
    interp = parity if profile == "interpreter" else _dedupe(one_axis_at_a_time("interpreter")
                                                           + regressions.cases("interpreter"))
    positions = [i for i, c in enumerate(interp) if c.id in wanted]
    stale = wanted - {interp[i].id for i in positions}
    if stale:
        raise ValueError(f"case set 'smoke': {SMOKE_FILE} names {len(stale)} case(s) not in the interpreter parity "
                         f"set (e.g. {sorted(stale)[0]}); regenerate it with `{SMOKE_REGENERATE}`.")
    if profile == "interpreter":
        return [parity[i] for i in positions]
    # Other profiles: the same recipes (the parity sets are built by the same code, case for
    # case, with profile-sized lengths and windows).
    if [_recipe(c) for c in interp] != [_recipe(c) for c in parity]:
        raise ValueError(f"case set 'smoke': the {profile!r} parity set no longer lines up with the interpreter "
                         "one case for case, so the smoke ids cannot be carried over")
    return [parity[i] for i in positions]


def build_set(name: str, profile: str) -> list[Case]:
    if name not in SET_NAMES:
        raise ValueError(f"case set: expected one of {SET_NAMES}, got {name!r}")
    if profile not in PROFILES:
        raise ValueError(f"case profile: expected one of {PROFILES}, got {profile!r}")
    parity = _dedupe(one_axis_at_a_time(profile) + regressions.cases(profile))
    if name == "parity":
        return parity
    if name == "full":
        return _dedupe(parity + product_grid(profile))
    return _smoke(parity, profile)

