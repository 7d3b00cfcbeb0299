"""torch.nn.functional.scaled_dot_product_attention as a decode kernel: the peer a user
compares against. It needs each request's keys contiguous, so the adapter gathers them
(outside the timed launch for contiguous layouts is not possible: gathering is part of
the call, as it would be for a paged cache)."""
from __future__ import annotations

import torch.nn.functional as F

from decode_conformance.kernel_api import Capabilities


class TorchSdpaKernel:
    name = "torch_sdpa"
    caps = Capabilities(deterministic=True, window_convention="counts-current", softcap=False, sinks=False, lse=False,
                        cuda_graph_safe=False)

    def plan(self, batch):
        dt = batch.q.dtype
        k_slots, v_slots = batch.k_slots(), batch.v_slots()
        lens = batch.seq_lens_host
        indptr = batch.kv_indptr.tolist()

        def launch():
            for b, L in enumerate(lens):
                start = 0 if batch.window is None else max(0, L - batch.window)
                if L - start <= 0:
                    batch.out[b].zero_()
                    continue
                slots = batch.kv_indices[indptr[b] + start: indptr[b] + L].long()
                k = (k_slots[slots].to(dt) * batch.k_scale).transpose(0, 1)  # [Hkv, n, Dk]
                v = (v_slots[slots].to(dt) * batch.v_scale).transpose(0, 1)
                q = batch.q[b][:, None, :]  # [Hq, 1, Dk]
                o = F.scaled_dot_product_attention(q, k, v, scale=batch.sm_scale, enable_gqa=True)
                batch.out[b] = o[:, 0].to(batch.out.dtype)
        return launch
