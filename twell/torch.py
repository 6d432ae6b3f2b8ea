"""PyTorch modules for ReLU-sparse feed-forward layers, computed through TwELL.

:class:`SparseMLP` computes ``relu(x @ W_up.T) @ W_down.T`` and :class:`SparseGatedMLP`
``(relu(x @ W_gate.T) * (x @ W_up.T)) @ W_down.T`` with :func:`twell.sparse_ffn`: the
activations are packed into TwELL as they are produced, and the gated layer's up projection is
computed only where the gate is non-zero. Their weights are ``nn.Linear`` modules named as in
Llama-style MLPs (``gate_proj``, ``up_proj``, ``down_proj``), so a state dict of such an MLP
loads into them, and :meth:`SparseGatedMLP.from_module` takes an existing MLP's Linear layers
without copying their weights.

The modules compute inference only: call them under :func:`torch.no_grad` or
:func:`torch.inference_mode` (with autograd recording they raise, rather than return an output
that gradients would not flow through). CUDA tensors run on twell's CuPy backend, on the
tensors' device and torch's current stream; CPU tensors run on its NumPy backend. Nothing is
copied between the two. The computation is the custom operator ``torch.ops.twell.sparse_ffn``
(torch 2.4 and newer), with a fake implementation, so ``torch.compile`` traces a model that
uses the modules without a graph break.

Importing this module needs PyTorch; the rest of twell works without it.
"""

import contextlib
from typing import Optional

from . import _arrays, _layout
from ._arguments import check_slots
from ._dlpack import from_torch_array, to_torch
from ._ffn import matmul_to_twell, sparse_ffn

try:
    import torch
    from torch import nn
except ImportError:
    raise ImportError(
        "twell.torch needs PyTorch (pip install torch); the rest of twell works without it"
    ) from None

__all__ = ["SparseGatedMLP", "SparseMLP", "from_module"]


def _check_linear(layer, name, bias_allowed):
    if not isinstance(layer, nn.Linear):
        raise TypeError(f"{name} must be a torch.nn.Linear; got {type(layer).__name__}")
    if layer.bias is not None and not bias_allowed:
        raise ValueError(
            f"{name} must have no bias (nn.Linear(..., bias=False)): the sparse layer "
            f"computes relu(x @ {name}.weight.T), whose zeros make it sparse, and takes no "
            "bias before the activation; got a Linear with a bias"
        )


def _check_pair(first, first_name, second, second_name):
    """``second`` takes ``first``'s outputs (``first`` (d_ff, d_model) -> ``second`` (d_model,
    d_ff))."""
    if second.in_features != first.out_features or second.out_features != first.in_features:
        raise ValueError(
            f"{second_name} must map the {first.out_features} features of {first_name} back "
            f"to its {first.in_features}: {second_name} must be nn.Linear({first.out_features}, "
            f"{first.in_features}); got nn.Linear({second.in_features}, "
            f"{second.out_features})"
        )


def _is_relu(act):
    return isinstance(act, nn.ReLU) or act in (torch.relu, torch.nn.functional.relu)


def _check_relu(mlp, name):
    """The activation of ``mlp`` (attribute ``name``, if it has one) must be ReLU."""
    act = getattr(mlp, name, None)
    if act is not None and not _is_relu(act):
        raise ValueError(
            f"twell's sparse layers compute ReLU, whose zeros make the activations sparse; "
            f"{type(mlp).__name__}.{name} is {act!r}"
        )


def _torch_allocator(cupy, device):
    """A CuPy allocator that takes its memory from torch's caching allocator on torch's
    current stream of ``device``. Under ``torch.cuda.graph`` capture the memory then comes from
    the graph's private pool, which the graph keeps for its replays: memory from CuPy's own
    pool would go back to that pool after the capture and be handed to other arrays while
    replays still write it. Eagerly, twell and torch share one pool instead of two."""
    stream = torch.cuda.current_stream(device)

    def malloc(size, device_id):
        return torch.cuda.caching_allocator_alloc(size, device_id, stream)

    def free(ptr, device_id):
        torch.cuda.caching_allocator_delete(ptr)

    return cupy.cuda.memory.PythonFunctionAllocator(malloc, free).malloc


def _on_device(device):
    """The context in which twell's CuPy backend runs for tensors on ``device``: that
    device, torch's current stream (so that twell's kernels follow the work that produced the
    inputs and precede the work that reads the output) and torch's allocator."""
    cupy = _arrays.cupy_module()
    stack = contextlib.ExitStack()
    stack.enter_context(cupy.cuda.Device(device.index))
    stack.enter_context(_cupy_stream(cupy, device))
    stack.enter_context(cupy.cuda.using_allocator(_torch_allocator(cupy, device)))
    return stack


def _without_sync(x, weights):
    """Whether the layer on these tensors takes the path without a host synchronisation
    (:func:`twell._cuda._ffn.sparse_ffn_without_sync`): CUDA tensors of one 16-bit dtype, the
    fused GEMM's operands."""
    return (x.device.type == "cuda" and x.dtype in (torch.bfloat16, torch.float16)
            and all(w.dtype == x.dtype for w in weights))


def _compiling():
    """Whether torch.compile is tracing (fake tensors: nothing to read or keep)."""
    return getattr(torch.compiler, "is_compiling", lambda: False)()


def _cupy_stream(cupy, device):
    """torch's current stream on ``device`` as a CuPy stream: through the CUDA stream protocol
    where both sides speak it (``Stream.from_external``, CuPy 14), else ``ExternalStream``."""
    stream = torch.cuda.current_stream(device)
    if hasattr(cupy.cuda.Stream, "from_external") and hasattr(stream, "__cuda_stream__"):
        return cupy.cuda.Stream.from_external(stream)
    return cupy.cuda.ExternalStream(stream.cuda_stream, device.index)


# Optional[...] rather than "Tensor | None": the docs build on a mocked torch, whose Tensor
# is no type, and the custom operator reads its schema from these annotations.
def _sparse_ffn(x: torch.Tensor,
                w_gate: Optional[torch.Tensor],  # noqa: UP045 - see above
                w_up: torch.Tensor, w_down: torch.Tensor, slots: int,
                density: float = -1.0) -> torch.Tensor:
    """:func:`twell.sparse_ffn` on tensors: ``x`` (M, d_model) and nn.Linear weights on one
    device, gated where ``w_gate`` is given, ``slots`` 0 for ``"auto"``; a new tensor of
    shape (M, d_model) on that device.

    With ``slots`` given, CUDA tensors of one 16-bit dtype take the layer without a host
    synchronisation (:func:`twell._cuda._ffn.sparse_ffn_without_sync`), which a CUDA graph
    can capture; ``density`` (the first projection's share of non-zeros, negative when
    unknown) then stands for the entry count that the ways of the up projection and the
    SpMM are chosen by."""
    def as_arrays():
        return [None if t is None else from_torch_array(t.detach())
                for t in (x, w_gate, w_up, w_down)]

    if x.device.type != "cuda":
        return to_torch(sparse_ffn(*as_arrays(), gated=w_gate is not None,
                                   tile_width=_layout.GEMM_TILE_WIDTH, slots=slots or "auto"))
    # The tensors are taken as arrays on torch's stream too: the DLPack exchange otherwise
    # makes CuPy's default stream wait for torch's, which a graph capture refuses.
    with _on_device(x.device):
        arrays = as_arrays()
        if slots:
            from ._cuda._ffn import sparse_ffn_without_sync, without_sync_supported

            if without_sync_supported(*arrays):
                hint = None if density < 0 else round(density * x.shape[0] * w_up.shape[0])
                return to_torch(sparse_ffn_without_sync(*arrays, slots, nnz_hint=hint))
        return to_torch(sparse_ffn(*arrays, gated=w_gate is not None,
                                   tile_width=_layout.GEMM_TILE_WIDTH, slots=slots or "auto"))


def _layer_plan(x, w, slots):
    """``(slots, density)`` of the first projection ``relu(x @ w.T)`` of a layer on CUDA
    tensors, at tile width 256: the slots (``slots="auto"``'s choice for this product, or
    ``slots`` given) and the product's share of non-zeros. One fused pack and one read-back
    (a host synchronisation)."""
    with _on_device(x.device):
        h = matmul_to_twell(from_torch_array(x.detach()), from_torch_array(w.detach()),
                            tile_width=_layout.GEMM_TILE_WIDTH, slots=slots)
        return h.slots, h.nnz / max(h.shape[0] * h.shape[1], 1)


def _sparse_ffn_fake(x, w_gate, w_up, w_down, slots, density=-1.0):
    """The output's metadata, for tracing (fake tensors: no data, no computation)."""
    dtype = x.dtype
    for w in (w_gate, w_up, w_down):
        if w is not None:
            dtype = torch.promote_types(dtype, w.dtype)
    return x.new_empty((x.shape[0], w_down.shape[0]), dtype=dtype)


if hasattr(torch.library, "custom_op"):  # torch 2.4 and newer
    #: The layer's computation as the custom operator ``torch.ops.twell.sparse_ffn``, so
    #: that ``torch.compile`` traces a model that uses the modules without a graph break
    #: (its fake implementation gives the output's shape and dtype).
    sparse_ffn_op = torch.library.custom_op("twell::sparse_ffn", mutates_args=())(
        _sparse_ffn)
    sparse_ffn_op.register_fake(_sparse_ffn_fake)
else:
    sparse_ffn_op = _sparse_ffn


class _SparseFFN(nn.Module):
    """The forward pass and checks the two modules share."""

    gated = False
    #: The projections before the activation (``d_model -> d_ff``, no bias).
    _inputs = ("up_proj",)

    def __init__(self, d_model, d_ff, *, down_bias=False, slots="auto", device=None,
                 dtype=None):
        super().__init__()
        self.slots = check_slots(slots, _layout.GEMM_TILE_WIDTH)
        for name in self._inputs:
            setattr(self, name, nn.Linear(d_model, d_ff, bias=False, device=device,
                                          dtype=dtype))
        self.down_proj = nn.Linear(d_ff, d_model, bias=down_bias, device=device, dtype=dtype)

    @classmethod
    def _holding(cls, slots, **layers):
        """A layer that holds ``layers`` (nn.Linear modules, shared, not copied) instead of
        weights of its own."""
        self = cls.__new__(cls)
        nn.Module.__init__(self)
        self.slots = check_slots(slots, _layout.GEMM_TILE_WIDTH)
        for name, layer in layers.items():
            setattr(self, name, layer)
        return self

    @classmethod
    def from_module(cls, mlp, *, slots="auto"):
        """The layer on an MLP's Linear layers (shared, not copied): for
        :class:`SparseGatedMLP` a Llama-style module with ``gate_proj``, ``up_proj`` and
        ``down_proj``; for :class:`SparseMLP` a module with ``up_proj`` and ``down_proj`` (or
        ``fc1`` and ``fc2``), or ``nn.Sequential(Linear, ReLU, Linear)``; with a ReLU
        activation. See :func:`from_module`."""
        layer = from_module(mlp, slots=slots)
        if not isinstance(layer, cls):
            raise ValueError(
                f"{type(mlp).__name__} is a gated MLP: use SparseGatedMLP.from_module"
                if layer.gated else
                f"{type(mlp).__name__} is not a gated MLP (no gate_proj): use "
                "SparseMLP.from_module"
            )
        return layer

    @property
    def d_model(self):
        """Features of the input and output."""
        return self.up_proj.in_features

    @property
    def d_ff(self):
        """Features of the hidden (sparse) layer."""
        return self.up_proj.out_features

    def extra_repr(self):
        return f"d_model={self.d_model}, d_ff={self.d_ff}, slots={self.slots!r}"

    @property
    def slots(self):
        """Slots per (row, tile) of the hidden layer's TwELL matrix: an int, or ``"auto"``.
        Setting it drops the plan of the first CUDA call (:meth:`forward`)."""
        return self._slots

    @slots.setter
    def slots(self, value):
        self._slots = check_slots(value, _layout.GEMM_TILE_WIDTH)
        self._plan = None

    def _down_transposed(self, w):
        """``down_proj.weight`` transposed into a C-contiguous ``(d_ff, d_model)`` tensor, the
        layout the SpMM reads: kept (not in the state dict) while the weight is the same
        tensor, unchanged (its version counter), and made again otherwise. A copy per call
        costs 0.09 ms at the paper's shape on an H100, about 5% of the layer."""
        key = (w.data_ptr(), w._version, tuple(w.shape), w.dtype, w.device)
        kept = self.__dict__.get("_kept_down")
        if kept is None or kept[0] != key:
            with torch.no_grad():
                kept = (key, w.detach().t().contiguous())
            self.__dict__["_kept_down"] = kept
        return kept[1]

    def _planned(self, x, weights):
        """``(slots, density)`` for the operator: on CUDA tensors of one 16-bit dtype, those
        of the first call, fixed then (:func:`_layer_plan`: one synchronisation, refused
        while a CUDA graph is being captured); else the slots given (0 for ``"auto"``) and no
        density."""
        given = 0 if self._slots == "auto" else self._slots
        if not _without_sync(x, weights):
            if x.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
                raise RuntimeError(
                    f"{type(self).__name__} runs in a CUDA graph on bfloat16 or float16 "
                    f"tensors of one dtype (the fused GEMM's); got x of {x.dtype} and weights "
                    f"of {', '.join(str(w.dtype) for w in weights)}"
                )
            return given, -1.0
        if _compiling() and self._plan is None:
            return given, -1.0
        if self._plan is None:
            if torch.cuda.is_current_stream_capturing():
                raise RuntimeError(
                    f"{type(self).__name__} fixes its slots and density at its first call on "
                    "a CUDA device, which reads the GPU: call it once before capturing a CUDA "
                    "graph"
                )
            self._plan = _layer_plan(x, weights[0], self._slots)
        return self._plan


    def forward(self, x):
        """The layer on ``x`` of shape ``(..., d_model)``: a tensor of the same shape, on
        ``x``'s device, in the dtype NumPy's promotion gives ``x`` and the weights.

        On CUDA tensors of one 16-bit dtype (bfloat16 or float16) the first call fixes the
        slots (``"auto"``'s choice for its input) and the hidden layer's density, and every
        call after it runs without a host synchronisation, so that ``torch.cuda.graph`` can
        capture it (replays give the eager calls' bits): the overflow past the slots lives in
        buffers of a fixed capacity, and the rows of an input whose overflow exceeds it are
        recomputed on the device (``twell._cuda._ffn.sparse_ffn_without_sync``). A gated
        layer on an H100 or H200 whose hidden layer is denser than about 0.85% writes it
        dense instead and multiplies it by cuBLAS, which is faster there. Setting
        :attr:`slots` starts over. Capturing a layer of other dtypes is a RuntimeError. The
        layer keeps ``down_proj.weight`` transposed too (a second copy of it, made again when
        the weight changes), the layout its down projection reads (on the CPU scipy's
        product, which would otherwise transpose the weight at every call)."""
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"x must be a torch.Tensor; got {type(x).__name__}")
        weights = [getattr(self, name).weight for name in (*self._inputs, "down_proj")]
        if torch.is_grad_enabled() and (x.requires_grad or any(w.requires_grad
                                                                for w in weights)):
            raise RuntimeError(
                f"{type(self).__name__} computes inference only: call it under "
                "torch.no_grad() or torch.inference_mode() (its output would carry no "
                "gradient)"
            )
        if x.ndim < 1 or x.shape[-1] != self.d_model:
            raise ValueError(
                f"x must have shape (..., d_model) with d_model={self.d_model}; "
                f"got x.shape={tuple(x.shape)}"
            )
        for w in weights:
            if w.device != x.device:
                raise ValueError(
                    f"x is on {x.device} but the layer's weights are on {w.device}: move one "
                    "(layer.to(x.device))"
                )
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.d_model)
        slots, density = self._planned(x2, weights)
        down = self.down_proj.weight
        if not _compiling():
            down = self._down_transposed(down).T
        y = sparse_ffn_op(x2, self.gate_proj.weight if self.gated else None,
                          self.up_proj.weight, down, slots, density)
        if self.down_proj.bias is not None:
            y = y + self.down_proj.bias
        return y.reshape(*lead, self.d_model)


class SparseMLP(_SparseFFN):
    """``relu(x @ up_proj.weight.T) @ down_proj.weight.T (+ down_proj.bias)`` through TwELL.

    Parameters
    ----------
    d_model, d_ff : int
        Features of the input and output, and of the hidden layer.
    down_bias : bool, optional
        Whether ``down_proj`` has a bias (``up_proj`` has none: its zeros after the ReLU are
        what makes the layer sparse). Default False.
    slots : int or "auto", optional
        Slots per (row, tile) of the hidden layer's TwELL matrix (tile width 256, the fused
        GEMM's), as for :func:`twell.sparse_ffn`. Default ``"auto"``; a layer that runs many
        times on similar inputs can fix it once.
    device, dtype : optional
        Of the weights, as for ``nn.Linear``.

    Attributes
    ----------
    up_proj : nn.Linear
        ``d_model -> d_ff``, no bias.
    down_proj : nn.Linear
        ``d_ff -> d_model``.

    See Also
    --------
    SparseGatedMLP, twell.sparse_ffn, from_module

    Examples
    --------
    >>> import torch, twell.torch                                  # doctest: +SKIP
    >>> mlp = twell.torch.SparseMLP(2048, 5632, dtype=torch.bfloat16)  # doctest: +SKIP
    >>> with torch.no_grad():                                      # doctest: +SKIP
    ...     y = mlp(torch.randn(8, 128, 2048, dtype=torch.bfloat16))
    """

    @classmethod
    def from_linear(cls, up_proj, down_proj, *, slots="auto"):
        """The layer on two existing ``nn.Linear`` modules, which it holds (their weights are
        shared, not copied): ``up_proj`` ``d_model -> d_ff`` with no bias, ``down_proj``
        ``d_ff -> d_model``."""
        _check_linear(up_proj, "up_proj", bias_allowed=False)
        _check_linear(down_proj, "down_proj", bias_allowed=True)
        _check_pair(up_proj, "up_proj", down_proj, "down_proj")
        return cls._holding(slots, up_proj=up_proj, down_proj=down_proj)


class SparseGatedMLP(_SparseFFN):
    """``(relu(x @ gate_proj.weight.T) * (x @ up_proj.weight.T)) @ down_proj.weight.T
    (+ down_proj.bias)`` through TwELL, the up projection computed only where the gate is
    non-zero: the feed-forward layer of a Llama-style model with a ReLU gate.

    Parameters
    ----------
    d_model, d_ff : int
        Features of the input and output, and of the hidden layer.
    down_bias : bool, optional
        Whether ``down_proj`` has a bias (the gate and up projections have none). Default
        False.
    slots : int or "auto", optional
        Slots per (row, tile) of the gate's TwELL matrix, as for :func:`twell.sparse_ffn`.
    device, dtype : optional
        Of the weights, as for ``nn.Linear``.

    Attributes
    ----------
    gate_proj, up_proj : nn.Linear
        ``d_model -> d_ff``, no bias.
    down_proj : nn.Linear
        ``d_ff -> d_model``.

    See Also
    --------
    SparseMLP, twell.sparse_ffn, from_module
    """

    gated = True
    _inputs = ("gate_proj", "up_proj")

    @classmethod
    def from_linear(cls, gate_proj, up_proj, down_proj, *, slots="auto"):
        """The layer on three existing ``nn.Linear`` modules, which it holds (their weights
        are shared, not copied): ``gate_proj`` and ``up_proj`` ``d_model -> d_ff`` with no
        bias, ``down_proj`` ``d_ff -> d_model``."""
        _check_linear(gate_proj, "gate_proj", bias_allowed=False)
        _check_linear(up_proj, "up_proj", bias_allowed=False)
        _check_linear(down_proj, "down_proj", bias_allowed=True)
        if (up_proj.in_features, up_proj.out_features) != (gate_proj.in_features,
                                                            gate_proj.out_features):
            raise ValueError(
                f"up_proj must have gate_proj's shape, nn.Linear({gate_proj.in_features}, "
                f"{gate_proj.out_features}); got nn.Linear({up_proj.in_features}, "
                f"{up_proj.out_features})"
            )
        _check_pair(up_proj, "up_proj", down_proj, "down_proj")
        return cls._holding(slots, gate_proj=gate_proj, up_proj=up_proj, down_proj=down_proj)


def from_module(mlp, *, slots="auto"):
    """The sparse layer that computes what ``mlp`` computes, on its Linear layers (shared,
    not copied).

    Parameters
    ----------
    mlp : torch.nn.Module
        One of:

        - a gated MLP with ``gate_proj``, ``up_proj`` and ``down_proj`` Linear layers (the
          Llama layout) and a ReLU activation ``act_fn``: a :class:`SparseGatedMLP`;
        - an MLP with ``up_proj`` and ``down_proj``, or ``fc1`` and ``fc2``, and a ReLU
          activation (``act_fn``, ``act`` or ``activation``, where it has one): a
          :class:`SparseMLP`;
        - ``nn.Sequential(nn.Linear, nn.ReLU, nn.Linear)``: a :class:`SparseMLP`.
    slots : int or "auto", optional
        As for the layers.

    Returns
    -------
    SparseMLP or SparseGatedMLP

    Raises
    ------
    ValueError
        For another layout, an activation other than ReLU, or a bias before the activation.
    """
    if isinstance(mlp, nn.Sequential):
        layers = list(mlp)
        if (len(layers) == 3 and isinstance(layers[0], nn.Linear) and _is_relu(layers[1])
                and isinstance(layers[2], nn.Linear)):
            return SparseMLP.from_linear(layers[0], layers[2], slots=slots)
        raise ValueError(
            "an nn.Sequential must be (nn.Linear, nn.ReLU, nn.Linear); got "
            f"({', '.join(type(layer).__name__ for layer in layers)})"
        )
    for name in ("act_fn", "act", "activation"):
        _check_relu(mlp, name)
    if all(hasattr(mlp, n) for n in ("gate_proj", "up_proj", "down_proj")):
        return SparseGatedMLP.from_linear(mlp.gate_proj, mlp.up_proj, mlp.down_proj,
                                          slots=slots)
    for up, down in (("up_proj", "down_proj"), ("fc1", "fc2")):
        if hasattr(mlp, up) and hasattr(mlp, down):
            return SparseMLP.from_linear(getattr(mlp, up), getattr(mlp, down), slots=slots)
    raise ValueError(
        f"{type(mlp).__name__} is not a layout twell.torch knows: it needs gate_proj, "
        "up_proj and down_proj (gated), up_proj and down_proj or fc1 and fc2, or is an "
        "nn.Sequential(Linear, ReLU, Linear)"
    )
