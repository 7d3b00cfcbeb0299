"""The order a conformance run's tests are handed out in: the first test of each compiled kernel
variant early, the tests that reuse a variant after them.

A cold run on a GPU is mostly Triton compiling: the first test that needs a variant compiles it
(1-2 s on a 16-core host), every later one finds it in Triton's on-disk cache, which all xdist
workers share. In collection order (kernel by kernel) the last kernel's new variants come last,
so a few workers were still compiling while the others had run out of tests: on a fresh H100
(session 42, s42-3) eight workers had finished at 56.9 s and one compiled two Lean variants until
60.3 s. With each variant's first test early, the run ends on tests that only launch.

The variant is not known before the kernel's host code runs, so `compile_key` approximates it
from the case: every case field a shipped kernel turns into a compile-time choice (dtypes, head
dims and grouping, the MLA split, page size and layout, soft-cap, sinks, how the inputs are laid
out). A key that is too fine only moves a test forward; one that is too coarse leaves it where it
was. Nothing is skipped or repeated; only the order changes, the same in every process (xdist
requires each worker to collect the same order).
"""
from __future__ import annotations


def compile_key(kernel_name: str, case) -> tuple:
    """What the kernel probably compiles for this case (module docstring)."""
    return (kernel_name, case.kv_dtype, case.num_q_heads // max(1, case.num_kv_heads), case.num_kv_heads > 1,
            case.head_dim, case.v_head_dim, case.mla, case.combined_kv, case.layout, case.page_size,
            case.softcap is not None, case.sinks, case.inputs)


def variants_first(items: list, key) -> list:
    """`items` with each key's first item ahead of every repeat, otherwise in their given order;
    `key(item)` None leaves an item among the repeats' order, in its place relative to them."""
    seen, first, rest = set(), [], []
    for item in items:
        k = key(item)
        if k is not None and k not in seen:
            seen.add(k)
            first.append(item)
        else:
            rest.append(item)
    return first + rest
