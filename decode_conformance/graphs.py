"""Replaying one launch on new data: the buffers a captured CUDA graph (or a second launch of
one plan) reads, refilled in place, and bitwise comparison of two results.

A captured graph fixes pointers and grid sizes. A kernel is graph-safe only if it reads
lengths from device memory at replay and leaves no state behind (counters reset, no stale
partials merged). The suite poisons outputs and float scratch before every replay.
"""
from __future__ import annotations

import dataclasses

import torch

from .batch import DecodeBatch, Workspace
from .cases import Case
from .factories import build


def capacity_case(template: Case, batch_size: int, max_len: int) -> Case:
    return template.replace(seq_lens=(max_len,) * batch_size, label="capacity")


def with_fresh_outputs(batch: DecodeBatch) -> DecodeBatch:
    """Same inputs, new poisoned out/lse and an empty workspace (for an eager twin call)."""
    return dataclasses.replace(batch, out=torch.full_like(batch.out, float("nan")),
                               lse=torch.full_like(batch.lse, float("nan")), workspace=Workspace(batch.device),
                               kernel_note="")


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


def bitwise_equal(a: DecodeBatch, b: DecodeBatch, lse: bool = True, rows=None) -> str:
    """'' when out (and lse) of a and b are bitwise identical (on `rows` of the batch, or all);
    else what differs."""
    oa, ob, la, lb = a.out, b.out, a.lse, b.lse
    if rows is not None:
        oa, ob, la, lb = oa[rows[0]], ob[rows[1]], la[rows[0]], lb[rows[1]]
    msgs = []
    if not torch.equal(_bits(oa), _bits(ob)):
        diff = (oa.double() - ob.double()).abs()
        msgs.append(f"output: {int((_bits(oa) != _bits(ob)).sum())} bytes differ, max |diff| "
                    f"{float(diff.nan_to_num(float('inf')).max()):.3g}")
    if lse and not torch.equal(_bits(la), _bits(lb)):
        msgs.append(f"LSE: max |diff| {float((la.double() - lb.double()).abs().nan_to_num(float('inf')).max()):.3g}")
    return "; ".join(msgs)


def load_scenario(cap: DecodeBatch, scenario: Case, seed: int) -> DecodeBatch:
    """Write `scenario`'s tensors into the captured buffers of `cap`, in place. Returns a
    DecodeBatch over cap's storage describing the scenario (for the reference)."""
    if len(scenario.seq_lens) != cap.batch_size:
        raise ValueError(f"scenario batch {len(scenario.seq_lens)} != captured batch {cap.batch_size}")
    if scenario.max_len > cap.max_seq_len:
        raise ValueError(f"scenario length {scenario.max_len} > captured capacity {cap.max_seq_len}")
    s = build(scenario, cap.device, seed)
    pages = s.k_cache.shape[0]
    if pages > cap.k_cache.shape[0]:
        raise ValueError("scenario pool larger than the captured pool")
    cap.q.copy_(s.q)
    cap.k_cache.fill_(float("nan"))
    cap.k_cache[:pages].copy_(s.k_cache)
    if not scenario.mla:
        cap.v_cache.fill_(float("nan"))
        cap.v_cache[:pages].copy_(s.v_cache)
    cap.seq_lens.copy_(s.seq_lens)
    cap.kv_indptr.copy_(s.kv_indptr)
    cap.kv_indices.fill_(0)
    cap.kv_indices[:s.kv_indices.numel()].copy_(s.kv_indices)
    cap.block_table.zero_()
    cap.block_table[:, :s.block_table.shape[1]].copy_(s.block_table)
    if s.sinks is not None and cap.sinks is not None:
        cap.sinks.copy_(s.sinks)
    return dataclasses.replace(cap, kv_indices=cap.kv_indices[:s.kv_indices.numel()], seq_lens_host=scenario.seq_lens)
