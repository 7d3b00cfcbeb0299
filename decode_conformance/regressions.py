"""Regression cases: one record per real decode-attention bug that shipped past another
project's tests (the list, in words: docs/regressions.md). Each names its upstream report, what went
wrong, and carries the cases that check the property which would have caught it. They
run in the default `parity` set for every kernel.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .cases import Case


@dataclass(frozen=True)
class Regression:
    label: str  # id prefix, e.g. "fi4267"
    reports: str
    what_went_wrong: str
    property_checked: str
    make: Callable[[str], list[Case]]  # profile -> cases

    def cases(self, profile: str) -> list[Case]:
        out = []
        for c in self.make(profile):
            out.append(c.replace(label=self.label, note=f"{self.reports}: {self.property_checked}"))
        return out


def _c(lens, **kw) -> Case:
    base = dict(kv_dtype="bf16", num_q_heads=8, num_kv_heads=2, head_dim=64, layout="paged", page_size=16)
    base.update(kw)
    return Case(seq_lens=tuple(lens), **base)


def _big(profile, small, large):
    return small if profile == "interpreter" else large


def _past_int32_elements() -> list[Case]:
    """GPU profile only: pools of 4.3 GB (bf16/fp16) per cache, whose used slots sit past
    element offset 2^31, so an int32 `slot * stride` wraps in every dtype (2^31 *bytes* is
    already enough for fp8). On the CPU these would need ~9 GB per case."""
    out = []
    for dt in ("bf16", "fp16", "e4m3", "e5m2"):
        elem = 1 if dt in ("e4m3", "e5m2") else 2
        for layout, page in (("contig", 1), ("paged", 16)):
            out.append(_c((70, 33), kv_dtype=dt, num_q_heads=4, num_kv_heads=1, head_dim=64, layout=layout,
                          page_size=page, min_pool_bytes=2**31 * elem + 2**20))
    return out


REGRESSIONS: list[Regression] = [
    Regression(
        "fi4267", "flashinfer #4267, #4450 (fix #4401), #4451, #4452",
        "running max started at a finite -5e4; scores near -5e5 gave zero output; -inf then gave NaN in "
        "fully masked rows and empty split chunks",
        "q=+c, K=-64 (scores ~ -5e5): output equals the mean of V exactly; with an empty row and empty splits",
        lambda p: [_c(_big(p, (300, 0, 33), (8193, 0, 33)), data="low-scores"),
                   _c(_big(p, (300, 0, 40), (8193, 0, 40)), data="low-scores", kv_dtype="e4m3", num_splits=8),
                   _c(_big(p, (129, 5), (4097, 5)), data="low-scores", num_q_heads=16, num_kv_heads=1,
                      head_dim=576, v_head_dim=512, mla=True)]),
    Regression(
        "fi4051", "flashinfer #4051",
        "merging two empty partial states (0, -inf) gave NaN in output and LSE",
        "merges with empty splits: lengths just above a split boundary, windows leaving trailing splits empty",
        lambda p: [_c((40, 225, 33, 257), num_splits=8),
                   _c(_big(p, (600, 300), (40000, 9000)), num_splits=8, window=_big(p, 45, 300)),
                   _c((10,), num_splits=4)]),  # sglang's old test: only one split ever ran
    Regression(
        "vllm47188", "vllm-project/vllm PR #47188",
        "stage 2 ignored the sliding window; trailing splits covered no tokens, their unwritten scratch was merged",
        "window much shorter than the context, NaN-poisoned scratch, several split counts; a window of"
        " several chunks (a kernel that finishes a one-chunk window without stage 2 merges only there)",
        lambda p: [_c(_big(p, (1000, 700), (60000, 33000)), window=_big(p, 50, 700), num_splits=s) for s in (2, 4, 8)]
        + [_c(_big(p, (1000,), (60000,)), window=_big(p, 50, 700), num_q_heads=16, num_kv_heads=1,
              head_dim=576, v_head_dim=512, mla=True, page_size=1)]
        + [_c(_big(p, (2000, 700), (60000, 33000)), window=_big(p, 300, 2000))]),
    Regression(
        "vllm47305", "vllm-project/vllm PR #47305",
        "kernels loaded the unwritten tail of the last partial page and relied on the score mask: 0 x NaN = NaN",
        "unused slots of the last page and unused pages hold NaN",
        lambda p: [_c((17, 31, 33, 1), page_size=16), _c((257, 3), page_size=256), _c((65, 127), page_size=64,
                                                                                      kv_dtype="e5m2")]),
    Regression(
        "fi2883", "flashinfer #2883; vllm-project/vllm PRs #37442, #57094",
        "CUDA-graph padding rows with seq_len 0 wrote NaN or stale data that later spread to real requests",
        "0-length rows output exact zeros and leave real rows unaffected",
        lambda p: [_c((0, 0, 300, 0)), _c((0, 200, 0), sinks=True), _c((0, 129), kv_dtype="e4m3", num_q_heads=16,
                                                                        num_kv_heads=1, head_dim=576,
                                                                        v_head_dim=512, mla=True)]),
    Regression(
        "fi1023", "flashinfer #1023 (fix #1254), #4979",
        "fp8 k_scale / v_scale silently dropped on one path; output ~7.5x wrong",
        "non-unit, unequal k and v scales on every fp8 path (contiguous, paged, MLA, window)",
        lambda p: [_c((300, 50), kv_dtype="e4m3", layout="contig", page_size=1),
                   _c((300, 50), kv_dtype="e5m2", window=37),
                   _c((300, 50), kv_dtype="e4m3", num_q_heads=16, num_kv_heads=1, head_dim=288, v_head_dim=256,
                      mla=True)]),
    Regression(
        "fi3716", "flashinfer #3716 (fix #3717)",
        "padding lanes of the last tile entered the softmax denominator when seq_len % tile != 0",
        "q = 0 (answer: mean of the valid V rows) at lengths tile-1 and tile+1 for tiles 16, 32, 64, 128",
        lambda p: [_c((15, 17, 31, 33), data="zero-q"), _c((63, 65, 127, 129), data="zero-q"),
                   _c((63, 65), data="zero-q", kv_dtype="fp16", num_q_heads=4, num_kv_heads=4, head_dim=80)]),
    Regression(
        "vllm56578", "vllm-project/vllm #56578 (fix PR #56579)",
        "soft-cap tanh built from exp(+-s/cap) overflowed to inf/inf = NaN once s/cap > ~88",
        "soft-cap with scores far above 88 x cap",
        lambda p: [_c((300, 7), softcap=1.0, data="huge-scores"), _c((300, 7), softcap=30.0, data="huge-scores",
                                                                     kv_dtype="fp16")]),
    Regression(
        "fi4347", "flashinfer #4347; ROCm/aiter #2996; pytorch/torchtitan #3235",
        "wrong results for page size > 128; MLA decode wrong for page size > 1; automatic splits + paged KV NaN",
        "page sizes 1, 16, 64, 256 on every feature, MLA included; automatic split counts over many lengths",
        lambda p: [_c((300, 513, 1), num_q_heads=16, num_kv_heads=1, head_dim=576, v_head_dim=512, mla=True,
                      page_size=ps) for ps in (16, 256)]
        + [_c((300, 513, 1), page_size=256, window=100, sinks=True),
           _c(tuple(range(1, _big(p, 700, 9000), _big(p, 97, 1291))), page_size=64)]),
    Regression(
        "fa2709", "Dao-AILab/flash-attention #2709; flashinfer MLA uint32 page index",
        "page index x stride overflowed 32 bits and wrapped to the wrong page",
        "a KV pool whose used pages sit past 2^31 bytes, and (GPU profile) past 2^31 *elements* in every "
        "dtype, contiguous and paged, K and V: offsets must be 64-bit",
        lambda p: [_c((70, 33), kv_dtype="e4m3", num_q_heads=4, num_kv_heads=1, head_dim=64, page_size=16,
                      min_pool_bytes=2**31 + 2**20)] + ([] if p == "interpreter" else _past_int32_elements())),
    Regression(
        "fi3864", "flashinfer #3864",
        "a sliding-window error confined to one (row, head): max error 1.8 at global cosine 0.93",
        "per-(request, head) max error; many heads so one bad row barely moves the cosine",
        lambda p: [_c((300, 77, 129, 5), num_q_heads=32, num_kv_heads=8, window=63)]),
    Regression(
        "winconv", "huggingface/transformers #39408; NVIDIA-NeMo/Megatron-Bridge #2656; lightseekorg/tokenspeed #578; "
                   "vllm-project/vllm-gaudi #1395",
        "libraries disagree whether a window of w counts the current token; w-1 or w+1 keys attended",
        "both conventions, windows starting inside a page and inside a split",
        lambda p: [_c((300, 129), window=w, window_convention=cv) for w in (1, 16, 17, 33)
                   for cv in ("counts-current", "excludes-current")]),
    Regression(
        "fi5107", "flashinfer #5107",
        "split partials rounded to the output dtype before the merge; error grows with split count",
        "the same long request at 8 and 128 splits, held to the same budget",
        # 8191 keys: all 128 splits non-empty (sglang rounds a split up to 32 keys, so 4200 keys
        # left 62 of 128 empty), the last one partial, merged by stage 2 in two 64-split tiles:
        # head dim 128, where a tile's 8192-element cap holds 64 splits (at 64 dims it holds
        # all 128, one round, and a merge that does not rescale across rounds would pass).
        # One KV head on the interpreter: the split count is the point, not the head count.
        lambda p: [_c(_big(p, (8191,), (131072,)), num_splits=s, head_dim=128,
                      **(dict(num_q_heads=4, num_kv_heads=1) if p == "interpreter" else {})) for s in (8, 128)]),
    Regression(
        "sinkmax", "sgl-project/sgl-kernel-xpu PR #235 (shipped, fixed there); caught in review: flashinfer "
                   "PR #5119 (fix d622391f), fla-org/flash-linear-attention PR #831",
        "the sink's exp taken against a max of the keys' scores alone: a sink far above every score (or a "
        "split whose keys are all masked) overflowed exp(sink - max) to inf, giving inf or NaN in the LSE, "
        "the output, or the split merge",
        "sinks with every score near -5e5 and no soft-cap (sink - max ~ 5e5): alone, split, beside an empty "
        "row, and under a window that leaves the leading splits without a key",
        lambda p: [_c(_big(p, (300, 0, 33), (8193, 0, 33)), data="low-scores", sinks=True),
                   _c(_big(p, (300, 0, 40), (8193, 0, 40)), data="low-scores", sinks=True, num_splits=8),
                   _c(_big(p, (600, 17), (40000, 17)), data="low-scores", sinks=True, num_splits=8,
                      window=_big(p, 45, 300))]),
]


def cases(profile: str) -> list[Case]:
    return [c for r in REGRESSIONS for c in r.cases(profile)]
