"""CUDA-graph replay checks: capture a kernel once per batch size on buffers sized for the
longest request, then replay it with other lengths written into the same buffers.

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
                               lse=torch.full_like(batch.lse, float("nan")), workspace=Workspace(batch.device))


def load_scenario(cap: DecodeBatch, scenario: Case, seed: int) -> DecodeBatch:
    """Write `scenario`'s tensors into the captured buffers of `cap`, in place. Returns a
    DecodeBatch over cap's storage describing the scenario (for the reference)."""
    if scenario.batch != cap.case.batch:
        raise ValueError(f"scenario batch {scenario.batch} != captured batch {cap.case.batch}")
    if scenario.max_len > cap.case.max_len:
        raise ValueError(f"scenario length {scenario.max_len} > captured capacity {cap.case.max_len}")
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
    return dataclasses.replace(cap, case=scenario, kv_indices=cap.kv_indices[:s.kv_indices.numel()])
