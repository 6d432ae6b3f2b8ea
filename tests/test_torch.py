"""twell._torch: PyTorch interop through DLPack, zero copy both ways, on the CPU and the GPU.

Oracles never go through twell's torch code: tensors are built by torch itself
(``torch.from_numpy``, ``.to(dtype)``, ``.to(device)``) and read back by torch itself
(``.cpu().numpy()``, bfloat16 and unsigned tensors through same-width signed views);
matrices are compared with the NumPy/CuPy path (``TwELLMatrix`` of the same values) and
with ``dense_from_parts``. Zero copy is checked on pointers: ``tensor.data_ptr()`` against
``arr.ctypes.data`` (NumPy) or ``arr.data.ptr`` (CuPy). The ``backend`` fixture pairs
NumPy with CPU tensors and CuPy with CUDA tensors.
"""


import numpy as np
import pytest
from helpers import (
    BF16,
    DTYPES,
    F16,
    F32,
    F64,
    MATMUL_RTOL,
    PART_NAMES,
    assert_dense_equal,
    assert_parts_equal,
    cast,
    dense_from_parts,
    rel_err,
    run_python,
)
from hypothesis import given
from strategies import cases, edge_examples

import twell

torch = pytest.importorskip(
    "torch",
    reason="PyTorch is not installed: twell's torch interop is optional, and these tests "
           "run where torch is (pip install torch)",
)

TORCH_DTYPES = {F64: torch.float64, F32: torch.float32, F16: torch.float16,
                BF16: torch.bfloat16}


# -- helpers ------------------------------------------------------------------------------

def device_of(backend):
    """The torch device that matches the backend: the CPU, or CuPy's current GPU."""
    if not backend.on_gpu:
        return torch.device("cpu")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    return torch.device("cuda", backend.xp.cuda.Device().id)


def tensor_of(x, device):
    """Host values -> a tensor built by torch alone, bit for bit.

    bfloat16 goes in as its int16 bits and torch views them as torch.bfloat16 (a torch
    conversion from float32 could flush subnormals on some CPUs).
    """
    x = np.array(x)  # a copy: the tensor owns its memory
    if x.dtype == BF16:
        return torch.from_numpy(x.view(np.int16)).view(torch.bfloat16).to(device)
    return torch.from_numpy(x).to(device)


def _signed_views():
    views = {torch.bfloat16: (torch.int16, BF16)}
    for bits in (16, 32, 64):
        unsigned = getattr(torch, f"uint{bits}", None)
        if unsigned is not None:
            views[unsigned] = (getattr(torch, f"int{bits}"), np.dtype(f"uint{bits}"))
    return views


def host(t):
    """A tensor's values as a NumPy array, read by torch itself."""
    t = t.detach()
    view = _signed_views().get(t.dtype)
    if view is not None:
        carrier, dtype = view
        return t.view(carrier).cpu().numpy().view(dtype)
    return t.cpu().numpy()


def ptr(a):
    """The address of an array's first element (NumPy or CuPy)."""
    return a.ctypes.data if isinstance(a, np.ndarray) else a.data.ptr


def to_host(a):
    return a if isinstance(a, np.ndarray) else a.get()


def assert_same_bits(got, want, what="array"):
    """Same dtype, shape and bit patterns (NaN payloads and signed zeros included)."""
    got, want = to_host(got), to_host(want)
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    if got.dtype != np.bool_:
        bits = np.dtype(f"u{got.dtype.itemsize}")
        got, want = got.view(bits), want.view(bits)
    np.testing.assert_array_equal(got, want, err_msg=what)


def sparse_matrix(rng, shape=(24, 600), density=0.05):
    """Float64 values in [0.25, 4) with both signs at about ``density``; rows 0 and 1 dense
    enough in tile 0 that a few slots overflow."""
    x = np.where(rng.random(shape) < density,
                 rng.uniform(0.25, 4.0, shape) * rng.choice([-1.0, 1.0], shape), 0.0)
    x[:2, :40] = rng.uniform(0.25, 4.0, (2, 40))
    return x


def sync(backend):
    """Writes through torch on its stream are seen by CuPy on its own: order them."""
    if backend.on_gpu:
        torch.cuda.synchronize()


# -- import without torch -----------------------------------------------------------------

def test_twell_does_not_import_torch():
    code = "import sys, twell\nassert 'torch' not in sys.modules\nprint('ok')\n"
    assert run_python(code) == "ok"


def test_without_torch_twell_works_and_the_torch_functions_say_why_not():
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import numpy as np, twell\n"
        "a = twell.TwELLMatrix(np.eye(3, 5))\n"
        "assert (a.toarray() == np.eye(3, 5)).all()\n"
        "for call in (lambda: twell.to_torch(a.toarray()), a.to_torch,\n"
        "             lambda: twell.from_torch(None), lambda: twell.from_torch_array(None),\n"
        "             lambda: twell.from_torch_parts((), (3, 5))):\n"
        "    try:\n"
        "        call()\n"
        "    except ImportError as e:\n"
        "        assert 'needs PyTorch' in str(e), e\n"
        "    else:\n"
        "        raise SystemExit('no ImportError')\n"
        "print('ok')\n"
    )
    assert run_python(code) == "ok"


# -- from_torch_array: tensor -> array --------------------------------------------------------

IMPORT_DTYPES = [
    (torch.float64, F64), (torch.float32, F32), (torch.float16, F16), (torch.bfloat16, BF16),
    (torch.int64, np.dtype(np.int64)), (torch.int32, np.dtype(np.int32)),
    (torch.int16, np.dtype(np.int16)), (torch.int8, np.dtype(np.int8)),
    (torch.uint8, np.dtype(np.uint8)), (torch.bool, np.dtype(np.bool_)),
]


@pytest.mark.parametrize(("tdtype", "dtype"), IMPORT_DTYPES, ids=[str(d) for d, _ in IMPORT_DTYPES])
def test_tensor_to_array_shares_memory(backend, tdtype, dtype):
    t = torch.arange(12, dtype=torch.float32).reshape(3, 4).to(tdtype).to(device_of(backend))
    x = twell.from_torch_array(t)
    assert backend.is_native(x)
    assert x.dtype == dtype and x.shape == (3, 4)
    assert ptr(x) == t.data_ptr()
    assert_same_bits(x, host(t))


@pytest.mark.parametrize("bits", [16, 32, 64])
def test_unsigned_tensors_arrive_unsigned(backend, bits):
    if getattr(torch, f"uint{bits}", None) is None:
        pytest.skip(f"this torch has no torch.uint{bits}")
    signed = torch.tensor([[0, 1, -1], [7, -2, 3]], dtype=getattr(torch, f"int{bits}"))
    t = signed.to(device_of(backend)).view(getattr(torch, f"uint{bits}"))
    x = twell.from_torch_array(t)
    assert x.dtype == np.dtype(f"uint{bits}") and ptr(x) == t.data_ptr()
    np.testing.assert_array_equal(to_host(x), host(signed).view(f"uint{bits}"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_non_contiguous_tensors_arrive_as_strided_views(backend, dtype):
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6).to(dtype).to(device_of(backend))
    for t in (base.T, base[:, ::2], base[1:3, 2:]):
        x = twell.from_torch_array(t)
        assert x.shape == tuple(t.shape)
        assert x.strides == tuple(s * t.element_size() for s in t.stride())
        assert ptr(x) == t.data_ptr()
        assert_same_bits(x, np.ascontiguousarray(host(t)))


@pytest.mark.parametrize("dtype", DTYPES)
def test_torch_operands_reach_twell_products(backend, dtype, rng):
    """A torch right-hand side (a weight) enters ``A @ B`` and the product leaves as a tensor."""
    x = cast(sparse_matrix(rng), dtype)
    a = twell.TwELLMatrix(backend.asarray(x), slots=3)
    w = tensor_of(cast(rng.uniform(-1, 1, (600, 7)), dtype), device_of(backend))
    y = twell.to_torch(a @ twell.from_torch_array(w))
    assert y.dtype == TORCH_DTYPES[dtype] and tuple(y.shape) == (24, 7)
    want = cast(x, np.float64) @ cast(host(w), np.float64)
    assert rel_err(host(y), want) <= MATMUL_RTOL[dtype]


def test_a_tensor_that_requires_grad_is_detached(backend):
    t = torch.ones(2, 3, device=device_of(backend), requires_grad=True)
    x = twell.from_torch_array(t)
    assert ptr(x) == t.data_ptr()
    assert t.requires_grad and t.grad is None


# -- from_torch: dense tensor -> TwELLMatrix ------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@given(case=cases(max_rows=16, max_cols=300))
@edge_examples(max_cols=300)
def test_from_torch_matches_the_array_path(backend, dtype, case):
    x = cast(case.dense, dtype)
    t = tensor_of(x, device_of(backend))
    before = host(t).copy()
    a = twell.from_torch(t, tile_width=case.tile_width, slots=case.slots)
    assert backend.is_native(a.counts)
    assert a.dtype == dtype and a.shape == x.shape and a.tile_width == case.tile_width
    a.validate()
    want = twell.TwELLMatrix(backend.asarray(x), tile_width=case.tile_width, slots=case.slots)
    assert_parts_equal(a, want)
    assert_dense_equal(dense_from_parts(a), cast(x, np.float64))
    assert_same_bits(host(t), before, "the tensor")  # read, not modified


VIEWS = {
    "transposed": (lambda t: t.T, lambda x: x.T),
    "column step": (lambda t: t[:, ::3], lambda x: x[:, ::3]),
    "row step": (lambda t: t[::2], lambda x: x[::2]),
    "offset block": (lambda t: t[3:, 100:], lambda x: x[3:, 100:]),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("view", VIEWS.values(), ids=VIEWS.keys())
def test_from_torch_reads_non_contiguous_tensors_like_arrays(backend, dtype, view, rng):
    """As for NumPy/CuPy input, a non-contiguous tensor is packed from a contiguous copy."""
    x = cast(sparse_matrix(rng), dtype)
    t = tensor_of(x, device_of(backend))
    tv, xv = view[0](t), view[1](x)
    assert not tv.is_contiguous()
    a = twell.from_torch(tv, tile_width=64, slots=3)
    want = twell.TwELLMatrix(backend.asarray(xv), tile_width=64, slots=3)
    assert_parts_equal(a, want)
    assert_dense_equal(dense_from_parts(a), cast(xv, np.float64))
    assert_same_bits(host(t), x, "the tensor")  # read, not modified


def test_from_torch_detaches_and_gradients_do_not_flow(backend, rng):
    x = sparse_matrix(rng).astype(np.float32)
    t = tensor_of(x, device_of(backend)).requires_grad_()
    a = twell.from_torch(t * 2)  # a non-leaf tensor in the autograd graph
    assert_dense_equal(dense_from_parts(a), 2 * x.astype(np.float64))
    assert t.grad is None


@pytest.mark.parametrize("tdtype", [torch.int32, torch.int64, torch.uint8, torch.bool], ids=str)
def test_integer_and_bool_tensors_become_float64_like_arrays(backend, tdtype, rng):
    x = (rng.random((5, 40)) < 0.2) * rng.integers(1, 50, (5, 40))
    t = torch.from_numpy(x).to(tdtype).to(device_of(backend))
    a = twell.from_torch(t, tile_width=16)
    want = twell.TwELLMatrix(backend.asarray(host(t)), tile_width=16)
    assert a.dtype == F64
    assert_parts_equal(a, want)


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_dtype_option_takes_torch_and_numpy_dtypes(backend, dtype, rng):
    x = sparse_matrix(rng).astype(np.float32)
    t = tensor_of(x, device_of(backend))
    a = twell.from_torch(t, dtype=TORCH_DTYPES[dtype], slots=4)
    b = twell.from_torch(t, dtype=dtype, slots=4)
    want = twell.TwELLMatrix(backend.asarray(x), dtype=dtype, slots=4)
    assert a.dtype == dtype
    assert_parts_equal(a, want)
    assert_parts_equal(b, want)


def test_a_bfloat16_tensor_packs_to_the_same_bits(backend, rng):
    """bfloat16 crosses as int16 bits: every value, subnormals and NaN included, survives."""
    bits = rng.integers(-(2**15), 2**15, (8, 300), dtype=np.int16)
    bits[rng.random(bits.shape) < 0.7] = 0
    bits[0, :4] = [0x0001, -0x7FFF, 0x7FC1, -0x8000]  # subnormals, a NaN payload, -0
    t = torch.from_numpy(bits).to(device_of(backend)).view(torch.bfloat16)
    a = twell.from_torch(t, slots=2)
    want = twell.TwELLMatrix(backend.asarray(bits.view(BF16)), slots=2)
    for name in PART_NAMES:
        assert_same_bits(getattr(a, name), getattr(want, name), name)


# -- from_torch: the errors are those of the array path --------------------------------------

def same_error(tensor_call, array_call):
    """Both calls raise the same exception type with the same message, ``tensor`` named ``x``."""
    with pytest.raises((TypeError, ValueError)) as from_tensor:
        tensor_call()
    with pytest.raises((TypeError, ValueError)) as from_array:
        array_call()
    assert from_tensor.type is from_array.type
    assert str(from_tensor.value).replace("tensor", "x") == str(from_array.value)
    return from_tensor


@pytest.mark.parametrize("shape", [(2, 3, 4), (5,), ()], ids=["3-D", "1-D", "0-D"])
def test_a_tensor_that_is_not_2d_is_the_arrays_value_error(backend, shape):
    t = torch.zeros(shape, device=device_of(backend))
    err = same_error(lambda: twell.from_torch(t),
                     lambda: twell.TwELLMatrix(backend.xp.zeros(shape, dtype=np.float32)))
    assert err.type is ValueError
    assert f"tensor must be 2-D; got tensor.ndim={len(shape)}" in str(err.value)


@pytest.mark.parametrize("tdtype", [torch.complex64, torch.complex128], ids=str)
def test_a_complex_tensor_is_the_arrays_type_error(backend, tdtype):
    t = torch.zeros((2, 3), dtype=tdtype, device=device_of(backend))
    np_dtype = np.complex64 if tdtype == torch.complex64 else np.complex128
    err = same_error(lambda: twell.from_torch(t),
                     lambda: twell.TwELLMatrix(backend.xp.zeros((2, 3), dtype=np_dtype)))
    assert err.type is TypeError
    assert "tensor.dtype must be one of" in str(err.value)


def test_a_dtype_without_numpy_equivalent_is_a_type_error(backend):
    f8 = getattr(torch, "float8_e4m3fn", None)
    if f8 is None:
        pytest.skip("this torch has no float8_e4m3fn")
    t = torch.zeros((2, 3)).to(f8).to(device_of(backend))
    with pytest.raises(TypeError, match=r"tensor\.dtype=torch\.float8_e4m3fn has no NumPy"):
        twell.from_torch(t)
    with pytest.raises(TypeError, match=r"tensor\.dtype=torch\.float8_e4m3fn has no NumPy"):
        twell.from_torch_array(t)


def test_the_array_paths_option_errors_pass_through(backend):
    t = torch.zeros((2, 3), device=device_of(backend))
    with pytest.raises(ValueError, match="slots must be between 1 and tile_width=4; got slots=5"):
        twell.from_torch(t, tile_width=4, slots=5)
    with pytest.raises(TypeError, match=r"one of torch\.float64.*got dtype=torch\.int8"):
        twell.from_torch(t, dtype=torch.int8)


def test_what_is_not_a_dense_cpu_or_cuda_tensor_is_refused():
    with pytest.raises(TypeError, match="tensor must be a torch.Tensor; got ndarray"):
        twell.from_torch(np.zeros((2, 3)))
    with pytest.raises(TypeError, match=r"dense \(strided\) tensor; got tensor\.layout=torch\.sp"):
        twell.from_torch(torch.eye(3).to_sparse())
    with pytest.raises(ValueError, match="CPU or a CUDA device; got tensor.device=meta"):
        twell.from_torch(torch.zeros((2, 3), device="meta"))


# -- TwELLMatrix.to_torch: the storage arrays -------------------------------------------------

def part_dtypes(dtype):
    value = TORCH_DTYPES[dtype]
    return (torch.int32, value, torch.uint16, torch.int64, torch.int32, value)


@pytest.mark.parametrize("dtype", DTYPES)
def test_to_torch_parts_share_memory_with_the_matrix(backend, dtype, rng):
    a = twell.TwELLMatrix(backend.asarray(cast(sparse_matrix(rng), dtype)), slots=2)
    assert a.overflow_nnz > 0  # every part is non-empty, so every pointer is checked
    device = device_of(backend)
    p = a.to_torch()
    assert isinstance(p, twell.TorchParts) and p._fields == PART_NAMES
    for name, t, want_dtype in zip(PART_NAMES, p, part_dtypes(dtype), strict=True):
        arr = getattr(a, name)
        assert t.dtype == want_dtype, name
        assert tuple(t.shape) == arr.shape, name
        assert t.device == device, name
        assert t.is_contiguous(), name
        assert t.data_ptr() == ptr(arr), name
        assert_same_bits(host(t), arr, name)


def test_writes_through_the_tensors_reach_the_matrix(backend):
    a = twell.TwELLMatrix(backend.asarray(np.eye(3, 10, dtype=np.float32)), tile_width=4, slots=1)
    p = a.to_torch()
    p.data[0, 0, 0] = 5.0
    sync(backend)
    assert float(to_host(a.data)[0, 0, 0]) == 5.0
    assert to_host(a.toarray())[0, 0] == 5.0


def test_uint16_indices_convert_as_documented(backend, rng):
    a = twell.TwELLMatrix(backend.asarray(sparse_matrix(rng)), slots=3)
    p = a.to_torch()
    want = to_host(a.indices)
    assert p.indices.dtype == torch.uint16
    np.testing.assert_array_equal(p.indices.long().cpu().numpy(), want.astype(np.int64))
    as_int16 = p.indices.view(torch.int16)  # no copy; the same values while tile_width <= 32768
    assert as_int16.data_ptr() == ptr(a.indices)
    np.testing.assert_array_equal(as_int16.cpu().numpy(), want.astype(np.int16))


def test_the_widest_tile_keeps_its_high_columns(backend):
    """tile_width=65536: columns at and past 32768 stay exact in torch.uint16."""
    x = np.zeros((2, 65536), dtype=np.float32)
    x[0, [5, 32768, 65535]] = [1.0, 2.0, 3.0]
    a = twell.TwELLMatrix(backend.asarray(x), tile_width=65536, slots=3)
    p = a.to_torch()
    np.testing.assert_array_equal(host(p.indices)[0, 0], np.array([5, 32768, 65535], np.uint16))
    b = twell.from_torch_parts(p, a.shape, a.tile_width)
    assert_dense_equal(to_host(b.toarray()), x)


# -- from_torch_parts: the inverse ------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@given(case=cases(max_rows=16, max_cols=300))
@edge_examples(max_cols=300)
def test_parts_round_trip_is_exact_and_zero_copy(backend, dtype, case):
    device_of(backend)
    a = twell.TwELLMatrix(backend.asarray(cast(case.dense, dtype)), tile_width=case.tile_width,
                          slots=case.slots)
    p = a.to_torch()
    b = twell.from_torch_parts(p, a.shape, a.tile_width)
    assert isinstance(b, twell.TwELLMatrix)
    assert (b.shape, b.tile_width, b.slots, b.dtype) == (a.shape, a.tile_width, a.slots, a.dtype)
    for name in PART_NAMES:
        x, y = getattr(a, name), getattr(b, name)
        assert backend.is_native(y), name
        assert_same_bits(y, x, name)
        if x.size:
            assert ptr(y) == ptr(x), name
    assert_dense_equal(dense_from_parts(b), cast(cast(case.dense, dtype), np.float64))


def test_parts_may_be_any_sequence_of_six_tensors(backend, rng):
    device_of(backend)
    a = twell.TwELLMatrix(backend.asarray(sparse_matrix(rng)), slots=2)
    for parts in (tuple(a.to_torch()), list(a.to_torch())):
        assert_parts_equal(twell.from_torch_parts(parts, a.shape), a)


def test_tensors_that_require_grad_are_detached(backend, rng):
    device_of(backend)
    a = twell.TwELLMatrix(backend.asarray(sparse_matrix(rng).astype(np.float32)), slots=2)
    p = a.to_torch()
    p = p._replace(data=p.data.requires_grad_(), overflow_data=p.overflow_data.requires_grad_())
    b = twell.from_torch_parts(p, a.shape)
    assert ptr(b.data) == ptr(a.data)
    assert_parts_equal(b, a)


@pytest.fixture
def parts(backend, rng):
    """A matrix with overflow and its storage tensors."""
    device_of(backend)
    a = twell.TwELLMatrix(backend.asarray(sparse_matrix(rng)), slots=2)
    return a, a.to_torch()


def test_parts_are_validated(parts):
    a, p = parts
    counts = p.counts.clone()
    counts[0, 0] = a.slots + 1
    with pytest.raises(ValueError, match="counts must be between 0 and slots=2"):
        twell.from_torch_parts(p._replace(counts=counts), a.shape)
    with pytest.raises(ValueError, match="counts must have shape"):
        twell.from_torch_parts(p, (a.shape[0], a.shape[1] + 256))
    with pytest.raises(ValueError, match="counts must be C-contiguous"):
        twell.from_torch_parts(p._replace(counts=p.counts.T.contiguous().T), a.shape)


def test_int16_indices_are_refused_with_the_dtype_named(parts):
    a, p = parts
    with pytest.raises(TypeError, match="indices must have dtype uint16; got indices.dtype=int16"):
        twell.from_torch_parts(p._replace(indices=p.indices.view(torch.int16)), a.shape)
    b = twell.from_torch_parts(  # the documented fix: view them back
        p._replace(indices=p.indices.view(torch.int16).view(torch.uint16)), a.shape)
    assert_parts_equal(b, a)


def test_parts_that_are_not_six_tensors_are_refused(parts):
    a, p = parts
    with pytest.raises(ValueError, match="tuple of the 6 storage arrays"):
        twell.from_torch_parts(tuple(p)[:5], a.shape)
    with pytest.raises(TypeError, match="parts must be a tuple of the 6 storage tensors"):
        twell.from_torch_parts(p.data, a.shape)
    with pytest.raises(TypeError, match="parts.counts must be a torch.Tensor; got ndarray"):
        twell.from_torch_parts((np.zeros((24, 3), np.int32),) + tuple(p)[1:], a.shape)


def test_parts_on_two_devices_are_refused(gpu, rng):
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    a = twell.TwELLMatrix(gpu.asarray(sparse_matrix(rng)), slots=2)
    p = a.to_torch()
    with pytest.raises(ValueError, match="must all be on one device; got tensors on cpu, cuda"):
        twell.from_torch_parts(p._replace(counts=p.counts.cpu()), a.shape)


# -- to_torch: arrays twell returns ---------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
def test_dense_results_cross_without_copies(backend, dtype, rng):
    x = cast(sparse_matrix(rng), dtype)
    a = twell.TwELLMatrix(backend.asarray(x), slots=3)
    rhs = backend.asarray(cast(rng.uniform(-1, 1, (600, 5)), dtype))
    device = device_of(backend)
    for arr in (a.toarray(), a @ rhs, a @ rhs[:, 0]):
        t = twell.to_torch(arr)
        assert t.dtype == TORCH_DTYPES[dtype]
        assert tuple(t.shape) == arr.shape and t.device == device
        assert t.data_ptr() == ptr(arr)
        assert_same_bits(host(t), arr)
    assert_dense_equal(host(twell.to_torch(a.toarray())), x, dtype)


def test_non_contiguous_arrays_keep_their_strides(backend):
    arr = backend.asarray(np.arange(12, dtype=np.float32).reshape(3, 4).astype(BF16)).T
    t = twell.to_torch(arr)
    assert t.dtype == torch.bfloat16 and tuple(t.shape) == (4, 3)
    assert t.stride() == tuple(s // arr.itemsize for s in arr.strides)
    assert t.data_ptr() == ptr(arr)
    assert_same_bits(np.ascontiguousarray(host(t)), np.ascontiguousarray(to_host(arr)))


ARRAY_DTYPES = [np.float64, np.float32, np.float16, BF16, np.complex64, np.int64, np.int32,
                np.int16, np.int8, np.uint8, np.uint16, np.uint32, np.uint64, np.bool_]


@pytest.mark.parametrize("dtype", ARRAY_DTYPES, ids=[np.dtype(d).name for d in ARRAY_DTYPES])
def test_every_numeric_dtype_crosses(backend, dtype):
    name = np.dtype(dtype).name
    if getattr(torch, name, None) is None:
        pytest.skip(f"this torch has no torch.{name}")
    arr = backend.asarray((np.arange(6).reshape(2, 3) % 3).astype(dtype))
    t = twell.to_torch(arr)
    assert t.dtype == getattr(torch, name)
    assert t.data_ptr() == ptr(arr)
    assert_same_bits(host(t), arr)


def test_writes_through_the_tensor_reach_the_array(backend):
    arr = backend.xp.zeros((2, 3), dtype=BF16)
    t = twell.to_torch(arr)
    t[1, 2] = 1.5
    sync(backend)
    assert float(to_host(arr)[1, 2]) == 1.5


def test_scalars_and_0d_arrays(backend, rng):
    a = twell.TwELLMatrix(backend.asarray(sparse_matrix(rng)))
    s = a.sum()  # a NumPy scalar on the host, a 0-d CuPy array on the GPU
    t = twell.to_torch(s)
    assert t.dim() == 0 and t.dtype == torch.float64
    assert t.item() == float(s)
    assert twell.to_torch(np.float32(2.5)).item() == 2.5


def test_what_is_not_an_array_is_refused(rng):
    a = twell.TwELLMatrix(sparse_matrix(rng))
    with pytest.raises(TypeError, match=r"got TwELLMatrix \(A\.to_torch\(\)"):
        twell.to_torch(a)
    with pytest.raises(TypeError, match="array must be a NumPy or CuPy array; got list"):
        twell.to_torch([1.0, 2.0])
    with pytest.raises(TypeError, match="got array.dtype=object"):
        twell.to_torch(np.array([None, 1]))
    with pytest.raises(TypeError, match=r"got array.dtype=>f4"):
        twell.to_torch(np.zeros(3, dtype=">f4"))
    with pytest.raises(ValueError, match=r"negative strides \(-8,\)"):
        twell.to_torch(np.zeros(3)[::-1])


# -- the reference kernels' packed layout ----------------------------------------------------

def decode_packed(words, k, compression):
    """Dense float64 from packed uint32 words, one Python loop per row and tile."""
    m = words.shape[0]
    w = 256 // compression
    out = np.zeros((m, k))
    for r in range(m):
        for tile in range(k // 256):
            count = int(words[r, tile * w])
            for e in words[r, tile * w + 1:tile * w + 1 + count]:
                e = int(e)
                out[r, e & 0xFFFF] = float(np.array(e >> 16, np.uint16).view(BF16))
    return out


def test_the_worked_example_reaches_torch_as_the_reference_writes_it(backend):
    """The background note's example: one row, 512 columns, C=8."""
    x = np.zeros((1, 512), dtype=BF16)
    x[0, 3], x[0, 100], x[0, 300] = 1.5, 2.0, 0.25
    words = twell.TwELLMatrix(backend.asarray(x)).to_packed()
    t = twell.to_torch(words)
    assert t.dtype == torch.uint32 and tuple(t.shape) == (1, 64) and t.is_contiguous()
    assert t.device == device_of(backend) and t.data_ptr() == ptr(words)
    want = np.zeros((1, 64), dtype=np.uint32)
    want[0, :3] = [2, 0x3FC00003, 0x40000064]
    want[0, 32:34] = [1, 0x3E80012C]  # global column 300, not the local 44
    np.testing.assert_array_equal(host(t), want)


@pytest.mark.parametrize("compression", [8, 4, 2])
def test_packed_words_have_the_reference_dtype_and_shape(backend, compression, rng):
    cap = 256 // compression - 1
    x = np.where(rng.random((16, 768)) < 0.03, rng.uniform(0.25, 4.0, (16, 768)), 0.0)
    x[0, :256] = 0.0
    x[0, :cap] = 1.0  # one tile exactly at capacity
    x = cast(x, BF16)
    a = twell.TwELLMatrix(backend.asarray(x))
    t = twell.to_torch(a.to_packed(compression))
    # What the reference kernels take: a contiguous torch.uint32 tensor (M, K // C) on the
    # matrix's device (their C++ reads it with data_ptr<uint32_t>()).
    assert t.dtype == torch.uint32 and t.is_contiguous()
    assert tuple(t.shape) == (16, 768 // compression) and t.device == device_of(backend)
    assert_dense_equal(decode_packed(host(t), 768, compression), cast(x, np.float64))


def test_packed_words_from_torch_read_back(backend, rng):
    """The way back: a torch.uint32 tensor (the reference producer's output) -> from_packed."""
    x = cast(np.where(rng.random((8, 512)) < 0.03, rng.uniform(0.25, 4.0, (8, 512)), 0.0), BF16)
    a = twell.TwELLMatrix(backend.asarray(x))
    t = twell.to_torch(a.to_packed())
    words = twell.from_torch_array(t)
    assert words.dtype == np.uint32 and ptr(words) == t.data_ptr()
    b = twell.from_packed(words, a.shape)
    assert_dense_equal(to_host(b.toarray()), x, BF16)
