"""decode-conformance: a numerical-correctness and regression suite for decode attention."""
from .batch import DecodeBatch, Workspace
from .cases import Case
from .kernel_api import Capabilities, DecodeKernel

__all__ = ["Case", "DecodeBatch", "Workspace", "Capabilities", "DecodeKernel"]
