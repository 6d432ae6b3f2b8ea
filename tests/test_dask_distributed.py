"""twell.dask on a distributed cluster of CPU worker processes: blocks pickled to the workers,
products and files computed there, and a worker killed in the middle of a product.

The clusters are ``distributed.LocalCluster`` s of two single-threaded worker processes (each
under a nanny, which restarts a killed worker), so every block crosses a process boundary. The
GPU form of the same run, a ``dask_cuda.LocalCUDACluster``, is in the benchmark
(``benchmarks/bench.py --dask``).
"""

import os
import signal
import time

import numpy as np
import pytest
import scipy.sparse as sp
from helpers import MATMUL_RTOL

import twell

dask = pytest.importorskip("dask", reason="dask is not installed (pip install 'twell[dask]')")
da = pytest.importorskip("dask.array", reason="dask.array is not installed (pip install "
                         "'twell[dask]')")
distributed = pytest.importorskip("distributed", reason="distributed is not installed (pip "
                                  "install 'twell[test]')")
import twell.dask as tdask  # noqa: E402 - after the skips

F64 = np.dtype(np.float64)


def _cluster(**config):
    with dask.config.set({"distributed.scheduler.worker-ttl": None, **config}):
        return distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                        dashboard_address=":0", silence_logs=40)


@pytest.fixture(scope="module")
def client():
    cluster = _cluster()
    with distributed.Client(cluster) as c:
        yield c
    cluster.close()


def sparse_dense(rng, shape, density=0.05):
    x = rng.standard_normal(shape)
    x[rng.random(shape) >= density] = 0
    return x


def assert_product(got, x, b):
    """``got`` against scipy's CSR @ dense in float64: every row, by norm."""
    want = sp.csr_array(x) @ b
    assert got.shape == want.shape and got.dtype == F64
    np.testing.assert_allclose(got, want, rtol=MATMUL_RTOL[F64], atol=1e-12)


def test_persisted_blocks_live_on_both_workers(client, rng):
    x = sparse_dense(rng, (400, 700))
    A = tdask.from_dask_array(da.from_array(x, chunks=(50, 350)), tile_width=128).persist()
    futures = distributed.futures_of(A.to_delayed())
    assert len(futures) == 8
    distributed.wait(futures)
    holders = client.who_has(futures)
    assert len(holders) == 8
    assert all(len(h) == 1 for h in holders.values())
    assert len({h[0] for h in holders.values()}) == 2  # spread, not all on one worker
    b = rng.standard_normal((700, 9))
    y = A @ da.from_array(b, chunks=(700, 5))
    assert_product(y.compute(), x, b)
    assert A.nnz == np.count_nonzero(x)
    np.testing.assert_array_equal(sp.vstack(A.tocsr()).toarray(), x)


def test_blocks_cross_processes_unchanged(client, rng):
    """A block packed on a worker and brought back is the block packed here, array for array."""
    x = sparse_dense(rng, (90, 300), density=0.4)
    A = tdask.from_dask_array(da.from_array(x, chunks=(30, 300)), tile_width=64, slots=3)
    for got, rows in zip(A.to_blocks(), (slice(0, 30), slice(30, 60), slice(60, 90)),
                         strict=True):
        want = twell.TwELLMatrix(x[rows], tile_width=64, slots=3)
        assert got.overflow_nnz == want.overflow_nnz > 0
        for name in ("counts", "data", "indices", "overflow_indptr", "overflow_indices",
                     "overflow_data"):
            np.testing.assert_array_equal(getattr(got, name), getattr(want, name))


def test_save_and_load_on_the_workers(client, rng, tmp_path):
    x = sparse_dense(rng, (120, 260), density=0.2)
    A = tdask.from_dask_array(da.from_array(x, chunks=(40, 130)), tile_width=64, slots=2)
    A.save(tmp_path / "m")
    B = tdask.load(tmp_path / "m")
    assert B.row_chunks == (40, 40, 40)
    np.testing.assert_array_equal(B.to_dask_array().compute(), x)
    v = rng.standard_normal(260)
    assert_product((B @ v).compute(), x, v)


def _slowly(chunk):
    time.sleep(0.4)  # long enough to be killed mid-task
    return chunk


def _kill_a_busy_worker(client, timeout=30.0):
    """SIGKILL the process of the first worker seen running a task (the cluster runs only the
    product, so the task is one of it). Returns the worker's address."""
    pids = client.run(os.getpid)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for worker, running in client.processing().items():
            if running:
                os.kill(pids[worker], signal.SIGKILL)
                return worker
        time.sleep(0.01)
    raise AssertionError("no worker ever ran the product's tasks")


def _product_under_fault(client, rng, persisted=False):
    """``A @ B`` with a worker killed while it runs one of the product's tasks.

    ``persisted``: A's blocks are packed on the workers first, and the slow tasks are B's, so
    the killed worker takes persisted blocks with it; otherwise A's rows come from slow tasks.
    """
    x = sparse_dense(rng, (320, 500))
    b = rng.standard_normal((500, 7))
    rows = da.from_array(x, chunks=(40, 500))
    rhs = da.from_array(b, chunks=(500, 7))
    if persisted:
        A = tdask.from_dask_array(rows, tile_width=128).persist()
        distributed.wait(distributed.futures_of(A.to_delayed()))
        rhs = rhs.map_blocks(_slowly, dtype=b.dtype)
    else:
        A = tdask.from_dask_array(rows.map_blocks(_slowly, dtype=x.dtype), tile_width=128)
    futures = client.compute((A @ rhs).to_delayed().ravel().tolist())
    killed = _kill_a_busy_worker(client)
    return futures, x, b, killed


@pytest.mark.parametrize("persisted", [False, True], ids=["lazy", "persisted"])
def test_a_worker_killed_mid_product_is_survived(client, rng, persisted):
    """The scheduler reruns the lost worker's tasks (and repacks the blocks it held): every row
    of the product, exact as ever."""
    futures, x, b, killed = _product_under_fault(client, rng, persisted)
    got = np.vstack(client.gather(futures))
    assert_product(got, x, b)
    assert killed not in client.scheduler_info()["workers"]  # the process really died
    client.wait_for_workers(2, timeout=60)  # its nanny starts a new one


def test_a_worker_killed_mid_product_is_reported():
    """With no failures allowed, the product fails with Dask's KilledWorker; nothing is lost
    silently (no partial result is returned)."""
    cluster = _cluster(**{"distributed.scheduler.allowed-failures": 0})
    with distributed.Client(cluster) as c:
        futures, _, _, _ = _product_under_fault(c, np.random.default_rng(7))
        with pytest.raises(distributed.scheduler.KilledWorker):
            c.gather(futures)
    cluster.close()
