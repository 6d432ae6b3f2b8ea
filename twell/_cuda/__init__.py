"""The CuPy backend, a subpackage that mirrors ``cuda_src/``.

* :mod:`._backend`: the backend contract (:mod:`twell._contract`), as the rest of twell sees
  it (:func:`twell._backend.backend` returns it for CuPy arrays);
* one launcher module per source file of ``cuda_src/``: ``pack.cu`` -> :mod:`._pack`,
  ``unpack.cu`` -> :mod:`._unpack`, ``canonical.cu`` -> :mod:`._canonical`, ``cast.cu`` ->
  :mod:`._cast`, ``reduce.cu`` -> :mod:`._reduce`, ``spmm.cu`` -> :mod:`._spmm`, ``ffn.cu`` and
  ``matmul_pack_sm90.cu`` -> :mod:`._ffn`; :mod:`._launch` holds what they share;
* :mod:`._compile`, which finds, compiles and caches the sources, and :mod:`._tma`, the
  tensor maps of the Hopper kernels;
* :mod:`._policy`, every choice of kernel and shape with the cost model behind it.

Launchers trust their inputs (the public API validated them), cast every scalar to its C
type, allocate the outputs and compute the grid next to the launch. Everything runs on CuPy's
current stream; the device-to-host synchronisations are marked. Importing this package
itself imports nothing (the policy and the compiler tables load without CuPy).
"""
