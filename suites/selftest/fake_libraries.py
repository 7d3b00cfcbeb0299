"""Pure-torch stand-ins for the libraries the adapters wrap, written from their documented
interfaces (flashinfer-python 0.7.2.post1, vllm 0.33.0, sglang 0.5.23): the same argument
names (keyword-only where the library has them keyword-only, so a renamed or invented
argument is a TypeError here), the same conventions (page-level indptr with last_page_len,
window_left excluding the current token, base-2 LSE; vLLM's window_size pair and descale
tensors; CSR slot indices and split-KV scratch), the same documented preconditions checked
(zeroed workspace, int32 metadata, group sizes the CUDA-core decode instantiates) and every
call recorded in `module.calls` (argument names, shapes, dtypes, devices, small values), so
the adapters' translation is checked on a CPU and API drift fails CI. They compute attention
in float64; they do not check the libraries themselves (that needs a GPU and the packages).
"""
from __future__ import annotations

import math
import sys
import types

import torch
from torch.utils._python_dispatch import TorchDispatchMode

CUDA_CORE_GROUPS = (1, 2, 3, 4, 6, 8, 16)  # DISPATCH_GQA_GROUP_SIZE, include/flashinfer/utils.cuh


def describe(v):
    """What a recorded argument was: tensors by shape, dtype, device (and values when small)."""
    if isinstance(v, torch.Tensor):
        d = {"shape": tuple(v.shape), "dtype": v.dtype, "device": v.device.type}
        if v.numel() <= 64:
            d["values"] = v.detach().cpu().tolist()
        return d
    if isinstance(v, (tuple, list)):
        return type(v)(describe(x) for x in v)
    return v


def _record(module, fn: str, **kwargs):
    module.calls.append({"fn": fn, "args": {k: describe(v) for k, v in kwargs.items()}})


def attention(q, k, v, sm_scale, cap, sinks=None):
    """q [H, D], k [n, H, D], v [n, H, Dv] (heads already expanded): (out [H, Dv], natural lse [H])."""
    s = torch.einsum("hd,nhd->hn", q.double(), k.double()) * sm_scale
    if cap:
        s = cap * torch.tanh(s / cap)
    if sinks is not None:
        s = torch.cat([s, sinks.double()[:, None]], dim=1)
    lse = torch.logsumexp(s, dim=1)
    p = torch.exp(s - lse[:, None])
    if sinks is not None:
        p = p[:, :-1]
    return torch.einsum("hn,nhd->hd", p, v.double()), lse


# ---- CUDA-graph capture rules ------------------------------------------------------------

# What a CUDA-graph capture refuses, as the aten ops a CPU run dispatches for it:
#   lift_fresh          a tensor made from host data (torch.tensor(...), `t[i] = 0`): a host->device copy
#   _local_scalar_dense a device value read on the host (.item(), int(t), bool(t)): a sync
#                       (.tolist() of a CPU tensor dispatches nothing: not caught here)
#   nonzero & co.       an output shape that depends on device values: a sync
CAPTURE_FORBIDDEN = {
    "aten.lift_fresh.default": "a tensor built from host data (a host->device copy)",
    "aten._local_scalar_dense.default": "a device value read on the host (.item()/int()/bool(): a sync)",
    "aten.nonzero.default": "an output shape that depends on device values (a sync)",
    "aten.masked_select.default": "an output shape that depends on device values (a sync)",
    "aten._unique2.default": "an output shape that depends on device values (a sync)",
}


class CaptureViolation(RuntimeError):
    pass


class FakeCapture(TorchDispatchMode):
    """Runs a launch under the rules of a CUDA-graph capture, on a CPU: any op in
    CAPTURE_FORBIDDEN raises CaptureViolation naming it. Ops issued from this file (the fake
    libraries' own bodies) are exempt: the real libraries' graph modes are theirs to make
    capturable; this checks the adapter's code around them."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        why = CAPTURE_FORBIDDEN.get(str(func))
        if why is not None and not _issued_by_a_fake():
            raise CaptureViolation(f"{func} inside a CUDA-graph capture: {why}")
        return func(*args, **(kwargs or {}))


def _issued_by_a_fake() -> bool:
    frame = sys._getframe(2)  # past __torch_dispatch__: the Python code that issued the op
    while frame is not None:
        if frame.f_code.co_filename == __file__:
            return True
        frame = frame.f_back
    return False


# ---- flashinfer ------------------------------------------------------------------------

def fake_flashinfer():
    m = types.ModuleType("flashinfer")
    m.calls = []
    m.__version__ = "0.7.2.post1"

    class BatchDecodeWithPagedKVCacheWrapper:
        def __init__(self, float_workspace_buffer, kv_layout="NHD", use_cuda_graph=False, use_tensor_cores=False,
                     paged_kv_indptr_buffer=None, paged_kv_indices_buffer=None,
                     paged_kv_last_page_len_buffer=None, backend="auto", jit_args=None):
            _record(m, "BatchDecodeWithPagedKVCacheWrapper", kv_layout=kv_layout, use_cuda_graph=use_cuda_graph,
                    use_tensor_cores=use_tensor_cores, paged_kv_indptr_buffer=paged_kv_indptr_buffer,
                    paged_kv_last_page_len_buffer=paged_kv_last_page_len_buffer)
            assert kv_layout == "NHD"
            assert float_workspace_buffer.dtype == torch.uint8
            assert not bool(float_workspace_buffer.any()), "float workspace must be initialized to 0 for its first use"
            if use_cuda_graph:
                for name, buf in (("paged_kv_indptr_buffer", paged_kv_indptr_buffer),
                                  ("paged_kv_indices_buffer", paged_kv_indices_buffer),
                                  ("paged_kv_last_page_len_buffer", paged_kv_last_page_len_buffer)):
                    if not torch.is_tensor(buf):
                        raise ValueError(f"{name} should be a torch.Tensor in cudagraph mode")
                if len(paged_kv_indptr_buffer) != len(paged_kv_last_page_len_buffer) + 1:
                    raise ValueError("The size of paged_kv_indptr_buffer should be batch_size + 1")
            self.graph = use_cuda_graph
            self.tc = use_tensor_cores
            self.bufs = (paged_kv_indptr_buffer, paged_kv_indices_buffer, paged_kv_last_page_len_buffer)

        def plan(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size, *,
                 pos_encoding_mode="NONE", window_left=-1, logits_soft_cap=None, q_data_type="float16",
                 kv_data_type=None, o_data_type=None, data_type=None, sm_scale=None, rope_scale=None,
                 rope_theta=None, non_blocking=True, block_tables=None, seq_lens=None, fixed_split_size=None,
                 disable_split_kv=False, q_len_per_req=1, is_causal=None, window_right=0):
            _record(m, "BatchDecodeWithPagedKVCacheWrapper.plan", indptr=indptr, indices=indices,
                    last_page_len=last_page_len, num_qo_heads=num_qo_heads, num_kv_heads=num_kv_heads,
                    head_dim=head_dim, page_size=page_size, pos_encoding_mode=pos_encoding_mode,
                    window_left=window_left, logits_soft_cap=logits_soft_cap, q_data_type=q_data_type,
                    kv_data_type=kv_data_type, sm_scale=sm_scale, disable_split_kv=disable_split_kv)
            assert indptr.dtype == indices.dtype == last_page_len.dtype == torch.int32
            group = num_qo_heads // num_kv_heads
            if not self.tc and group not in CUDA_CORE_GROUPS:
                raise RuntimeError(f"Unsupported group_size: {group}")
            last = last_page_len.cpu()
            assert bool(((last >= 1) & (last <= page_size)).all()), "kv_last_page_len must be in 1..page_size"
            if self.graph:
                ib, xb, lb = self.bufs
                if len(last_page_len) != len(lb):
                    raise ValueError("The batch size should be fixed in cudagraph mode")
                ib.copy_(indptr)
                lb.copy_(last_page_len)
                xb[:len(indices)].copy_(indices)
            else:
                self.bufs = (indptr.clone(), indices.clone(), last_page_len.clone())
            self.p = dict(hq=num_qo_heads, hkv=num_kv_heads, P=page_size, window_left=window_left,
                          cap=logits_soft_cap or 0.0, kv_dtype=kv_data_type,
                          sm_scale=sm_scale if sm_scale is not None else 1 / math.sqrt(head_dim))

        def run(self, q, paged_kv_cache, *args, q_scale=None, k_scale=None, v_scale=None, out=None, lse=None,
                return_lse=False, enable_pdl=None, window_left=None, sinks=None, q_len_per_req=None,
                skip_softmax_threshold_scale_factor=None, kv_cache_sf=None):
            _record(m, "BatchDecodeWithPagedKVCacheWrapper.run", q=q, k_scale=k_scale, v_scale=v_scale, out=out,
                    lse=lse, return_lse=return_lse, sinks=sinks)
            p = self.p
            k_cache, v_cache = paged_kv_cache
            assert k_cache.dtype == p["kv_dtype"] and k_cache.shape[1] == p["P"]
            if not self.tc and k_cache.stride() != v_cache.stride():  # csrc/batch_decode.cu checks it
                i = next(i for i, (a, b) in enumerate(zip(k_cache.stride(), v_cache.stride())) if a != b)
                raise RuntimeError(f"Check failed: k_strides[i] == v_strides[i] ({k_cache.stride(i)} vs. "
                                   f"{v_cache.stride(i)}) : K/V strides differ at dim {i}")
            sm_scale = p["sm_scale"] * (k_scale if k_scale is not None else 1.0)
            indptr, indices, last = (t.tolist() for t in self.bufs)  # read at run time, as the kernel does
            out = torch.empty(q.shape[0], q.shape[1], v_cache.shape[-1], dtype=q.dtype) if out is None else out
            lse = torch.empty(q.shape[:2], dtype=torch.float32) if lse is None else lse
            group = p["hq"] // p["hkv"]
            for b in range(q.shape[0]):
                pages = indices[indptr[b]:indptr[b + 1]]
                n = (len(pages) - 1) * p["P"] + last[b] if pages else 0  # paged_kv_t::get_length
                k = k_cache[pages].flatten(0, 1)[:n]
                v = v_cache[pages].flatten(0, 1)[:n]
                if p["window_left"] >= 0:  # window_left keys before the current one, plus it
                    k, v = k[-(p["window_left"] + 1):], v[-(p["window_left"] + 1):]
                if k.shape[0] == 0:
                    out[b] = 0
                    lse[b] = float("-inf")
                    continue
                k = k.double().repeat_interleave(group, dim=1)
                v = v.double().repeat_interleave(group, dim=1) * (v_scale if v_scale is not None else 1.0)
                o, l_nat = attention(q[b], k, v, sm_scale, p["cap"])  # fa2 paths drop sinks
                out[b] = o.to(out.dtype)
                lse[b] = (l_nat / math.log(2.0)).float()  # flashinfer reports base 2
            return (out, lse) if return_lse else out

    class MLAPlanMetadata:
        def __init__(self, **fields):
            self.fields = fields

        @classmethod
        def csr(cls, qo_indptr, kv_indptr, kv_indices, kv_len_arr):
            return cls(qo_indptr=qo_indptr, kv_indptr=kv_indptr, kv_indices=kv_indices, kv_len_arr=kv_len_arr)

    class BatchMLAPagedAttentionWrapper:
        def __init__(self, float_workspace_buffer, use_cuda_graph=False, qo_indptr=None, kv_indptr=None,
                     kv_indices=None, kv_len_arr=None, backend="auto"):
            _record(m, "BatchMLAPagedAttentionWrapper", use_cuda_graph=use_cuda_graph, backend=backend)
            assert backend in ("auto", "fa2", "fa3", "cutlass", "cutile", "trtllm-gen", "xqa", "cute-dsl")
            assert not bool(float_workspace_buffer.any())

        def plan(self, qo_indptr=None, kv_indptr=None, kv_indices=None, kv_len_arr=None, num_heads=None,
                 head_dim_ckv=None, head_dim_kpe=None, page_size=None, causal=None, sm_scale=None,
                 q_data_type=None, kv_data_type=None, use_profiler=False, *, metadata=None, cum_seq_lens_q=None,
                 block_tables=None, seq_lens=None, max_q_len=None, query_layout=None, kv_cache_layout=None,
                 lse_mode="none", output_dtype=None, output_scale="none", scale_mode="default",
                 skip_softmax=False, enable_pdl=None, use_sinks=False):
            assert isinstance(metadata, MLAPlanMetadata), "the canonical metadata= form"
            _record(m, "BatchMLAPagedAttentionWrapper.plan", **metadata.fields, num_heads=num_heads,
                    head_dim_ckv=head_dim_ckv, head_dim_kpe=head_dim_kpe, page_size=page_size, causal=causal,
                    sm_scale=sm_scale, q_data_type=q_data_type, kv_data_type=kv_data_type,
                    query_layout=query_layout, kv_cache_layout=kv_cache_layout, lse_mode=lse_mode)
            assert lse_mode in ("none", "base2", "basee")
            self.p = dict(metadata.fields, ckv=head_dim_ckv, P=page_size, sm_scale=sm_scale, lse_mode=lse_mode)

        def run(self, q_nope=None, q_pe=None, ckv_cache=None, kpe_cache=None, out=None, lse=None,
                return_lse=False, profiler_buffer=None, kv_len=None, page_table=None, return_lse_base_on_e=False,
                o_scale=None, *, query=None, kv_cache=None, ckv_scale=None, ckv_scale_arr=None, kpe_scale=None,
                sinks=None, skip_softmax_threshold_scale_factor=None, bmm1_scale=None, bmm2_scale=None):
            _record(m, "BatchMLAPagedAttentionWrapper.run", query=query, kv_cache=kv_cache, out=out, lse=lse,
                    return_lse=return_lse, return_lse_base_on_e=return_lse_base_on_e)
            p = self.p
            # 0.7.2's planned-run contract (mla/_batch_mla/_contracts.py, validate_run_options): the
            # LSE mode a run asks for must be the one planned, else ValueError.
            asked = ("basee" if return_lse_base_on_e else "base2") if (
                return_lse or lse is not None or return_lse_base_on_e) else "none"
            if asked != p["lse_mode"]:
                raise ValueError(f"MLA planned run argument LSE mode mismatch: planned {p['lse_mode']!r}, got "
                                 f"{asked!r}; re-plan with the needed arguments.")
            indptr, indices, lens = (p[k].tolist() for k in ("kv_indptr", "kv_indices", "kv_len_arr"))
            for b in range(query.shape[0]):
                pages = indices[indptr[b]:indptr[b + 1]]
                kv = kv_cache[pages].flatten(0, 1)[:lens[b]]  # [n, 576]
                if kv.shape[0] == 0:
                    out[b] = 0
                    lse[b] = float("-inf")
                    continue
                H = query.shape[1]
                k = kv[:, None, :].expand(-1, H, -1)
                o, l_nat = attention(query[b], k, k[..., :p["ckv"]], p["sm_scale"], 0.0)
                out[b] = o.to(out.dtype)
                lse[b] = (l_nat if p["lse_mode"] == "basee" else l_nat / math.log(2.0)).float()
            return (out, lse) if return_lse else out

    m.BatchDecodeWithPagedKVCacheWrapper = BatchDecodeWithPagedKVCacheWrapper
    m.BatchMLAPagedAttentionWrapper = BatchMLAPagedAttentionWrapper
    m.mla = types.SimpleNamespace(MLAPlanMetadata=MLAPlanMetadata)
    return m


# ---- vLLM ------------------------------------------------------------------------------

def fake_vllm(module_name: str, with_3d: bool = True):
    """vllm's triton_unified_attention module: unified_attention, decode (one query per
    request) subset, computing what the kernel's mask keeps (query_pos - p < 1 + window_size[0])."""
    m = types.ModuleType(module_name)
    m.calls = []

    def unified_attention(q, k, v, out, cu_seqlens_q, max_seqlen_q, seqused_k, max_seqlen_k, softmax_scale,
                          causal, window_size, block_table, softcap, q_descale, k_descale, v_descale,
                          seq_threshold_3D=None, num_par_softmax_segments=None, softmax_segm_output=None,
                          softmax_segm_max=None, softmax_segm_expsum=None, alibi_slopes=None, output_scale=None,
                          qq_bias=None, sinks=None, mm_prefix_range=None, rswa_prefix_lens=None, rswa_window=None,
                          use_alibi_sqrt=False, kv_quant_mode=0, k_scale_cache=None, v_scale_cache=None,
                          chunk_lookback=-1, use_td=False, mm_prefix_clamp_sliding_window=False):
        use_3d = not (seq_threshold_3D is None or num_par_softmax_segments is None or softmax_segm_output is None
                      or softmax_segm_max is None or softmax_segm_expsum is None
                      or len(seqused_k) > seq_threshold_3D)
        _record(m, "unified_attention", q=q, k=k, v=v, cu_seqlens_q=cu_seqlens_q, max_seqlen_q=max_seqlen_q,
                seqused_k=seqused_k, softmax_scale=softmax_scale, causal=causal, window_size=window_size,
                block_table=block_table, softcap=softcap, q_descale=q_descale, k_descale=k_descale,
                v_descale=v_descale, sinks=sinks, kv_quant_mode=int(kv_quant_mode), use_3d=use_3d,
                softmax_segm_output=softmax_segm_output)
        assert max_seqlen_q == 1 and bool(causal)
        assert cu_seqlens_q.dtype == torch.int32 and seqused_k.dtype == torch.int32
        assert k_descale.dtype == torch.float32 and k_descale.numel() == 1
        P, Hkv = v.shape[1], k.shape[2]
        group = q.shape[1] // Hkv
        window = 1 + window_size[0] if window_size[0] >= 0 else 0
        fp8 = int(kv_quant_mode) == 1
        ks = float(k_descale[0]) if fp8 else 1.0
        vs = float(v_descale[0]) if fp8 else 1.0
        for b, L in enumerate(seqused_k.tolist()):
            pos = torch.arange(L)
            keep = pos[(L - 1 - pos) < window] if window else pos
            slots = block_table[b, keep // P].long() * P + keep % P
            kk = k.flatten(0, 1)[slots].double() * ks
            vv = v.flatten(0, 1)[slots].double() * vs
            if kk.shape[0] == 0 and sinks is None:
                out[b] = 0
                continue
            o, _ = attention(q[b], kk.repeat_interleave(group, 1), vv.repeat_interleave(group, 1),
                             softmax_scale, softcap, sinks)
            out[b] = o.to(out.dtype)

    m.unified_attention = unified_attention
    if not with_3d:  # a release before the forced-3D arguments
        def old(q, k, v, out, cu_seqlens_q, max_seqlen_q, seqused_k, max_seqlen_k, softmax_scale, causal,
                window_size, block_table, softcap, q_descale, k_descale, v_descale, alibi_slopes=None, sinks=None):
            unified_attention(q, k, v, out, cu_seqlens_q, max_seqlen_q, seqused_k, max_seqlen_k, softmax_scale,
                              causal, window_size, block_table, softcap, q_descale, k_descale, v_descale,
                              sinks=sinks, kv_quant_mode=int(k.dtype.itemsize == 1))  # fp8 told by the dtype
        m.unified_attention = old
    return m


# ---- sglang ----------------------------------------------------------------------------

MIN_BLOCK_KV = 32


def fake_decode_attention_fwd(q, k_buffer, v_buffer, o, kv_indptr, kv_indices, attn_logits, attn_lse,
                              num_kv_splits, max_kv_splits, sm_scale, k_scale, v_scale, logit_cap=0.0,
                              sinks=None, xai_temperature_len=-1, has_mla=False, use_pdl=False, page_size=1):
    """sglang's two-stage split-KV decode: stage 1 writes per-split partials into the
    caller's scratch, stage 2 merges the non-empty splits (and adds sinks)."""
    assert max_kv_splits == attn_logits.shape[2] and attn_logits.shape[-1] == v_buffer.shape[-1]
    # sglang's Triton backend allocates kv_indices int64 (triton_backend.py); the kernel's slot
    # offsets kv_loc * stride are computed in kv_indices' type, so int32 overflows past 2^31 elements.
    assert kv_indices.dtype == torch.int64, f"kv_indices: expected int64 (as sglang allocates it), got {kv_indices.dtype}"
    B, H = q.shape[:2]
    group = H // k_buffer.shape[1]
    indptr, splits = kv_indptr.tolist(), num_kv_splits.tolist()
    scale = sm_scale * k_scale
    for b in range(B):
        L = indptr[b + 1] - indptr[b]
        slots = kv_indices[indptr[b]:indptr[b + 1]].long()
        per = math.ceil(math.ceil(L / splits[b]) / MIN_BLOCK_KV) * MIN_BLOCK_KV if L else 0
        k_all = k_buffer[slots].double().repeat_interleave(group, dim=1)
        v_all = v_buffer[slots].double().repeat_interleave(group, dim=1)
        for i in range(splits[b]):  # stage 1
            lo, hi = i * per, min((i + 1) * per, L)
            if hi > lo:
                o_i, l_i = attention(q[b], k_all[lo:hi], v_all[lo:hi], scale, logit_cap)
                attn_logits[b, :, i] = o_i.float()
                attn_lse[b, :, i] = l_i.float()
        e_max = torch.full((H,), float("-inf"), dtype=torch.float64)
        e_sum = torch.zeros(H, dtype=torch.float64)
        acc = torch.zeros(H, v_buffer.shape[-1], dtype=torch.float64)
        for i in range(max_kv_splits):  # stage 2 reads only the non-empty splits
            lo, hi = i * per, min((i + 1) * per, L)
            if i < splits[b] and hi > lo:
                tl, tv = attn_lse[b, :, i].double(), attn_logits[b, :, i].double()
                n_max = torch.maximum(tl, e_max)
                old = torch.exp(e_max - n_max)
                w = torch.exp(tl - n_max)
                acc = acc * old[:, None] + w[:, None] * tv
                e_sum = e_sum * old + w
                e_max = n_max
        if sinks is not None:
            e_sum = e_sum + torch.exp(sinks.double() - e_max)
        o[b] = (acc / e_sum[:, None] * v_scale).to(o.dtype)


def fake_sglang(module_name: str):
    m = types.ModuleType(module_name)
    m.decode_attention_fwd = fake_decode_attention_fwd
    return m
