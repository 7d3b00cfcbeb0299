"""The Case record: one frozen, declarative description of a decode-attention problem.

A case says *what* to test; `factories.build` turns it into tensors. Everything a case
can vary is a field here, validated at construction so an impossible case never reaches
a kernel, and named in the id so `-k` can select it.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Optional

import torch

# id token -> (query/output dtype, KV cache dtype). fp8 caches pair with bf16 queries, as
# sglang and vLLM do; the kernel gets per-tensor k_scale/v_scale.
DTYPES: dict[str, tuple[torch.dtype, torch.dtype]] = {
    "bf16": (torch.bfloat16, torch.bfloat16),
    "fp16": (torch.float16, torch.float16),
    "e4m3": (torch.bfloat16, torch.float8_e4m3fn),
    "e5m2": (torch.bfloat16, torch.float8_e5m2),
}
FP8_TOKENS = frozenset({"e4m3", "e5m2"})

# Non-unit, unequal scales for fp8: a kernel that drops or swaps one is off by a factor
# (flashinfer #1023 lost k_scale/v_scale silently; output ~7.5x wrong).
FP8_SCALES = (0.4375, 1.6875)

LAYOUTS = ("contig", "paged")

# How the engine hands the tensors over, beyond their values. A serving engine rarely passes
# packed tensors: q is a slice of the fused qkv projection (sglang #7462, vllm-xpu-kernels #318
# fixed kernels that assumed a packed q), the page table is as wide as the longest request the
# engine allows (vLLM's block table), and a cache may be stored head-major behind the view the
# kernel is given (vllm-xpu-kernels #449 read V with K's strides). Each form changes one thing.
INPUT_FORMS = {
    "packed": "q, block_table and both caches packed as the batch needs them",
    "q-strided": "q [B, Hq, Dk] a view into a fused qkv row of (Hq + 2 Hkv) x Dk elements, its K and V "
                 "parts NaN: a kernel that assumes q.stride(0) == Hq x Dk reads NaN",
    "table-wide": "block_table 2 x max_pages + 3 columns wide (unused columns the null page): a kernel that "
                  "derives a row's offset from the lengths instead of block_table.stride(0) reads another "
                  "request's pages",
    "v-head-major": "V stored [pages, Hkv, P, Dv] behind the [pages, P, Hkv, Dv] view, K as usual: V's strides "
                    "are not K's",
}

# Gemma-2 27B scales scores by 1/sqrt(query_pre_attn_scalar = 144) at head dim 128: the case
# scale axis's "query-scalar" value is a case's own default times this ratio, so a kernel that
# computes the scale from the head dim instead of taking sm_scale is off by ~6 % in every score.
QUERY_SCALAR_RATIO = math.sqrt(128 / 144)

# How the inputs are drawn. Each names the property it provokes, and the bug class it is for.
DATA_KINDS = {
    "structured": "every key matters: scores and V share a per-key factor with a trend over the request, V has a "
                  "non-zero mean, so outputs do not average to ~0 and attention is neither uniform nor one-hot",
    "randn": "q, K, V ~ N(0, 1)",
    "low-scores": "q zero but one coordinate (up to 6e4), K = -64: every score between -2e5 and -5e5 and equal in "
                  "fp32 under any summation order, so the answer is the mean of V (flashinfer #4267 finite -5e4 "
                  "running max)",
    "zero-q": "q = 0: exact answer is the mean of the visible V rows (flashinfer #3716 padding lanes)",
    "huge-scores": "scores far above 88 x softcap (vLLM #56578 tanh overflow)",
    "large-scores": "structured, every raw score lifted by about +96 with no soft-cap needed: exp(s) overflows "
                    "float32 above 88.7, so a kernel that never subtracts the running max (or merges splits "
                    "with exp(lse) unshifted) gives inf/inf = NaN, while exp(s - max) stays finite",
    "late-spike": "structured, plus a few keys placed late in the visible range (at 3/4, 7/8 and the last) "
                  "scoring about +100 nats, more than 30 above the rest, on every other (request, head) row: the "
                  "running max jumps after many tiles and inside a later split. For kernels that fix their max "
                  "early (the first tile's, a preset one) or rescale a partial wrongly when it moves",
    "large-v": "structured with V scaled so its largest stored element is near the top of the storage type "
               "(2^14 for bf16/fp16, 384 x v_scale for e4m3, 2^15 x v_scale for e5m2): an output accumulator in "
               "fp16 overflows, a dropped or re-applied v_scale is off by a large absolute amount",
}
# Kinds whose every row needs every visible key (structured-based): the only ones long requests
# are built with in the case table, so dropping keys still moves a 128k-key row measurably.
# late-spike rows without a spike are structured; the spiked ones are there for the max.
KEYS_MATTER = frozenset({"structured", "large-scores", "late-spike", "large-v"})
# large-scores / late-spike: the raw score they add, in nats, carried by one coordinate of q
# (q_lift) against a K coordinate stored as exactly 16 (a power of two: exact in every cache
# type, under every k_scale).
LARGE_SCORE_LIFT = 96.0
SPIKE_LIFT = 100.0
LIFT_STORED_K = 16.0

# A window given as w keys either counts the current token (vLLM, sglang radius+1) or
# excludes it (FlashAttention left=w, flashinfer window_left=w attend w+1 keys).
WINDOW_CONVENTIONS = ("counts-current", "excludes-current")


def _check_convention(convention: str) -> None:
    if convention not in WINDOW_CONVENTIONS:
        raise ValueError(f"window convention: expected one of {WINDOW_CONVENTIONS}, got {convention!r}")


def visible_keys_of(window: Optional[int], convention: str) -> Optional[int]:
    """Keys a query sees under a window of `window` keys in `convention`, the current token
    included; None (no window) = all. The one conversion every caller uses: cases, the case
    generators and the dispatcher's gate must agree on it to the key."""
    if window is None:
        return None
    _check_convention(convention)
    return window if convention == "counts-current" else window + 1


def window_for(visible: Optional[int], convention: str) -> Optional[int]:
    """The window in `convention` under which a query sees `visible` keys (the inverse of
    visible_keys_of)."""
    if visible is None:
        return None
    _check_convention(convention)
    return visible if convention == "counts-current" else visible - 1


def _fail(field_name: str, expected: str, got) -> ValueError:
    return ValueError(f"Case.{field_name}: expected {expected}, got {got!r}")


@dataclass(frozen=True)
class Case:
    kv_dtype: str
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    seq_lens: tuple[int, ...]
    layout: str = "paged"
    page_size: int = 16
    v_head_dim: Optional[int] = None  # defaults to head_dim
    mla: bool = False  # MLA rope split: one latent KV head, V = first v_head_dim columns of K
    combined_kv: bool = False  # K and V pages interleaved in one tensor (flashinfer [pages, 2, P, H, D])
    window: Optional[int] = None
    window_convention: str = "counts-current"
    softcap: Optional[float] = None
    sinks: bool = False
    data: str = "structured"
    num_splits: Optional[int] = None  # a split count to force on kernels that accept one
    min_pool_bytes: int = 0  # size the KV pool so used pages sit past this byte offset
    seed: int = 0
    label: str = ""  # regression cases: short tag naming the upstream report
    # Softmax scale when it is not the head dim's (Gemma-2 27B: 1/sqrt(144) at head dim 128;
    # YaRN-scaled MLA); None: 1/sqrt(head_dim), or the MLA pre-absorption dim's.
    scale: Optional[float] = None
    # (k_scale, v_scale) of the cache; None: FP8_SCALES for fp8 caches, (1, 1) otherwise.
    kv_scales: Optional[tuple[float, float]] = None
    inputs: str = "packed"  # INPUT_FORMS: how the tensors are laid out when handed over
    note: str = field(default="", compare=False)  # why the case exists; shown on failure

    def __post_init__(self):
        if not isinstance(self.seq_lens, tuple):
            object.__setattr__(self, "seq_lens", tuple(self.seq_lens))
        if self.v_head_dim is None:
            object.__setattr__(self, "v_head_dim", self.head_dim)
        if self.kv_scales is not None and not isinstance(self.kv_scales, tuple):
            object.__setattr__(self, "kv_scales", tuple(self.kv_scales))
        self._validate()

    def _validate(self):
        if self.kv_dtype not in DTYPES:
            raise _fail("kv_dtype", f"one of {sorted(DTYPES)}", self.kv_dtype)
        if self.layout not in LAYOUTS:
            raise _fail("layout", f"one of {LAYOUTS}", self.layout)
        if not isinstance(self.page_size, int) or self.page_size < 1:
            raise _fail("page_size", "a positive int", self.page_size)
        if self.layout == "contig" and self.page_size != 1:
            raise _fail("page_size", "1 for layout 'contig' (contiguous slots)", self.page_size)
        for name in ("num_q_heads", "num_kv_heads", "head_dim", "v_head_dim"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise _fail(name, "a positive int", v)
        if self.num_q_heads % self.num_kv_heads:
            raise _fail("num_q_heads", f"a multiple of num_kv_heads={self.num_kv_heads}", self.num_q_heads)
        if self.mla:
            if self.num_kv_heads != 1:
                raise _fail("num_kv_heads", "1 for an MLA case (one latent KV head)", self.num_kv_heads)
            if self.v_head_dim >= self.head_dim:
                raise _fail("v_head_dim", f"< head_dim={self.head_dim} for MLA (rope part after the latent)",
                            self.v_head_dim)
        if self.inputs not in INPUT_FORMS:
            raise _fail("inputs", f"one of {sorted(INPUT_FORMS)}", self.inputs)
        if self.inputs == "v-head-major" and (self.mla or self.combined_kv):
            raise _fail("inputs", "'v-head-major' only where V is a tensor of its own (not MLA, not combined_kv)",
                        self.inputs)
        if self.combined_kv and (self.mla or self.v_head_dim != self.head_dim or self.layout != "paged"):
            raise _fail("combined_kv", "a paged, non-MLA case with v_head_dim == head_dim", self.combined_kv)
        if not self.seq_lens:
            raise _fail("seq_lens", "at least one request", self.seq_lens)
        if any((not isinstance(n, int)) or n < 0 for n in self.seq_lens):
            raise _fail("seq_lens", "non-negative ints", self.seq_lens)
        if self.window is not None and (not isinstance(self.window, int) or self.window <= 0):
            raise _fail("window", "None or a positive int", self.window)
        if self.window_convention not in WINDOW_CONVENTIONS:
            raise _fail("window_convention", f"one of {WINDOW_CONVENTIONS}", self.window_convention)
        if self.softcap is not None and not (self.softcap > 0 and math.isfinite(self.softcap)):
            raise _fail("softcap", "None or a finite float > 0", self.softcap)
        if self.data not in DATA_KINDS:
            raise _fail("data", f"one of {sorted(DATA_KINDS)}", self.data)
        if self.data == "huge-scores" and self.softcap is None:
            raise _fail("softcap", "a cap for data='huge-scores' (it tests the cap's overflow)", None)
        if self.num_splits is not None and self.num_splits < 1:
            raise _fail("num_splits", "None or >= 1", self.num_splits)
        if self.min_pool_bytes < 0:
            raise _fail("min_pool_bytes", ">= 0", self.min_pool_bytes)
        if self.scale is not None and not (isinstance(self.scale, (int, float)) and math.isfinite(self.scale)
                                           and self.scale > 0):
            raise _fail("scale", "None or a finite float > 0", self.scale)
        if self.kv_scales is not None and (len(self.kv_scales) != 2 or not all(
                isinstance(x, (int, float)) and math.isfinite(x) and x > 0 for x in self.kv_scales)):
            raise _fail("kv_scales", "None or (k_scale, v_scale), both finite floats > 0", self.kv_scales)
        if self.data in ("large-scores", "late-spike"):
            lift = self.q_lift
            q_max = torch.finfo(self.q_dtype).max
            if not lift <= q_max / 4:
                raise _fail("data", f"a kind whose lifted q coordinate ({lift:.3g} for sm_scale x k_scale = "
                            f"{self.sm_scale * self.scales[0]:.3g}) fits {self.q_dtype} with margin "
                            f"(<= {q_max / 4:.3g})", self.data)

    # ----- derived facts -------------------------------------------------------------
    @property
    def group(self) -> int:
        return self.num_q_heads // self.num_kv_heads

    @property
    def batch(self) -> int:
        return len(self.seq_lens)

    @property
    def rope_dim(self) -> int:
        return self.head_dim - self.v_head_dim if self.mla else 0

    @property
    def q_dtype(self) -> torch.dtype:
        return DTYPES[self.kv_dtype][0]

    @property
    def cache_dtype(self) -> torch.dtype:
        return DTYPES[self.kv_dtype][1]

    @property
    def is_fp8(self) -> bool:
        return self.kv_dtype in FP8_TOKENS

    @property
    def scales(self) -> tuple[float, float]:
        if self.kv_scales is not None:
            return (float(self.kv_scales[0]), float(self.kv_scales[1]))
        return FP8_SCALES if self.is_fp8 else (1.0, 1.0)

    @property
    def sm_scale(self) -> float:
        return self.default_scale if self.scale is None else float(self.scale)

    @property
    def default_scale(self) -> float:
        """The scale a case without `scale` uses: 1/sqrt of the head dim the model was trained at."""
        # MLA scales by the pre-absorption head dim (DeepSeek: 128 nope + 64 rope); the
        # 576/512 latent shape has rope 64, the 288/256 one rope 32 with nope 64.
        if self.mla:
            nope = 128 if self.rope_dim == 64 else 2 * self.rope_dim
            return 1.0 / math.sqrt(nope + self.rope_dim)
        return 1.0 / math.sqrt(self.head_dim)

    @property
    def q_lift(self) -> float:
        """large-scores / late-spike: the q coordinate that adds their raw score against K's 16."""
        lift = SPIKE_LIFT if self.data == "late-spike" else LARGE_SCORE_LIFT
        return lift / (LIFT_STORED_K * self.scales[0] * self.sm_scale)

    @property
    def visible_keys(self) -> Optional[int]:
        """Keys a query sees under the window, current token included; None = all."""
        return visible_keys_of(self.window, self.window_convention)

    def window_in(self, convention: str) -> Optional[int]:
        """This case's window expressed in a kernel's declared convention."""
        _check_convention(convention)
        return window_for(self.visible_keys, convention)

    @property
    def max_len(self) -> int:
        return max(self.seq_lens)

    @property
    def total_keys(self) -> int:
        return sum(self.seq_lens)

    # ----- identity -------------------------------------------------------------------
    @property
    def id(self) -> str:
        parts = [self.label] if self.label else []
        parts.append(self.kv_dtype)
        parts.append("contig" if self.layout == "contig" else f"paged{self.page_size}")
        if self.combined_kv:
            parts.append("kv2")
        parts.append(f"h{self.num_q_heads}g{self.group}")
        dims = f"d{self.head_dim}" + (f"v{self.v_head_dim}" if self.v_head_dim != self.head_dim else "")
        parts.append(dims)
        if self.mla:
            parts.append("mla")
        lens = ",".join(str(n) for n in self.seq_lens)
        if len(lens) > 40:  # keep ids readable for long batches; the seed pins the rest
            lens = f"{self.seq_lens[0]},...x{self.batch},max{self.max_len}"
        parts.append(f"B{self.batch}[{lens}]")
        if self.window is not None:
            parts.append(f"win{self.window}" + ("" if self.window_convention == "counts-current" else "x"))
        if self.softcap is not None:
            parts.append(f"softcap{self.softcap:g}")
        if self.sinks:
            parts.append("sinks")
        if self.data != "structured":
            parts.append(self.data)
        if self.num_splits is not None:
            parts.append(f"splits{self.num_splits}")
        if self.min_pool_bytes:
            parts.append(f"pool{self.min_pool_bytes >> 20}M")
        if self.scale is not None:
            parts.append(f"scale{self.scale:.6g}")
        if self.kv_scales is not None:
            parts.append(f"kvs{self.kv_scales[0]:.6g},{self.kv_scales[1]:.6g}")
        if self.inputs != "packed":
            parts.append(self.inputs)
        parts.append(f"s{self.seed}")
        return "-".join(parts)

    def replace(self, **changes) -> "Case":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["seq_lens"] = list(self.seq_lens)
        if self.kv_scales is not None:
            d["kv_scales"] = list(self.kv_scales)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Case":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"Case fields: unknown {sorted(unknown)}; expected a subset of {sorted(known)}")
        return cls(**d)
