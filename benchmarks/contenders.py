"""The GPU suite's contenders beyond twell and CuPy: PyTorch (dense and torch.sparse, seeing
CuPy's memory through DLPack) and the reference TwELL kernels of SakanaAI/sparser-faster-llms.
"""

import importlib.util
import os
import pathlib
import sys
import time
import warnings

import numpy as np
from arrays import BF16, short_error

#: The reference packed layout: 256-column tiles, one count word and ``256 / C - 1`` entries.
REFERENCE_TILE_WIDTH = 256


def reference_capacity(compression):
    """Entries a (row, tile) of the reference packed layout holds at compression ``C``."""
    return REFERENCE_TILE_WIDTH // compression - 1


def load_torch(args):
    """PyTorch when importable (and, on the GPU, seeing the device); else None and why.

    The CPU dry run uses a CPU PyTorch too when one is importable, so that the interop
    (DLPack views, torch.sparse CSR) is exercised without a GPU.
    """
    if args.no_torch:
        return None, "disabled (--no-torch)"
    try:
        import torch
    except Exception as exc:  # noqa: BLE001 - torch is optional
        return None, short_error(exc)
    if not args.cpu_dry_run and not torch.cuda.is_available():
        return None, "torch sees no CUDA device"
    for text in ("Sparse CSR tensor support is in beta", "Sparse invariant checks"):
        warnings.filterwarnings("ignore", message=text, category=UserWarning)
    return torch, None


def to_torch(torch, x):
    """Zero-copy CuPy -> torch through DLPack (bfloat16 and uint32 through integer views)."""
    if x.dtype == BF16:
        return torch.from_dlpack(x.view(np.int16)).view(torch.bfloat16)
    if x.dtype == np.uint32:
        return torch.from_dlpack(x.view(np.int32)).view(torch.uint32)
    return torch.from_dlpack(x)


def torch_nbytes(*tensors):
    return sum(t.numel() * t.element_size() for t in tensors)


def from_torch(cp, torch, t, dtype=np.float32):
    """torch tensor -> CuPy array of ``dtype`` (float32/float64)."""
    tdt = torch.float64 if np.dtype(dtype) == np.float64 else torch.float32
    return cp.from_dlpack(t.to(tdt).contiguous())


class Reference:
    """The reference TwELL extension (SakanaAI/sparser-faster-llms), built as its own
    ``get_ext`` builds it.

    Loaded from ``DIR/twell.py`` under another module name (ours is ``twell``).
    """

    def __init__(self, folder, torch):
        path = pathlib.Path(folder).expanduser().resolve() / "twell.py"
        if not path.is_file():
            raise FileNotFoundError(f"--reference: no twell.py in {path.parent}")
        os.environ.setdefault("MAX_JOBS", str(min(16, os.cpu_count() or 1)))
        spec = importlib.util.spec_from_file_location("twell_reference", path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules["twell_reference"] = mod
        t = time.perf_counter()
        spec.loader.exec_module(mod)
        self.mod, self.torch = mod, torch
        self.cf_keyword = None
        self.ext = mod.get_ext(algorithms=["twell_mlp"])
        self.build_s = time.perf_counter() - t
        self.folder = str(path.parent)

    def d2t_out(self, x, w, packed, cf):
        """The reference's GEMM that writes its output in the packed layout, into ``packed``."""
        if self.cf_keyword is None:  # first call: does this copy take compression_factor?
            try:
                self.mod.matmul_sparse_out(x, w, packed, compression_factor=cf, ext=self.ext)
                self.cf_keyword = True
                return packed
            except TypeError:
                self.cf_keyword = False
        if self.cf_keyword:
            self.mod.matmul_sparse_out(x, w, packed, compression_factor=cf, ext=self.ext)
        elif cf == 8:  # an older copy: C = 8 only
            self.mod.matmul_sparse_out(x, w, packed, ext=self.ext)
        else:
            raise TypeError("this copy of the reference has no compression_factor (C = 8 only)")
        return packed

    def t2d_out(self, packed, down, out):
        """The reference's product of a packed matrix with a dense one, into ``out``."""
        self.mod.matmul_t2d_out(packed, down, out, ext=self.ext)
        return out

    def gated_t2d_out(self, x, packed, up, down, out):
        self.mod.matmul_gated_t2d_out(x, packed, up, down, out, ext=self.ext)
        return out

    @staticmethod
    def d2t_supports(m, n_model, k_hidden):
        ok = m % 256 == 0 and n_model % 64 == 0 and k_hidden % 256 == 0
        return ok, "" if ok else "the reference D2T needs M % 256, D % 64, H % 256 == 0"

    @staticmethod
    def t2d_supports(m, n_model, k_hidden):
        ok = m % 256 == 0 and n_model == 2048 and k_hidden in (5632, 8192)
        return ok, "" if ok else "the reference T2D is hard-wired to D = 2048, H in {5632, 8192}"
