"""Decode-attention kernels shipped with decode-conformance (import name
`decode_conformance_kernels`; the folder is `kernels/`)."""
