"""The measuring harness every suite shares: cases, rows, the check-then-time loop, the time
budget, the run's metadata and the JSON record (schema ``twell-bench/1``)."""

import dataclasses
import datetime
import hashlib
import json
import math
import os
import pathlib
import platform
import subprocess
import sys
import time
import traceback

import numpy as np
from arrays import jsonable, short_error
from report import sweep_summary
from targets import add_ratios, targets

import twell

REPO = pathlib.Path(__file__).resolve().parent.parent

SCHEMA = "twell-bench/1"

#: Conversions: each of their rows also gets its peak memory, from one more, untimed call.
PEAK_OPS = ("pack", "csr->twell", "twell->csr", "twell->dense")

#: Past this multiple of ``--time-budget``, the remaining cases are skipped.
HARD_STOP = 1.4

#: Past ``--time-budget``, a contender's timed loop is capped at this many seconds instead of
#: ``--max-timing-s``: calls shorter than it over ``--reps`` (an SpMV, a small conversion) keep
#: their ``--reps``, so that the suite's last cases are not medians of ``--min-reps`` runs
#: where more cost nothing; longer calls still drop towards ``--min-reps``.
TIGHT_TIMING_S = 0.05


@dataclasses.dataclass
class Case:
    id: str
    workload: str
    dtype: str
    label: str
    sparsity: float | None = None
    matrix: str | None = None
    info: dict = dataclasses.field(default_factory=dict)


class Bench:
    """Runs measurements, keeps rows and cases, writes the JSON."""

    def __init__(self, args, dev, suite, torch=None, ref=None):
        self.args, self.dev, self.suite, self.torch, self.ref = args, dev, suite, torch, ref
        self.xp, self.sp = dev.xp, dev.sp
        self.rows, self.cases, self.notes = [], [], []
        self.meta, self.ceilings = {}, {}
        self.t0 = self.budget_t0 = time.perf_counter()
        self.broken = False
        self.ops = set(args.ops)
        self.progress = None
        self.tdev = "cuda" if dev.gpu else "cpu"  # where torch tensors live
        self.torch_why = self.ref_error = None

    # -- time budget

    def elapsed(self):
        return time.perf_counter() - self.t0

    def budget_used(self):
        """Seconds on the budget clock (started once the set-up is done)."""
        return time.perf_counter() - self.budget_t0

    def tight(self):
        return self.budget_used() > self.args.time_budget

    def stopped(self):
        return self.broken or self.budget_used() > HARD_STOP * self.args.time_budget

    def plan(self, est_s):
        """(reps, extra warm-ups) for one contender whose call takes ``est_s`` seconds."""
        a = self.args
        tight = self.tight()
        cap = min(TIGHT_TIMING_S, a.max_timing_s) if tight else a.max_timing_s
        reps = int(min(a.reps, max(a.min_reps, cap / max(est_s, 1e-7))))
        return reps, 0 if tight else max(0, a.warmup - 2)

    # -- rows

    def _row(self, case, op, contender, family, variant, param, impl, note):
        return {
            "case": case.id, "workload": case.workload, "dtype": case.dtype, "label": case.label,
            "sparsity": case.sparsity, "matrix": case.matrix, "op": op, "param": param,
            "contender": contender, "family": family, "variant": variant, "impl": impl,
            "status": None, "ms": None, "note": note,
        }

    def skip(self, case, op, contender, reason, *, family, variant="", param="", impl="",
             not_applicable=False):
        """A skipped row; ``not_applicable``: the operation does not apply (no target)."""
        if op not in self.ops:
            return None
        row = self._row(case, op, contender, family, variant, param, impl, "")
        row.update(status="skipped", note=reason)
        if not_applicable:
            row["not_applicable"] = True
        self.rows.append(row)
        return row

    def model(self, case, op, contender, ms, *, family, param="", note=""):
        if op not in self.ops:
            return None
        row = self._row(case, op, contender, family, "", param, "model", note)
        row.update(status="model", ms=ms)
        self.rows.append(row)
        return row

    def size(self, case, op, contender, nbytes, *, family, variant="", note=""):
        """A row that records bytes, not time (status ``size``)."""
        if op not in self.ops:
            return None
        row = self._row(case, op, contender, family, variant, "", "", note)
        row.update(status="size", bytes=int(nbytes))
        self.rows.append(row)
        return row

    def measure(self, case, op, contender, fn, *, family, nbuf=1, check=None, nbytes=None,
                flops=None, variant="", param="", impl="", note="", keep=False):
        """Check once, warm up, time; record one row. Returns the row (and the first result).

        ``fn(i)`` runs the contender on input set ``i % nbuf`` and returns its result.
        ``check(result)`` returns ``(relative error, tolerance)``. ``nbytes``/``flops`` are
        numbers or functions of the result. Any exception becomes a ``failed`` row.
        """
        if op not in self.ops:
            return (None, None) if keep else None
        row = self._row(case, op, contender, family, variant, param, impl, note)
        first = None
        if self.stopped():
            row.update(status="skipped",
                       note="CUDA context broken" if self.broken else "over the time budget")
            self.rows.append(row)
            return (row, None) if keep else row
        if self.progress:
            self.progress.op(f"{op} {param} {contender} {variant}".replace("  ", " "))
        try:
            t = time.perf_counter()
            first = fn(0)
            self.dev.sync()
            first_s = time.perf_counter() - t
            row["first_call_s"] = round(first_s, 4)
            if check is not None:
                err, tol = check(first)
                row["rel_err"], row["tol"] = err, tol
                ok = err is not None and math.isfinite(err) and err <= tol
                row["status"] = "ok" if ok else "wrong"
            else:
                row["status"] = "ok"
            for key, value in (("bytes", nbytes), ("flops", flops)):
                if value is not None:
                    row[key] = int(value(first) if callable(value) else value)
            if not keep:
                first = None
            if self.dev.plan_from_first:  # the checked call warmed up and sizes the reps
                done, est_s = 1, first_s
            else:  # the first call compiled: a second one sizes the reps
                t = time.perf_counter()
                fn(1 % nbuf)
                self.dev.sync()
                done, est_s = 2, time.perf_counter() - t
            reps, extra = self.plan(est_s)
            for w in range(extra):
                fn((done + w) % nbuf)
            self.dev.sync()
            times = self.dev.timed(fn, nbuf, done + extra, reps)
            ms = self.dev.summary(times)
            row.update(ms=ms, ms_min=min(times), ms_max=max(times), reps=reps,
                       warmup=done + extra, buffers=nbuf, times_ms=[round(x, 5) for x in times])
            if row.get("bytes"):
                row["GBps"] = row["bytes"] / ms / 1e6
                if self.ceilings.get("copy_GBps"):
                    row["frac_copy"] = row["GBps"] / self.ceilings["copy_GBps"]
            if row.get("flops"):
                row["TFLOPs"] = row["flops"] / ms / 1e9
            if op in PEAK_OPS and self.dev.measures_peak:
                self._peak(case, row, fn)
        except Exception as exc:  # noqa: BLE001 - one contender must not stop the suite
            row.update(status="failed", error=short_error(exc),
                       traceback=traceback.format_exc(limit=6)[-2000:])
            first = None
            self.dev.release()
            if not self.dev.healthy():
                self.broken = True
                self.notes.append(f"CUDA context broken after {case.id} {op} {contender}: "
                                  f"{row['error']}; the remaining measurements were skipped")
        self.rows.append(row)
        return (row, first) if keep else row

    def _peak(self, case, row, fn):
        """One more, untimed call of a conversion on input set 0: ``peak_bytes`` and
        ``peak_over_io`` (peak / (input + output bytes), the row's ``bytes``).

        A failure here (out of memory, say) is recorded as ``peak_error`` and keeps the timing.
        """
        try:
            peak = int(self.dev.peak_bytes(lambda: fn(0)))
        except Exception as exc:  # noqa: BLE001 - the timing is already measured
            row["peak_error"] = short_error(exc)
            self.dev.release()
            if not self.dev.healthy():
                self.broken = True
                self.notes.append(f"CUDA context broken after {case.id} {row['op']} "
                                  f"{row['contender']} (peak memory): {row['peak_error']}")
            return
        row["peak_bytes"] = peak
        if row.get("bytes"):
            row["peak_over_io"] = peak / row["bytes"]

    def guarded(self, case, op, block, param=""):
        """Run one operation's block; a set-up failure becomes a failed row, not a lost case."""
        if op not in self.ops or self.stopped():
            return
        try:
            block()
        except Exception as exc:  # noqa: BLE001
            row = self._row(case, op, "twell", "twell", "", param, "", "")
            row.update(status="failed", error="set-up failed: " + short_error(exc),
                       traceback=traceback.format_exc(limit=6)[-2000:])
            self.rows.append(row)
            self.notes.append(f"{case.id} {op} {param}: set-up failed: {short_error(exc)}")
            self.dev.release()
            if not self.dev.healthy():
                self.broken = True

    def time_only(self, fn, reps=10):
        """Milliseconds of ``fn(0)`` after 3 warm-ups (for the ceilings), by the device's
        statistic."""
        for _ in range(3):
            fn(0)
        self.dev.sync()
        return self.dev.summary(self.dev.timed(fn, 1, 0, reps))

    # -- output

    def finish_case(self, case):
        self.cases.append(case)
        add_ratios(self.rows, case.id)
        self.save()

    def document(self):
        return {
            "schema": SCHEMA,
            "meta": self.meta,
            "ceilings": self.ceilings,
            "cases": [dataclasses.asdict(c) for c in self.cases],
            "rows": self.rows,
            "sweep": sweep_summary(self.rows),
            "targets": targets(self.rows, self.suite),
            "notes": self.notes,
            "elapsed_s": round(self.elapsed(), 2),
        }

    def save(self):
        """Write the JSON (through a temporary file: a killed run leaves the last whole one)."""
        path = pathlib.Path(self.args.out)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(self.document(), indent=1, default=jsonable))
        os.replace(tmp, path)


class Progress:
    """A tqdm bar over the cases on a terminal; else one stderr line per case (logs, pipes)."""

    def __init__(self, total, enabled):
        self.total, self.i, self.bar = total, 0, None
        self.enabled = enabled
        self.t0 = time.perf_counter()
        if enabled and sys.stderr.isatty():
            try:
                from tqdm import tqdm

                self.bar = tqdm(total=total, unit="case", file=sys.stderr, mininterval=1.0,
                                dynamic_ncols=True)
            except ImportError:
                self.bar = None

    def start(self, label):
        if self.bar is not None:
            self.bar.set_description(label)
        elif self.enabled:
            print(f"[{min(self.i + 1, self.total)}/{self.total} "
                  f"{time.perf_counter() - self.t0:5.0f} s] {label}", file=sys.stderr, flush=True)

    def op(self, text):
        if self.bar is not None:
            self.bar.set_postfix_str(text[:40], refresh=False)

    def done(self):
        self.i += 1
        if self.bar is not None:
            self.bar.update(1)

    def close(self):
        if self.bar is not None:
            self.bar.close()


# -- metadata -------------------------------------------------------------------------------


def git(*argv):
    try:
        out = subprocess.run(["git", *argv], cwd=REPO, capture_output=True, text=True, timeout=20)
        return out.stdout.strip() if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def source_digest():
    """SHA-256 over twell's Python and CUDA sources: identifies the code without git."""
    h = hashlib.sha256()
    for folder, pattern in (("twell", "**/*.py"), ("cuda_src", "*.cu*")):
        for path in sorted((REPO / folder).glob(pattern)):
            h.update(str(path.relative_to(REPO / folder)).encode())
            h.update(path.read_bytes())
    return h.hexdigest()[:16]


def collect_meta(bench, argv):
    args, dev, torch = bench.args, bench.dev, bench.torch
    mode = "gpu" if dev.gpu else "cpu" if bench.suite == "cpu" else "cpu-dry-run"
    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "suite": bench.suite,
        "card": dev.card,
        "device": dev.props,
        "mode": mode,
        "host": platform.node(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "twell": twell.__version__,
        "git_commit": args.commit or git("rev-parse", "HEAD"),
        "git_dirty": None,
        "source_digest": source_digest(),
        "argv": argv,
        "args": vars(args),
        "timing": dev.timing_method(),
        # Other work on the host slows every contender: the 1, 5 and 15-minute load averages.
        "load_average": load_average(),
        "env": {k: os.environ.get(k) for k in ("CUPY_TF32", "CUDA_VISIBLE_DEVICES",
                                               "CUPY_CUDA_PER_THREAD_DEFAULT_STREAM",
                                               "NVIDIA_TF32_OVERRIDE", "OMP_NUM_THREADS",
                                               "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")},
    }
    status = git("status", "--porcelain", "--untracked-files=no")
    meta["git_dirty"] = None if status is None else bool(status)
    for mod in ("scipy", "ml_dtypes"):
        try:
            meta[mod] = __import__(mod).__version__
        except Exception:  # noqa: BLE001
            meta[mod] = None
    meta.update(dev.versions())
    if bench.suite == "cpu":
        return meta
    if torch is not None:
        meta["torch"] = torch.__version__
        meta["torch_cuda"] = torch.version.cuda
        meta["torch_allow_tf32"] = bool(torch.backends.cuda.matmul.allow_tf32)
    else:
        meta["torch"] = None
        meta["torch_missing"] = bench.torch_why
    meta["reference"] = None if bench.ref is None else {
        "folder": bench.ref.folder, "build_s": round(bench.ref.build_s, 1)}
    if bench.ref_error:
        meta["reference_error"] = bench.ref_error
    return meta


def load_average():
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):  # not on this platform
        return None
