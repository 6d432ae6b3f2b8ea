"""Finding, compiling and caching the CUDA sources of ``cuda_src/``.

Each ``.cu`` file is one operation family, and each has its launcher module in this package
(``pack.cu`` -> ``_pack.py``, ...). The table :data:`INSTANCES` lists every template
instantiation the launchers use; :func:`module` compiles a file's instances with
``cupy.RawModule(name_expressions=...)`` once per process (CuPy also keeps a disk cache keyed
on the source text and options), and ``scripts/compile_kernels.py`` compiles the same table
with nvcc in CI.

The sources of :data:`ARCH_SOURCES` use instructions of one architecture only (wgmma:
``sm_90a``). CuPy's RawModule passes an ``-arch`` of its own, so they are compiled with
NVRTC directly for their ``-arch``, once per process and device, and only on a device of that
compute capability (:func:`arch_supported`).
"""

import contextlib
import ctypes
import functools
import importlib.resources
import os
import pathlib

import numpy as np

from .._dtypes import SUPPORTED_DTYPES, bfloat16

HEADER = "twell_layout.cuh"

#: C++ type of each value dtype.
CTYPES = {
    np.dtype(np.float64): "double",
    np.dtype(np.float32): "float",
    np.dtype(np.float16): "__half",
    bfloat16: "__nv_bfloat16",
}


def vector_width(dtype):
    """Values per 16-byte vector."""
    return 16 // np.dtype(dtype).itemsize


def _vectored(kernel):
    """Instances with VEC = 1 and one 16-byte vector, for every dtype."""
    return [f"{kernel}<{CTYPES[d]}, {v}>" for d in SUPPORTED_DTYPES for v in (1, vector_width(d))]


def _typed(kernel):
    return [f"{kernel}<{CTYPES[d]}>" for d in SUPPORTED_DTYPES]


def listed(instance):
    """The instance of a gather kernel that walks the tile index (template argument
    ``Listed = true``, ``TwELLMatrix.index_tiles``)."""
    return f"{instance[:-1]}, true>"


#: (row, tile) pairs per warp of the dense pack kernel when a tile fits in one warp-wide
#: vector load (tile_width <= 32 * VEC); wider tiles take one pair per warp, or the staged
#: shapes below.
PACK_PAIRS = 4

#: (PAIRS, CHUNKS) of the staged pack kernel ``twell_pack_dense<T, VEC, PAIRS, CHUNKS>`` by
#: the number of warp-wide vector loads a tile needs (2 or 4: float32 and float64 at tile
#: width 256, 16-bit values at 512-1024); PAIRS * CHUNKS = 4 loads in flight per warp. It
#: packs faster than one pair per warp looping over the tile (docs/design.rst, the pack).
PACK_STAGED_SHAPES = {2: (2, 2), 4: (1, 4)}


def _pack_dense():
    """``twell_pack_dense<T, VEC, PAIRS[, CHUNKS]>``: every vector width, PACK_PAIRS pairs or
    one (tiles wider than 4 vector loads), and PACK_STAGED_SHAPES."""
    return ([f"twell_pack_dense<{CTYPES[d]}, {v}, {p}>" for d in SUPPORTED_DTYPES
             for v in (1, vector_width(d)) for p in (1, PACK_PAIRS)]
            + [f"twell_pack_dense<{CTYPES[d]}, {v}, {p}, {c}>" for d in SUPPORTED_DTYPES
               for v in (1, vector_width(d)) for p, c in PACK_STAGED_SHAPES.values()])


#: The 16-bit value dtypes (the fused GEMM and the bit-level NaN/Inf search take these).
HALF_DTYPES = (np.dtype(np.float16), bfloat16)

#: (G, C, E) of the gather SpMM ``twell_spmm_rows``: lanes per row, column chunks per lane,
#: entries in flight per lane (C * E = 4), widest first; ``_policy.rows_shape`` picks one
#: from N and the layout.
SPMM_ROWS_SHAPES = ((32, 4, 1), (32, 2, 2), (32, 1, 4), (16, 4, 1), (16, 1, 4), (8, 4, 1),
                    (8, 2, 2), (8, 1, 4))

#: Lanes per row of the SpMV, narrowest first (``_policy.spmv_lanes``): 1 is
#: ``twell_spmv_thread_rows`` (a thread per row), the others ``twell_spmv_rows`` (a team).
SPMV_LANES = (1, 32)

#: (G lanes per row, entries a lane reads at once) of ``twell_spmv_one_tile``, the one-tile
#: SpMV of rows with room for few entries: a thread per row reading 8 entries at once.
#: Other rows take ``twell_spmv_one_tile_warp`` (:func:`._policy.one_tile_way`).
SPMV_ONE_TILE_THREAD = (1, 8)

#: Suffix of the module key of a source's instances for tiles wider than 65536 columns, whose
#: columns within a tile are int (``indices`` int32); the narrow instances keep the default
#: ``Index = unsigned short``. Compiled apart, so that a process that never sees such a tile
#: never compiles them.
WIDE = ":wide"

#: Template arguments before ``Index`` of each kernel that reads or writes ``indices``, with
#: the defaults that a narrow name expression may leave out.
_BEFORE_INDEX = {"twell_pack_dense": (4, ("1",)), "twell_pack_csr": (1, ()),
                 "twell_unpack_dense": (2, ()), "twell_rows_to_csr": (1, ()),
                 "twell_spmm_rows": (6, ("false",)), "twell_spmv_rows": (2, ()),
                 "twell_spmv_thread_rows": (2, ("false",)), "twell_spmv_one_tile": (4, ()),
                 "twell_spmv_one_tile_warp": (2, ())}


def wide(expression):
    """The instance of a narrow name expression for int columns within a tile:
    ``twell_spmv_thread_rows<float>`` -> ``twell_spmv_thread_rows<float, false, int>``."""
    name, _, rest = expression.partition("<")
    args = [a.strip() for a in rest[:-1].split(",")]
    count, defaults = _BEFORE_INDEX[name]
    missing = count - len(args)
    args += list(defaults[len(defaults) - missing:]) if missing else []
    return f"{name}<{', '.join(args + ['int'])}>"


def source_file(key):
    """The ``.cu`` file of a module key of :data:`INSTANCES` (``spmm.cu:wide`` -> ``spmm.cu``)."""
    return key.partition(":")[0]


#: The instances of the gather kernels that walk the tile index (:func:`listed`).
_LISTED_INSTANCES = ([listed(k) for k in _vectored("twell_spmm_rows")
                      for k in [f"{k[:-1]}, {g}, {c}, {e}>" for g, c, e in SPMM_ROWS_SHAPES]]
                     + [listed(k) for k in _typed("twell_spmv_thread_rows")])

#: Every kernel instantiation, by source file.
INSTANCES = {
    "pack.cu": _pack_dense() + _vectored("twell_pack_dense_overflow") + _typed("twell_pack_csr"),
    "canonical.cu": _typed("twell_csr_sort_rows") + _typed("twell_csr_compact_rows"),
    "unpack.cu": (_vectored("twell_unpack_dense") + _typed("twell_scatter_csr")
                  + _typed("twell_rows_to_csr") + ["twell_layout_probe"]),
    "cast.cu": [f"twell_cast<{CTYPES[a]}, {CTYPES[b]}>" for a in SUPPORTED_DTYPES
                for b in SUPPORTED_DTYPES if a != b],
    "spmm.cu": ([f"{k[:-1]}, {g}, {c}, {e}>"
                 for k in _vectored("twell_spmm_rows") + _vectored("twell_spmm_overflow_chunks")
                 for g, c, e in SPMM_ROWS_SHAPES]
                + [f"{k[:-1]}, {g}>" for k in _typed("twell_spmv_rows") for g in SPMV_LANES[1:]]
                + _typed("twell_spmv_thread_rows")
                + [f"{k[:-1]}, {over}, {g}, {loads}>" for k in _typed("twell_spmv_one_tile")
                   for g, loads in (SPMV_ONE_TILE_THREAD,) for over in ("false", "true")]
                + [f"{k[:-1]}, {over}>" for k in _typed("twell_spmv_one_tile_warp")
                   for over in ("false", "true")]
                + _LISTED_INSTANCES),
    "reduce.cu": (["twell_count_histogram", "twell_count_positive16",
                   "twell_exclusive_scan<int, true>",
                   "twell_exclusive_scan<int, false>", "twell_exclusive_scan<long long, false>"]
                  + [f"twell_find_nonfinite<{CTYPES[d]}, {v}>" for d in HALF_DTYPES
                     for v in (1, vector_width(d))]),
    "ffn.cu": ([f"twell_matmul_pack<{CTYPES[d]}>" for d in HALF_DTYPES]
               + _typed("twell_spill_to_overflow") + _vectored("twell_gated_up")
               + [f"twell_gated_take<{CTYPES[d]}>"
                  for d in (*HALF_DTYPES, np.dtype(np.float32))]
               + [f"twell_reslot<{CTYPES[d]}>" for d in HALF_DTYPES]
               + [f"twell_ffn_fixup<{CTYPES[d]}, {v}>" for d in HALF_DTYPES
                  for v in (1, vector_width(d))]),
    "matmul_pack_sm90.cu": ["twell_matmul_pack_sm90_bf16", "twell_matmul_pack_sm90_f16",
                            "twell_gated_pack_sm90_bf16", "twell_gated_pack_sm90_f16",
                            "twell_gated_dense_sm90_bf16", "twell_gated_dense_sm90_f16"],
}
#: The instances for wide tiles (:data:`WIDE`): those of the narrow table whose kernel reads or
#: writes ``indices``, but the dense pack's staged shapes (a wide tile takes one pair per warp)
#: and the tile index's (a row of wide tiles has few; the launchers walk its counts).
INSTANCES.update({
    f"{name}{WIDE}": [wide(e) for e in INSTANCES[name]
                      if e.partition("<")[0] in _BEFORE_INDEX and e not in _LISTED_INSTANCES
                      and not (e.startswith("twell_pack_dense<") and not e.endswith(", 1>"))]
    for name in ("pack.cu", "unpack.cu", "spmm.cu")})

#: Sources for one architecture: name -> (NVRTC/nvcc ``-arch``, the device's compute
#: capability as CuPy writes it). Their kernels are ``extern "C"`` (no name expressions).
ARCH_SOURCES = {"matmul_pack_sm90.cu": ("sm_90a", "90")}

#: nvcc/NVRTC options shared by the loader and the CI compile. No flush-to-zero: subnormals
#: are values like any other (and non-zeros). But CuPy appends ``-ftz=true`` to the options of
#: every RawModule it compiles (:data:`CUPY_APPENDED`), and the last one wins: float32
#: arithmetic in those kernels flushes subnormal operands and results, so the kernels that
#: must keep them (the casts, the sums of the canonical form) keep them explicitly. The
#: ARCH_SOURCES, compiled by NVRTC directly (:func:`nvrtc_module`), take OPTIONS as they are.
OPTIONS = ("-std=c++17", "-ftz=false")

#: What CuPy's compile appends to a RawModule's options.
CUPY_APPENDED = ("-ftz=true",)

#: What CuPy's NVRTC compile appends besides (nvcc has no such option): functions without
#: ``__device__`` compile as device code. The ARCH_SOURCES do not get it, so an unannotated
#: function there (a generic lambda, say) is a host function that NVRTC refuses, though nvcc
#: compiles it; ``scripts/compile_kernels.py --nvrtc`` catches that on a CPU machine.
CUPY_NVRTC_APPENDED = ("--device-as-default-execution-space",)


def build_options(name):
    """The nvcc options that match how a module key of :data:`INSTANCES` is compiled at run
    time."""
    return OPTIONS if source_file(name) in ARCH_SOURCES else OPTIONS + CUPY_APPENDED


def nvrtc_options(name):
    """The NVRTC options a module key of :data:`INSTANCES` is compiled with at run time
    (without ``-arch`` and the include folders)."""
    own = source_file(name) in ARCH_SOURCES
    return build_options(name) + (() if own else CUPY_NVRTC_APPENDED)


def source_dir():
    """Folder holding the CUDA sources: inside the installed package, else the checkout's."""
    installed = importlib.resources.files("twell") / "cuda_src"
    if installed.is_dir():
        return pathlib.Path(str(installed))
    checkout = pathlib.Path(__file__).resolve().parents[2] / "cuda_src"
    if checkout.is_dir():
        return checkout
    raise FileNotFoundError(
        f"twell's CUDA sources are missing: looked in {installed} and {checkout}"
    )


def source_text(name):
    """Source of ``name`` with its ``cuda_src`` headers inlined and ``#line`` directives kept.

    CuPy's cache keys on the source text, not on included files, so every
    ``#include "X.cuh"`` of a header in ``cuda_src`` is pasted in (each header once, as
    its ``#pragma once`` asks); ``#line`` makes compiler messages name the real file and line.
    """
    folder = source_dir()
    out = []
    _inline(folder, name, out, set())
    return "\n".join(out) + "\n"


def _inline(folder, name, out, seen):
    for number, line in enumerate((folder / name).read_text().splitlines(), start=1):
        words = line.split()
        header = words[1].strip('"') if words[:1] == ["#include"] and len(words) == 2 else None
        if header is None or not (folder / header).is_file():
            out.append(line)
        elif header not in seen:
            seen.add(header)
            out.append(f'#line 1 "{header}"')
            _inline(folder, header, out, seen)
            out.append(f'#line {number + 1} "{name}"')


@functools.cache
def module(name):
    """The compiled ``cupy.RawModule`` of one key of :data:`INSTANCES`: a source file's
    instances, or its wide ones (compiled once per process)."""
    import cupy

    return cupy.RawModule(code=source_text(source_file(name)), options=OPTIONS,
                          name_expressions=INSTANCES[name])


def function(name, expression):
    """A kernel of ``name`` by its name expression, e.g. ``twell_spmv_rows<float, 32>``.

    A kernel of an :data:`ARCH_SOURCES` file comes as an :class:`ArchKernel`; asking for one
    on a device of another architecture is a RuntimeError.
    """
    if name in ARCH_SOURCES:
        import cupy

        return _arch_module(name, cupy.cuda.Device().id)[expression]
    return _function(name, expression)


@functools.cache
def _function(name, expression):
    """``module(name).get_function(expression)``, kept: CuPy makes a new RawKernel at each
    ``get_function``, which then looks its device's function up again at its first launch;
    a RawKernel serves every device itself."""
    return module(name).get_function(expression)


def arch_supported(name):
    """Whether the current device runs the kernels of ``ARCH_SOURCES[name]``."""
    import cupy

    return cupy.cuda.Device().compute_capability == ARCH_SOURCES[name][1]


class ArchKernel:
    """A ``cupy.cuda.function.Function`` with the ``max_dynamic_shared_size_bytes`` setter of
    ``cupy.RawKernel`` (which the launchers use; a bare Function takes no attributes)."""

    def __init__(self, function, module):
        self.function = function
        self.module = module  # a Module must outlive its functions

    def __call__(self, *args, **kwargs):
        return self.function(*args, **kwargs)

    def _set_shared(self, size):
        import cupy

        driver = cupy.cuda.driver
        attribute = getattr(driver, "CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES", 8)
        driver.funcSetAttribute(self.function.ptr, attribute, size)

    max_dynamic_shared_size_bytes = property(fset=_set_shared)

    def max_active_clusters(self, threads, shared_mem, cluster):
        """How many clusters of ``cluster`` blocks of ``threads`` threads and ``shared_mem``
        bytes of dynamic shared memory the device holds at once (the driver's
        ``cuOccupancyMaxActiveClusters``, for a kernel with compile-time cluster dimensions);
        None where the driver does not say. Set the shared-memory limit first."""
        return _max_active_clusters(self.function.ptr, threads, shared_mem, cluster)


class _LaunchConfig(ctypes.Structure):
    """The driver's CUlaunchConfig (cuda.h)."""

    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3),
                ("shared_mem", ctypes.c_uint), ("stream", ctypes.c_void_p),
                ("attrs", ctypes.c_void_p), ("num_attrs", ctypes.c_uint)]


def driver_entry(name, argtypes):
    """The CUDA driver's entry point ``name`` through ctypes (returning a CUresult), or None
    where the driver library or the entry point is missing. CuPy wraps neither of the two
    twell calls this way."""
    for library in ("libcuda.so.1", "nvcuda.dll"):
        with contextlib.suppress(OSError, AttributeError):
            fn = getattr(ctypes.CDLL(library), name)
            fn.argtypes = argtypes
            fn.restype = ctypes.c_int
            return fn
    return None


@functools.cache
def _occupancy_clusters():
    return driver_entry("cuOccupancyMaxActiveClusters",
                        [ctypes.POINTER(ctypes.c_int), ctypes.c_void_p,
                         ctypes.POINTER(_LaunchConfig)])


def _max_active_clusters(function, threads, shared_mem, cluster):
    query = _occupancy_clusters()
    if query is None:
        return None
    config = _LaunchConfig((cluster, 1, 1), (threads, 1, 1), shared_mem, None, None, 0)
    found = ctypes.c_int(0)
    if query(ctypes.byref(found), ctypes.c_void_p(function), ctypes.byref(config)) != 0:
        return None
    return found.value or None


@functools.cache
def _arch_module(name, device):
    """{kernel name: ArchKernel} of an ARCH_SOURCES file, built with NVRTC for its -arch and
    loaded on ``device`` (the current one)."""
    import cupy

    arch, capability = ARCH_SOURCES[name]
    found = cupy.cuda.Device(device).compute_capability
    if found != capability:
        raise RuntimeError(f"{name} holds {arch} kernels; device {device} has compute "
                           f"capability {found}, they need {capability}")
    loaded = nvrtc_module(source_text(name), name, arch)
    return {e: ArchKernel(loaded.get_function(e), loaded) for e in INSTANCES[name]}


def nvrtc_module(code, name, arch, options=()):
    """``code`` compiled by NVRTC for ``-arch=arch`` with twell's OPTIONS (and ``options``),
    loaded on the current device as a ``cupy.cuda.function.Module``. A compile error is a
    RuntimeError carrying NVRTC's log."""
    import cupy
    from cupy_backends.cuda.libs import nvrtc

    program = nvrtc.createProgram(code, name, [], [])
    try:
        nvrtc.compileProgram(program, [f"-arch={arch}", *OPTIONS, *options, *_nvrtc_includes()])
        cubin = nvrtc.getCUBIN(program)
    except nvrtc.NVRTCError as error:
        raise RuntimeError(f"NVRTC failed on {name}:\n{nvrtc.getProgramLog(program)}") from error
    finally:
        with contextlib.suppress(Exception):  # the program's memory only
            nvrtc.destroyProgram(program)
    loaded = cupy.cuda.function.Module()
    loaded.load(cubin)
    return loaded


def _nvrtc_includes():
    """-I options for the CUDA headers (NVRTC has no built-in ``cuda_bf16.h``): where CuPy
    finds them for its own RawModule (a private helper of CuPy 13.3-14.x, or CUDA's
    ``pathfinder`` that CuPy 15 uses), and the toolkit's include folder when there is one."""
    import cupy

    options = []
    with contextlib.suppress(Exception):
        options += list(cupy.cuda.compiler._get_extra_include_dir_opts())
    with contextlib.suppress(Exception):
        from cuda import pathfinder

        options.append(f"-I{pathfinder.find_nvidia_header_directory('cudart')}")
    cuda_path = cupy.cuda.get_cuda_path()
    if cuda_path and os.path.isdir(os.path.join(cuda_path, "include")):
        options.append(f"-I{os.path.join(cuda_path, 'include')}")
    return options
