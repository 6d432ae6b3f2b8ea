"""twell.torch: SparseMLP and SparseGatedMLP against the dense layers torch computes itself.

Oracles: the same layer computed by torch in float64 from the module's own weights (and, for
the modules taken from an MLP, that MLP's own forward), never through twell. CPU tensors run
on twell's NumPy backend, CUDA tensors on its CuPy backend.
"""

import numpy as np
import pytest
from helpers import run_python
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip(
    "torch",
    reason="PyTorch is not installed: twell.torch is optional, and these tests run where "
           "torch is (pip install torch)",
)
nn = torch.nn

import twell.torch as tt  # noqa: E402

#: Relative error in the norm allowed against the float64 layer, by dtype: float64 and
#: float32 round each product's sum once; bfloat16 rounds the inputs' products' sums to 8
#: bits (and the hidden layer once more).
RTOL = {torch.float64: 1e-12, torch.float32: 1e-5, torch.bfloat16: 2e-2}


def devices():
    out = [pytest.param("cpu", id="cpu")]
    cuda = torch.cuda.is_available()
    try:
        import cupy  # noqa: F401
    except ImportError:
        cuda = False
    out.append(pytest.param("cuda", id="cuda", marks=pytest.mark.skipif(
        not cuda, reason="CuPy with a CUDA GPU is not available")))
    return out


DEVICES = devices()
DTYPES = [pytest.param(d, id=str(d).removeprefix("torch.")) for d in RTOL]


def dense_layer(x, gate, up, down, down_bias=None):
    """The layer in float64, by torch alone."""
    with torch.no_grad():
        x = x.double()
        h = torch.relu(x @ (gate if gate is not None else up).double().T)
        if gate is not None:
            h = h * (x @ up.double().T)
        y = h @ down.double().T
        return y if down_bias is None else y + down_bias.double()


def rel(got, want):
    return float((got.double() - want).norm() / max(float(want.norm()), 1e-300))


def inputs(shape, dtype, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype=dtype, device=device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("gated", [False, True], ids=["mlp", "gated"])
def test_layer_equals_the_dense_layer(device, dtype, gated):
    torch.manual_seed(1)
    cls = tt.SparseGatedMLP if gated else tt.SparseMLP
    layer = cls(32, 96, device=device, dtype=dtype)
    x = inputs((3, 7, 32), dtype, device)
    with torch.no_grad():
        y = layer(x)
    assert y.shape == x.shape and y.dtype == dtype and y.device == x.device
    want = dense_layer(x, layer.gate_proj.weight if gated else None, layer.up_proj.weight,
                       layer.down_proj.weight)
    assert rel(y.cpu(), want.cpu()) <= RTOL[dtype]


@settings(max_examples=25, deadline=None)
@given(m=st.integers(0, 20), d_model=st.integers(1, 24), d_ff=st.integers(1, 300),
       sparsity=st.sampled_from([0.0, 0.5, 0.9, 0.99, 1.0]), gated=st.booleans(),
       seed=st.integers(0, 2**31 - 1))
def test_any_shape_and_sparsity_on_the_cpu(m, d_model, d_ff, sparsity, gated, seed):
    """float64 on the host: the dense layer to rounding, whatever the shapes and however
    many of the hidden units are zero (sparsity: the share of gate rows made negative)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(m, d_model, generator=g, dtype=torch.float64) + 0.1  # positive inputs
    layer = (tt.SparseGatedMLP if gated else tt.SparseMLP)(d_model, d_ff,
                                                            dtype=torch.float64)
    first = layer.gate_proj if gated else layer.up_proj
    with torch.no_grad():
        for w in layer.parameters():
            w.copy_(torch.randn(w.shape, generator=g, dtype=torch.float64))
        # Rows of the first projection made negative give hidden units that are always 0.
        off = torch.rand(d_ff, generator=g) < sparsity
        first.weight[off] = -first.weight[off].abs()
        y = layer(x)
    want = dense_layer(x, layer.gate_proj.weight if gated else None, layer.up_proj.weight,
                       layer.down_proj.weight)
    np.testing.assert_allclose(y.numpy(), want.numpy(), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("device", DEVICES)
def test_down_bias_is_added(device):
    torch.manual_seed(2)
    layer = tt.SparseMLP(8, 40, down_bias=True, dtype=torch.float64, device=device)
    with torch.no_grad():
        layer.down_proj.bias.copy_(torch.linspace(-1, 1, 8, dtype=torch.float64))
        x = inputs((5, 8), torch.float64, device)
        y = layer(x)
    want = dense_layer(x, None, layer.up_proj.weight, layer.down_proj.weight,
                       layer.down_proj.bias)
    assert rel(y.cpu(), want.cpu()) <= 1e-12


class LlamaStyleMLP(nn.Module):
    """A Llama MLP with a ReLU gate: the layout of transformers' LlamaMLP."""

    def __init__(self, d_model, d_ff, act=None):
        super().__init__()
        self.gate_proj = nn.Linear(d_model, d_ff, bias=False, dtype=torch.float64)
        self.up_proj = nn.Linear(d_model, d_ff, bias=False, dtype=torch.float64)
        self.down_proj = nn.Linear(d_ff, d_model, bias=False, dtype=torch.float64)
        self.act_fn = act if act is not None else nn.ReLU()

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class FcMLP(nn.Module):
    def __init__(self, d_model, d_ff):
        super().__init__()
        self.fc1 = nn.Linear(d_model, d_ff, bias=False, dtype=torch.float64)
        self.fc2 = nn.Linear(d_ff, d_model, dtype=torch.float64)
        self.act = torch.relu

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


@pytest.mark.parametrize("make, cls", [
    (lambda: LlamaStyleMLP(16, 48), tt.SparseGatedMLP),
    (lambda: FcMLP(16, 48), tt.SparseMLP),
    (lambda: nn.Sequential(nn.Linear(16, 48, bias=False, dtype=torch.float64), nn.ReLU(),
                           nn.Linear(48, 16, dtype=torch.float64)), tt.SparseMLP),
], ids=["llama", "fc1-fc2", "sequential"])
def test_from_module_computes_what_the_module_computes_on_its_own_weights(make, cls):
    torch.manual_seed(3)
    mlp = make()
    layer = tt.from_module(mlp)
    assert type(layer) is cls and cls.from_module(mlp).d_ff == 48
    mine = {id(p) for p in layer.parameters()}
    assert mine == {id(p) for p in mlp.parameters()}  # the same tensors: nothing copied
    x = inputs((4, 16), torch.float64, "cpu")
    with torch.no_grad():
        assert rel(layer(x), mlp(x).double()) <= 1e-12
        for p in mlp.parameters():  # the layer sees the module's later writes
            p.mul_(2)
        assert rel(layer(x), mlp(x).double()) <= 1e-12


def test_a_llama_state_dict_loads_into_the_gated_layer():
    torch.manual_seed(4)
    mlp = LlamaStyleMLP(16, 48)
    layer = tt.SparseGatedMLP(16, 48, dtype=torch.float64)
    layer.load_state_dict(mlp.state_dict())
    x = inputs((6, 16), torch.float64, "cpu")
    with torch.no_grad():
        assert rel(layer(x), mlp(x).double()) <= 1e-12


def test_what_the_layers_refuse():
    silu = LlamaStyleMLP(8, 16, act=nn.SiLU())
    with pytest.raises(ValueError, match=r"compute ReLU.*act_fn is SiLU\(\)"):
        tt.from_module(silu)
    with pytest.raises(ValueError, match="is a gated MLP: use SparseGatedMLP"):
        tt.SparseMLP.from_module(LlamaStyleMLP(8, 16))
    with pytest.raises(ValueError, match="not a gated MLP"):
        tt.SparseGatedMLP.from_module(FcMLP(8, 16))
    with pytest.raises(ValueError, match=r"nn.Sequential must be .*got \(Linear, GELU, Linear\)"):
        tt.from_module(nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8)))
    with pytest.raises(ValueError, match="not a layout twell.torch knows"):
        tt.from_module(nn.Linear(8, 8))
    with pytest.raises(ValueError, match="up_proj must have no bias"):
        tt.SparseMLP.from_linear(nn.Linear(8, 16), nn.Linear(16, 8))
    with pytest.raises(ValueError, match=r"down_proj must be nn.Linear\(16, 8\); got "
                                         r"nn.Linear\(8, 16\)"):
        tt.SparseMLP.from_linear(nn.Linear(8, 16, bias=False), nn.Linear(8, 16))
    with pytest.raises(TypeError, match="up_proj must be a torch.nn.Linear; got Conv1d"):
        tt.SparseMLP.from_linear(nn.Conv1d(8, 16, 1), nn.Linear(16, 8))
    with pytest.raises(ValueError, match="up_proj must have gate_proj's shape"):
        tt.SparseGatedMLP.from_linear(nn.Linear(8, 16, bias=False),
                                      nn.Linear(8, 12, bias=False), nn.Linear(16, 8))
    with pytest.raises(ValueError, match="slots must be"):
        tt.SparseMLP(8, 16, slots=0)
    layer = tt.SparseMLP(8, 16, dtype=torch.float64)
    with pytest.raises(RuntimeError, match=r"inference only: call it under torch.no_grad"):
        layer(torch.ones(2, 8, dtype=torch.float64))
    with torch.no_grad(), pytest.raises(ValueError, match=r"d_model=8; got x.shape=\(2, 7\)"):
        layer(torch.ones(2, 7, dtype=torch.float64))


def test_inference_mode_and_fixed_slots():
    torch.manual_seed(5)
    layer = tt.SparseGatedMLP(16, 300, slots=3, dtype=torch.float32)
    assert "slots=3" in repr(layer)
    x = inputs((9, 16), torch.float32, "cpu")
    with torch.inference_mode():
        y = layer(x)
    want = dense_layer(x, layer.gate_proj.weight, layer.up_proj.weight,
                       layer.down_proj.weight)
    assert rel(y, want) <= RTOL[torch.float32]  # entries past 3 slots kept in the overflow


def test_importing_without_torch_says_why():
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import twell\n"
        "try:\n"
        "    import twell.torch\n"
        "except ImportError as e:\n"
        "    assert 'twell.torch needs PyTorch' in str(e), e\n"
        "    print('ok')\n"
    )
    assert run_python(code) == "ok"


@pytest.mark.parametrize("device", DEVICES[1:])
def test_cuda_layer_on_a_side_stream(device):
    """Under ``torch.cuda.stream(s)`` the layer's kernels queue on s, after the work that
    made x: the result, read after s finishes, is the dense layer's."""
    torch.manual_seed(6)
    layer = tt.SparseGatedMLP(64, 256, dtype=torch.float32, device=device)
    side = torch.cuda.Stream()
    with torch.no_grad(), torch.cuda.stream(side):
        x = torch.randn(512, 64, device=device).mul_(3).add_(1)  # queued on the side stream
        y = layer(x)
    side.synchronize()
    want = dense_layer(x, layer.gate_proj.weight, layer.up_proj.weight,
                       layer.down_proj.weight)
    assert rel(y.cpu(), want.cpu()) <= RTOL[torch.float32]


needs_custom_ops = pytest.mark.skipif(not hasattr(torch.library, "custom_op"),
                                      reason="torch.library.custom_op needs torch 2.4")


@needs_custom_ops
@pytest.mark.parametrize("gated", [False, True], ids=["mlp", "gated"])
def test_the_operator_passes_torchs_opcheck(gated):
    """torch.ops.twell.sparse_ffn: schema, fake (meta) implementation and dispatch, as torch
    checks custom operators."""
    g = torch.Generator().manual_seed(7)
    x, wg, wu = (torch.randn(s, generator=g) for s in [(6, 8), (40, 8), (40, 8)])
    wd = torch.randn(8, 40, generator=g)
    for slots in (0, 2):
        torch.library.opcheck(torch.ops.twell.sparse_ffn.default,
                              (x, wg if gated else None, wu, wd, slots))


@needs_custom_ops
@pytest.mark.parametrize("gated", [False, True], ids=["mlp", "gated"])
def test_torch_compile_traces_a_model_of_layers_without_a_graph_break(gated):
    torch.manual_seed(8)
    cls = tt.SparseGatedMLP if gated else tt.SparseMLP
    model = nn.Sequential(cls(16, 64, dtype=torch.float32), nn.LayerNorm(16),
                          cls(16, 64, down_bias=True, dtype=torch.float32))
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)  # a break raises
    x = inputs((2, 5, 16), torch.float32, "cpu")
    with torch.no_grad():
        want = model(x)
        got = compiled(x)
    assert got.shape == want.shape and torch.equal(got, want)


def relu_sparse_layer(cls, device, slots, shift=0.13, d_model=256, d_ff=1024):
    """A bfloat16 layer whose hidden layer keeps about 5% of its entries on inputs from
    :func:`relu_sparse_input` (gate or up weights of mean ``-shift``; half at shift 0)."""
    layer = cls(d_model, d_ff, slots=slots, dtype=torch.bfloat16, device=device)
    first = layer.gate_proj if layer.gated else layer.up_proj
    g = torch.Generator().manual_seed(11)
    with torch.no_grad():
        first.weight.copy_(torch.randn(d_ff, d_model, generator=g) - shift)
    return layer


def relu_sparse_input(m, d_model, device, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(m, d_model, generator=g).abs().to(torch.bfloat16).to(device)


def weights_of(layer):
    return (layer.gate_proj.weight if layer.gated else None, layer.up_proj.weight,
            layer.down_proj.weight)


def capture(layer, static_x):
    """A CUDA graph of ``layer(static_x)`` and its output tensor (warmed up on a side
    stream first, as torch.cuda.graph asks)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        layer(static_x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_y = layer(static_x)
    return graph, static_y


@pytest.mark.parametrize("device", DEVICES[1:])
@pytest.mark.parametrize("gated", [False, True], ids=["mlp", "gated"])
@pytest.mark.parametrize("slots", ["auto", 2])
@pytest.mark.parametrize("ways", ["gather", "dense"])
def test_a_cuda_graph_replays_the_layer_with_the_eager_bits(device, gated, slots, ways,
                                                            monkeypatch):
    # ways="dense": no floor on the work, so that the up and down projections take their
    # cuBLAS ways (twell's own handle, which a capture records; CuPy's refuses).
    calls = []
    if ways == "dense":
        from twell._cuda import _cublas, _policy

        monkeypatch.setattr(_policy, "DENSE_PRODUCT_MIN_WORK", 0)
        gemm = _cublas.gemm
        monkeypatch.setattr(_cublas, "gemm", lambda *a, **k: calls.append(1) or gemm(*a, **k))
    layer = relu_sparse_layer(tt.SparseGatedMLP if gated else tt.SparseMLP, device, slots)
    x1, x2 = (relu_sparse_input(384, 256, device, seed) for seed in (1, 2))
    with torch.no_grad():
        static_x = x1.clone()
        eager1 = layer(static_x)  # the first call fixes slots and density
        plan = layer._plan
        assert plan[0] == (layer.slots if slots != "auto" else plan[0]) and 0.01 < plan[1] < 0.2
        eager2 = layer(x2)
        graph, static_y = capture(layer, static_x)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(static_y, eager1)
        static_x.copy_(x2)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(static_y, eager2)
        assert torch.equal(layer(x2), eager2) and layer._plan == plan
    assert rel(static_y.cpu(), dense_layer(x2, *weights_of(layer)).cpu()) <= RTOL[torch.bfloat16]
    assert bool(calls) == (ways == "dense")


@pytest.mark.parametrize("device", DEVICES[1:])
def test_a_captured_layer_keeps_the_entries_past_its_overflow_capacity(device, monkeypatch):
    # An input far denser than the first call's: half the hidden layer non-zero in 2 slots a
    # tile, against a spill capacity of 500 entries. The replay recomputes the rows that lost
    # entries on the device and gives the eager call's bits, which are the dense layer's.
    from twell._cuda import _policy

    monkeypatch.setattr(_policy, "spill_capacity", lambda m, n: 500)
    layer = relu_sparse_layer(tt.SparseGatedMLP, device, 2)
    with torch.no_grad():
        sparse = relu_sparse_input(256, 256, device, 3)
        layer(sparse)
        dense = relu_sparse_input(256, 256, device, 4)
        dense[:, :] = dense - 0.8  # signs mixed: x @ w.T positive about half the time
        eager = layer(dense)
        static_x = sparse.clone()
        graph, static_y = capture(layer, static_x)
        static_x.copy_(dense)
        graph.replay()
        torch.cuda.synchronize()
    assert torch.equal(static_y, eager)
    want = dense_layer(dense, *weights_of(layer)).cpu()
    assert rel(eager.cpu(), want) <= RTOL[torch.bfloat16]


@pytest.mark.parametrize("device", DEVICES[1:])
def test_capturing_before_the_first_call_says_what_to_do(device):
    layer = relu_sparse_layer(tt.SparseMLP, device, "auto")
    x = relu_sparse_input(64, 256, device, 5)
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), pytest.raises(RuntimeError, match="call it once before capturing"):
        with torch.cuda.graph(graph):
            layer(x)
    layer.slots = 4  # a new setting starts over, and the layer runs
    with torch.no_grad():
        assert layer(x).shape == x.shape and layer._plan[0] == 4


@pytest.mark.parametrize("device", DEVICES[1:])
def test_capturing_a_float32_layer_is_refused(device):
    layer = tt.SparseMLP(64, 256, dtype=torch.float32, device=device)
    x = torch.randn(32, 64, device=device)
    with torch.no_grad():
        layer(x)  # eager calls of any dtype run
        graph = torch.cuda.CUDAGraph()
        with pytest.raises(RuntimeError, match="bfloat16 or float16 tensors of one dtype"):
            with torch.cuda.graph(graph):
                layer(x)


@pytest.mark.parametrize("device", DEVICES[1:])
def test_the_kept_transposed_down_weight_follows_the_weight(device):
    # The layer keeps down_proj.weight transposed on the GPU: a weight changed in place (its
    # version) or replaced must be read anew.
    layer = relu_sparse_layer(tt.SparseGatedMLP, device, 4)
    x = relu_sparse_input(128, 256, device, 6)
    with torch.no_grad():
        first = layer(x)
        layer.down_proj.weight.mul_(2)
        doubled = layer(x)
        layer.down_proj.weight = nn.Parameter(-layer.down_proj.weight, requires_grad=False)
        negated = layer(x)
    assert torch.equal(doubled, first * 2) and torch.equal(negated, -doubled)
    assert rel(negated.cpu(), dense_layer(x, *weights_of(layer)).cpu()) <= RTOL[torch.bfloat16]
