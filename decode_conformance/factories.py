"""Build the tensors of a Case: paged KV caches with poisoned gaps, metadata views, queries.

Everything is drawn from `case.seed` with a generator on the target device, so the same
case id gives the same tensors on every run and on every xdist worker.

Poisoning (design principle 2): the whole pool starts as NaN - the null page 0, unused
pages, the unused tail of each request's last page, the gaps between contiguous requests -
and only the slots a request owns are written. fp8 caches store the fp8 NaN byte; under
Triton's interpreter that byte reads back as a large finite number (e4m3 -> +-480), which
still ruins any result that reads it.
"""
from __future__ import annotations

import math

import torch

from .batch import DecodeBatch, Workspace
from .cases import LIFT_STORED_K, Case

# Slots of NaN left between requests of a contiguous layout, so a read past a request's
# end lands on poison rather than on the next request's keys.
CONTIG_GAP = 3
# Unused (poisoned) pages in a paged pool beyond those the batch needs.
SPARE_PAGES = 3


def _generator(device: torch.device, seed: int) -> torch.Generator:
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    return g


def _randn(shape, gen, device, dtype=torch.float32) -> torch.Tensor:
    return torch.randn(shape, generator=gen, device=device, dtype=torch.float32).to(dtype)


def _paged_layout(case: Case, page_bytes: int, gen, device):
    """Shuffled, non-consecutive page ids per request (vectorized: batch 32 x 128k builds
    in milliseconds). Returns (pages per request, flat slot ids in token order, pool pages)."""
    P = case.page_size
    lens = torch.tensor(case.seq_lens, dtype=torch.int64, device=device)
    pages_needed = (lens + P - 1) // P
    used = int(pages_needed.sum())
    floor_page = 1  # page 0 is the null page
    if case.min_pool_bytes:
        floor_page = max(1, math.ceil(case.min_pool_bytes / page_bytes))
    # Twice the pages needed, so a random draw leaves holes between a request's pages.
    span = max(2 * used, used + SPARE_PAGES)
    pool_pages = floor_page + span + SPARE_PAGES
    pages = torch.randperm(span, generator=gen, device=device)[:used] + floor_page
    page_start = torch.cumsum(pages_needed, 0) - pages_needed
    req_of_page = torch.repeat_interleave(torch.arange(case.batch, device=device), pages_needed)
    pos_in_req = torch.arange(used, device=device) - page_start[req_of_page]
    token_pos = pos_in_req[:, None] * P + torch.arange(P, device=device)
    valid = token_pos < lens[req_of_page][:, None]
    slots = (pages[:, None] * P + torch.arange(P, device=device))[valid]
    return list(pages.split(pages_needed.tolist())), slots, pool_pages


def _contig_layout(case: Case, shift: int, device):
    """Each request's keys in one run of slots, CONTIG_GAP poisoned slots between runs."""
    lens = torch.tensor(case.seq_lens, dtype=torch.int64, device=device)
    starts = 1 + CONTIG_GAP + shift + torch.cumsum(lens + CONTIG_GAP, 0) - (lens + CONTIG_GAP)
    token_start = torch.cumsum(lens, 0) - lens
    req = torch.repeat_interleave(torch.arange(case.batch, device=device), lens)
    slots = torch.arange(int(lens.sum()), device=device) - token_start[req] + starts[req]
    pool = 1 + CONTIG_GAP + shift + int((lens + CONTIG_GAP).sum())
    return list(slots.split(case.seq_lens)), slots, pool


def _structured(case: Case, gen, device):
    """q, K, V for data 'structured' (float32, before storage rounding).

    Every key carries a factor c = a * (tau - 1/2) + eps (tau: its position in the request,
    eps ~ N(0, 0.8^2)). K holds c along a per-KV-head direction u and q holds b * u, so the
    score of a key is about c (temperature b * sm_scale, drawn per query head in [0.5, 1.5])
    plus noise of std ~0.7; V = mu + gamma * c * w + noise with a per-head mean mu. So a row's
    output is far from 0 at any length, its softmax weights span e^2 or so along the request,
    and dropping keys, rescaling scores or mixing up a split moves it measurably.
    MLA: V is K's first Dv columns; the score factor then rides on the rope columns."""
    B, Hq, Hkv, G, Dk, Dv = case.batch, case.num_q_heads, case.num_kv_heads, case.group, case.head_dim, case.v_head_dim
    lens = torch.tensor(case.seq_lens, dtype=torch.int64, device=device)
    n = int(lens.sum())
    req = torch.repeat_interleave(torch.arange(B, device=device), lens)
    pos = torch.arange(n, device=device) - (torch.cumsum(lens, 0) - lens)[req]
    tau = (pos.float() + 0.5) / lens[req].clamp_min(1).float()  # [n]
    c = 2.0 * (tau - 0.5)[:, None] + 0.8 * _randn((n, Hkv), gen, device)  # [n, Hkv]
    score_dims = slice(Dv, Dk) if case.mla else slice(0, Dk)
    width = Dk - Dv if case.mla else Dk
    u = _randn((Hkv, width), gen, device)
    u = u / u.norm(dim=-1, keepdim=True)
    temp = 0.5 + torch.rand((B, Hkv, G), generator=gen, device=device, dtype=torch.float32)  # b * sm_scale
    q = 0.5 * _randn((B, Hkv, G, Dk), gen, device)
    q[..., score_dims] += (temp / case.sm_scale)[..., None] * u[None, :, None, :]
    k = 0.5 * _randn((n, Hkv, Dk), gen, device)
    k[..., score_dims] += c[..., None] * u[None]
    mu = _randn((Hkv, Dv), gen, device)
    w = _randn((Hkv, Dv), gen, device)
    v = mu[None] + 1.5 * c[..., None] * w[None] + 0.5 * _randn((n, Hkv, Dv), gen, device)
    if case.mla:
        k[..., :Dv] = v
        v = None
    return q.reshape(B, Hq, Dk), k, v


# large-v: the largest stored V element, per storage type: 2^14 leaves fp16 room for the output
# (a weighted mean of V) while a few such keys summed unnormalized pass 65504; fp8 near the top
# of its range (e4m3 448, e5m2 57344), so v_scale multiplies large stored values.
LARGE_V_STORED = {"bf16": 2.0**14, "fp16": 2.0**14, "e4m3": 384.0, "e5m2": 2.0**15}


def _spike_rows(case: Case, device) -> torch.Tensor:
    """[B, Hq] bool: the late-spike rows, every other (request, head), so the rows between them
    keep structured scores under which every key matters."""
    b = torch.arange(case.batch, device=device)[:, None]
    h = torch.arange(case.num_q_heads, device=device)[None, :]
    return (b + h) % 2 == 0


def spike_positions(case: Case) -> list[list[int]]:
    """Per request, the positions of its spike keys: 3/4 and 7/8 into the visible range and its
    last key, so the max moves after many key tiles and inside a later split."""
    out = []
    for L in case.seq_lens:
        start = 0 if case.visible_keys is None else max(0, L - case.visible_keys)
        n = L - start
        out.append(sorted({start + 3 * n // 4, start + 7 * n // 8, L - 1}) if n else [])
    return out


def _lift(case: Case, q, k, device):
    """large-scores / late-spike, on structured q and K: the last K column (a rope column for
    MLA, never V) stored as exactly LIFT_STORED_K, against q's last column at case.q_lift, adds
    the kind's lift to the raw scores it reaches."""
    B, Hq, Dk, Dv = case.batch, case.num_q_heads, case.head_dim, case.v_head_dim
    k_col = LIFT_STORED_K * case.scales[0]
    if case.data == "large-scores":
        q[..., -1] = case.q_lift
        k[..., -1] = k_col
        return q, k
    spiked = _spike_rows(case, device)
    q[..., -1] = torch.where(spiked, case.q_lift, 0.0)
    if case.mla:  # spike scores must be equal: no V-column term on the spiked rows
        q[..., :Dv] = torch.where(spiked[..., None], 0.0, q[..., :Dv])
    k[..., -1] = 0.0
    starts = [0]
    for L in case.seq_lens:
        starts.append(starts[-1] + L)
    flat = [starts[b] + p for b, ps in enumerate(spike_positions(case)) for p in ps]
    if flat:
        idx = torch.tensor(flat, dtype=torch.long, device=device)
        # Every spike key is the same key outside V, so the spiked rows' spike scores are equal
        # in any precision and their output is the mean of the spike keys' V: a budget as tight
        # as a structured row's, though the other keys weigh e^-30 or less there.
        k[idx, :, (Dv if case.mla else 0):] = 0.0
        k[idx, :, -1] = k_col
    return q, k


def _large_v(case: Case, q, k, v):
    """large-v, on structured q, K, V: V scaled so its largest stored element is
    LARGE_V_STORED of the cache type. MLA: V is K's first columns, so q's are zeroed there and
    the scores keep their rope-column part (zero is exact in every type, where a q scaled down
    by thousands would sink into fp8's subnormals under the fp8-q-and-p tier)."""
    Dv = case.v_head_dim
    vals = k[..., :Dv] if case.mla else v
    if vals.numel() == 0:
        return q, k, v
    stored_scale = case.scales[0] if case.mla else case.scales[1]
    m = LARGE_V_STORED[case.kv_dtype] * stored_scale / float(vals.abs().max())
    if case.mla:
        k[..., :Dv] *= m
        q[..., :Dv] = 0.0
    else:
        v = v * m
    return q, k, v


def _values(case: Case, n_tokens: int, gen, device):
    """Real-valued q, K, V before storage rounding (float32)."""
    B, Hq, Hkv, Dk, Dv = case.batch, case.num_q_heads, case.num_kv_heads, case.head_dim, case.v_head_dim
    if case.data == "structured":
        return _structured(case, gen, device)
    if case.data in ("large-scores", "late-spike"):
        q, k, v = _structured(case, gen, device)
        return (*_lift(case, q, k, device), v)
    if case.data == "large-v":
        return _large_v(case, *_structured(case, gen, device))
    k_width = Dk  # for MLA the V columns are the first Dv of K, so K alone is drawn
    q = _randn((B, Hq, Dk), gen, device)
    k = _randn((n_tokens, Hkv, k_width), gen, device)
    v = None if case.mla else _randn((n_tokens, Hkv, Dv), gen, device)
    if case.data == "low-scores":
        # Raw scores of -2e5 to -5e5 after scaling: below the finite -5e4 running-max start of
        # flashinfer #4267, and all equal, so the answer is exactly the mean of visible V. Equal
        # in fp32 too, whatever the kernel's arithmetic: one coordinate of q carries the score
        # (the others 0), so each key's score is one product, rounded the same way for every
        # key under any summation order or prescaled q. Spread over Dk coordinates, a kernel
        # that prescales q sums Dk rounded terms, in an order that can differ between keys
        # (tile tails), and at |s| ~ 5e5 one fp32 step (0.03) misweighs keys by several %.
        q = torch.zeros_like(q)
        q[..., -1] = min(5e5 / (64.0 * case.sm_scale), 6e4)
        k = torch.full_like(k, -64.0)
        if case.mla:  # V columns of K must still vary for the mean to be informative
            k[..., :Dv] = _randn((n_tokens, Hkv, Dv), gen, device)
    elif case.data == "zero-q":
        q = torch.zeros_like(q)
    elif case.data == "huge-scores":
        q = q * (200.0 * case.softcap)
    return q, k, v


def build(case: Case, device="cpu", seed: int | None = None) -> DecodeBatch:
    """Tensors and metadata for `case` on `device`, deterministic in (case, seed). The
    window is left unset: it is given in the kernel's convention (`runner.prepare`)."""
    device = torch.device(device)
    seed = case.seed if seed is None else seed
    gen = _generator(device, seed)
    q_dtype, cache_dtype = case.q_dtype, case.cache_dtype
    k_scale, v_scale = case.scales
    P, Hkv, Dk, Dv = case.page_size, case.num_kv_heads, case.head_dim, case.v_head_dim
    elem = torch.empty((), dtype=cache_dtype).element_size()

    if case.layout == "contig":
        shift = math.ceil(case.min_pool_bytes / (Hkv * Dk * elem)) if case.min_pool_bytes else 0
        page_lists, flat_slots, pool_pages = _contig_layout(case, shift, device)  # a slot is a page
    else:
        page_lists, flat_slots, pool_pages = _paged_layout(case, P * Hkv * Dk * elem, gen, device)

    n_tokens = case.total_keys
    q, k_real, v_real = _values(case, n_tokens, gen, device)

    # Pool: NaN everywhere, then the owned slots. Pools past 2^31 bytes (overflow cases)
    # only poison a margin around the used pages: filling gigabytes buys nothing.
    big = case.min_pool_bytes > 0

    def pool(shape):
        if big:
            return torch.empty(shape, dtype=cache_dtype, device=device)
        return torch.full(shape, float("nan"), dtype=cache_dtype, device=device)

    if case.combined_kv:  # one [pages, 2, P, Hkv, D] tensor: a page stride that is not P slots
        kv = pool((pool_pages, 2, P, Hkv, Dk))
        k_pool, v_pool = kv[:, 0], kv[:, 1]
    else:
        k_pool = pool((pool_pages, P, Hkv, Dk))
        if case.mla:
            v_pool = None
        elif case.inputs == "v-head-major":  # stored [pages, Hkv, P, Dv], handed over as the usual view
            v_pool = pool((pool_pages, Hkv, P, Dv)).permute(0, 2, 1, 3)
        else:
            v_pool = pool((pool_pages, P, Hkv, Dv))

    if big:
        lo = max(0, (int(flat_slots.min()) if n_tokens else 0) // P - 1)
        hi = min(pool_pages, (int(flat_slots.max()) if n_tokens else 0) // P + 2)
        for t in (k_pool, v_pool):
            if t is not None:
                t[lo:hi].fill_(float("nan"))
                t[0].fill_(float("nan"))
    k_stored = (k_real / k_scale).to(cache_dtype)
    page_of, off_of = flat_slots // P, flat_slots % P  # index pages, not a flattened copy
    k_pool[page_of, off_of] = k_stored
    if case.mla:
        v_pool_view = k_pool[..., :Dv]
    else:
        v_pool[page_of, off_of] = (v_real / v_scale).to(cache_dtype)
        v_pool_view = v_pool

    lens = torch.tensor(case.seq_lens, dtype=torch.int32, device=device)
    indptr = torch.zeros(case.batch + 1, dtype=torch.int32, device=device)
    indptr[1:] = torch.cumsum(lens, 0).to(torch.int32)
    max_pages = max(1, max(len(pl) for pl in page_lists))
    width = 2 * max_pages + 3 if case.inputs == "table-wide" else max_pages
    block_table = torch.zeros((case.batch, width), dtype=torch.int32, device=device)
    for b, pl in enumerate(page_lists):
        block_table[b, :len(pl)] = pl.to(torch.int32)

    sinks = _randn((case.num_q_heads,), gen, device) * 2.0 if case.sinks else None
    q = q.to(q_dtype).contiguous()
    if case.inputs == "q-strided":  # the q part of a fused qkv row; its K and V parts NaN
        B, Hq = case.batch, case.num_q_heads
        fused = torch.full((B, (Hq + 2 * Hkv) * Dk), float("nan"), dtype=q_dtype, device=device)
        fused[:, :Hq * Dk] = q.reshape(B, Hq * Dk)
        q = fused[:, :Hq * Dk].view(B, Hq, Dk)
    return DecodeBatch(
        q=q,
        k_cache=k_pool,
        v_cache=v_pool_view,
        kv_indptr=indptr,
        kv_indices=flat_slots.to(torch.int32),
        block_table=block_table,
        seq_lens=lens,
        sinks=sinks,
        out=torch.full((case.batch, case.num_q_heads, Dv), float("nan"), dtype=q_dtype, device=device),
        lse=torch.full((case.batch, case.num_q_heads), float("nan"), dtype=torch.float32, device=device),
        workspace=Workspace(device),
        seq_lens_host=tuple(case.seq_lens),
        page_size=P,
        sm_scale=case.sm_scale,
        k_scale=k_scale,
        v_scale=v_scale,
        softcap=float(case.softcap or 0.0),
        num_splits=case.num_splits,
    )


def transplant(src: DecodeBatch, src_b: int, dst: DecodeBatch, dst_b: int) -> None:
    """Make request dst_b of `dst` the same request as src_b of `src`, in place: its query and
    its keys and values (into dst_b's own slots), and the per-head sinks. The two batches must
    share heads, head dims, dtypes and the request's length."""
    src_len, dst_len = src.seq_lens_host[src_b], dst.seq_lens_host[dst_b]
    if src_len != dst_len:
        raise ValueError(f"transplant: request lengths differ ({src_len} vs {dst_len})")
    dst.q[dst_b].copy_(src.q[src_b])
    s_lo, d_lo = int(src.kv_indptr[src_b]), int(dst.kv_indptr[dst_b])
    s_slots = src.kv_indices[s_lo:s_lo + src_len].long()
    d_slots = dst.kv_indices[d_lo:d_lo + dst_len].long()
    dst.k_slots()[d_slots] = src.k_slots()[s_slots]
    if not dst.v_from_k:
        dst.v_slots()[d_slots] = src.v_slots()[s_slots]
    if src.sinks is not None:
        dst.sinks.copy_(src.sinks)
