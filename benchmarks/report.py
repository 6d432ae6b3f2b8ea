"""The text report: a header, the table of each suite, failures, the sweep fit and the targets.

Written beside the JSON with the suffix ``.txt`` and printed.
"""

import pathlib
import sys

import numpy as np
from arrays import short_error
from targets import CPU_TARGETS, TIMED, best, find, group_key, targets, targets_lines


def sweep_summary(rows):
    """bf16 FFN SpMM against the number of non-zeros, with a least-squares line.

    ``twell_ms`` is what ``A @ B`` takes with ``slots="auto"``, by the route twell chooses (its
    gather kernel, or cuBLAS on ``A.toarray()`` above the dense crossover); the line is fitted
    to it. ``gather_ms`` is the time of a row recorded as the gather kernel's (``impl``), where
    a result says so.
    """
    pts = []
    for r in rows:
        if (r["op"] == "spmm" and r["dtype"] == "bf16" and r["workload"] in ("ffn", "sweep")
                and r["family"] == "twell" and "auto" in r["variant"] and r["status"] in TIMED):
            same = dict(case=r["case"], op="spmm")
            dense, torch_, ref = (best(rows, family=f, **same) for f in ("dense", "torch", "ref"))
            gather = [g for g in find(rows, family="twell", **same)
                      if g.get("impl") == "gather" and g["status"] in TIMED]
            pts.append({"sparsity": r["sparsity"], "nnz": r.get("nnz"), "twell_ms": r["ms"],
                        "impl": r.get("impl", ""),
                        "gather_ms": gather[0]["ms"] if gather else None,
                        "dense_ms": dense and dense["ms"], "torch_csr_ms": torch_ and torch_["ms"],
                        "ref_t2d_ms": ref and ref["ms"], "status": r["status"]})
    pts.sort(key=lambda p: p["sparsity"])
    fit = None
    xy = [(p["nnz"] / 1e6, p["twell_ms"]) for p in pts if p["nnz"] and p["twell_ms"]]
    if len(xy) >= 3:
        x, y = np.array(xy).T
        slope, intercept = np.polyfit(x, y, 1)
        pred = slope * x + intercept
        ss = float(((y - y.mean()) ** 2).sum())
        r2 = 1 - float(((y - pred) ** 2).sum()) / ss if ss else 1.0
        fit = {"ms_per_million_nnz": float(slope), "intercept_ms": float(intercept), "r2": r2,
               "nnz_ratio_max_min": float(x.max() / x.min()),
               "time_ratio_max_min": float(y[x.argmax()] / y[x.argmin()])}
    return {"points": pts, "fit": fit}


# -- cells --------------------------------------------------------------------------------


def fmt_ms(row):
    if row is None:
        return "-"
    if row["status"] == "failed":
        return "FAIL"
    if row["status"] == "skipped":
        return "skip"
    ms = row["ms"]
    text = f"{ms:.3f}" if ms < 10 else f"{ms:.2f}" if ms < 100 else f"{ms:.1f}"
    return ("~" if row["status"] == "model" else "") + text + (
        "!" if row["status"] == "wrong" else "")


def fmt_ratio(v):
    if v is None:
        return "-"
    return f"{v:.2f}" if v < 10 else f"{v:.1f}" if v < 1000 else f"{v:.0f}"


def fmt_bytes(n):
    """``1.5G``, ``320M``, ``12K``: decimal units, two or three significant digits."""
    if n is None:
        return "-"
    for unit, scale in (("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            v = n / scale
            return f"{v:.1f}{unit}" if v < 10 else f"{v:.0f}{unit}"
    return f"{n}B"


def _family_cell(group, family):
    rows = [r for r in group if r["family"] == family]
    timed = [r for r in rows if r["status"] in ("ok", "model")]
    if timed:
        return min(timed, key=lambda r: r["ms"])
    wrong = [r for r in rows if r["status"] == "wrong"]
    return wrong[0] if wrong else (rows[0] if rows else None)


def _line(columns, cells):
    return " ".join(f"{str(c):{a}{w}}"
                    for c, (_, w, a) in zip(cells, columns, strict=True)).rstrip()


# -- the GPU table ------------------------------------------------------------------------

#: The families of the GPU table's columns, in order.
GPU_FAMILIES = ("dense", "cupyx", "torch", "ref")
GPU_ORDER = ("pack", "gemm+pack", "gated ffn", "csr->twell", "twell->csr", "twell->dense",
             "spmv", "spmm", "cg", "gmres")
GPU_COLUMNS = (("op", 12, "<"), ("wl", 5, "<"), ("dt", 4, "<"), ("case", 13, "<"),
               ("variant", 19, "<"), ("twell", 8, ">"), ("dense", 8, ">"), ("cupyx", 8, ">"),
               ("torch", 8, ">"), ("ref", 8, ">"), ("xdense", 6, ">"), ("xcupyx", 6, ">"),
               ("xtorch", 6, ">"), ("xref", 6, ">"), ("GB/s", 6, ">"), ("%copy", 5, ">"),
               ("peak", 6, ">"), ("pk/io", 5, ">"))


def gpu_table_lines(rows, cases):
    """One line per twell row (or per group without one), grouped by operation, SpMM last."""
    labels = {c.id: c for c in cases}
    groups = {}
    for r in rows:
        groups.setdefault(group_key(r), []).append(r)
    header = _line(GPU_COLUMNS, [c for c, _, _ in GPU_COLUMNS])
    out = []
    for op in GPU_ORDER:
        section = [(key, g) for key, g in groups.items() if key[1] == op]
        if not section:
            continue
        out += ["", header]
        for (case_id, _, param), group in section:
            case = labels.get(case_id)
            label = (case.label if case else case_id) + (f" {param}" if param else "")
            base = [_family_cell(group, f) for f in GPU_FAMILIES]
            for tw in [r for r in group if r["family"] == "twell"] or [None]:
                ratios = []
                for b in base:
                    ok = (tw is not None and tw["status"] in TIMED and b is not None
                          and b["status"] in TIMED)
                    ratios.append(fmt_ratio(b["ms"] / tw["ms"]) if ok else "-")
                gbps = tw.get("GBps") if tw else None
                frac = tw.get("frac_copy") if tw else None
                peak = tw.get("peak_bytes") if tw else None
                pk_io = tw.get("peak_over_io") if tw else None
                out.append(_line(GPU_COLUMNS, [
                    op, group[0]["workload"], group[0]["dtype"], label,
                    (tw["variant"] if tw else "(no twell row)"), fmt_ms(tw),
                    *map(fmt_ms, base), *ratios, f"{gbps:.0f}" if gbps else "-",
                    f"{frac:.0%}" if frac else "-", fmt_bytes(peak),
                    f"{pk_io:.2f}" if pk_io is not None else "-"]))
    return out[1:]


# -- the CPU table ------------------------------------------------------------------------

#: The CPU table's order of operations: issue 36's.
CPU_ORDER = tuple(CPU_TARGETS)
CPU_COLUMNS = (("op", 12, "<"), ("matrix", 11, "<"), ("dt", 4, "<"), ("twell", 24, "<"),
               ("scipy", 19, "<"), ("variant", 13, "<"), ("twell ms", 9, ">"),
               ("scipy ms", 9, ">"), ("twell/scipy", 11, ">"), ("target", 6, ">"))


def cpu_table_lines(rows, cases):
    """One line per (matrix, dtype, operation), in the order of ``CPU_ORDER``: twell's time,
    scipy's and their ratio (above 1: twell slower); for ``nbytes`` the bytes instead of the
    times. Skipped rows and their reasons follow the table."""
    groups = {}
    for r in rows:
        groups.setdefault(r["case"], {}).setdefault((r["op"], r["param"]), []).append(r)
    out = [_line(CPU_COLUMNS, [c for c, _, _ in CPU_COLUMNS])]
    for ops in groups.values():
        if len(out) > 1:
            out.append("")
        for (op, param), group in sorted(ops.items(), key=lambda kv: _cpu_rank(kv[0][0])):
            tw = next((r for r in group if r["family"] == "twell"), None)
            sc = next((r for r in group if r["family"] == "scipy"), None)
            first = tw or sc
            if op == "nbytes":
                cells = [fmt_bytes(r and r.get("bytes")) for r in (tw, sc)]
            else:
                cells = [fmt_ms(tw), fmt_ms(sc)]
            out.append(_line(CPU_COLUMNS, [
                op + (f" {param}" if param else ""), first["matrix"], first["dtype"],
                tw["contender"] if tw else "-", sc["contender"] if sc else "-",
                tw["variant"] if tw else "", *cells,
                fmt_ratio(tw and tw.get("twell_over_scipy")),
                f"{CPU_TARGETS[op]:g}" if op in CPU_TARGETS else "-"]))
    skipped = {}
    for r in rows:
        if r["status"] == "skipped":
            skipped.setdefault(r["note"], []).append(f"{r['matrix']} {r['dtype']} {r['op']}")
    if skipped:
        out += ["", "skipped:"]
        for note, where in skipped.items():
            out.append(f"  {', '.join(dict.fromkeys(where))}: {note}")
    return out


def _cpu_rank(op):
    return CPU_ORDER.index(op) if op in CPU_ORDER else len(CPU_ORDER)


# -- the report ---------------------------------------------------------------------------


def report(bench):
    """Print the header, the table, failures, the sweep fit and the targets; save as text.

    Each section is built on its own: a bug in one must not cost the others.
    """
    def section(build):
        try:
            return build()
        except Exception as exc:  # noqa: BLE001
            return [f"(this section failed: {short_error(exc)}; the JSON has the data)"]

    suite = bench.suite
    table = cpu_table_lines if suite == "cpu" else gpu_table_lines
    what = "issue 36" if suite == "cpu" else "issue 3"
    lines = []
    for build in (lambda: header_lines(bench), lambda: table(bench.rows, bench.cases),
                  lambda: problem_lines(bench), lambda: sweep_lines(bench.rows),
                  lambda: ["", f"targets ({what}; ratios from this run):",
                           *targets_lines(targets(bench.rows, suite))]):
        lines += section(build)
    lines += ["", f"{len(bench.rows)} rows in {bench.elapsed():.0f} s; JSON: {bench.args.out}"]
    text = "\n".join(lines)
    try:
        pathlib.Path(bench.args.out).with_suffix(".txt").write_text(text + "\n")
    except OSError as exc:
        print(f"could not write the table: {exc}", file=sys.stderr)
    print(text, flush=True)


def header_lines(bench):
    c, meta = bench.ceilings, bench.meta
    versions = (f"scipy {meta.get('scipy', '-')}, NumPy {meta['numpy']}" if bench.suite == "cpu"
                else f"CuPy {meta.get('cupy', '-')}, CUDA runtime {meta.get('cuda_runtime', '-')}"
                     f", torch {meta.get('torch') or '-'}")
    first = (f"twell bench ({bench.suite}): {meta['card']}; twell {meta['twell']} "
             f"(commit {(meta.get('git_commit') or '?')[:12]}, sources {meta['source_digest']}); "
             f"{versions}; {meta['date']}")
    if bench.suite == "cpu":
        load = meta.get("load_average")
        return [first,
                (f"copy {c['copy_GBps']:.3g} GB/s (read + written)" if c.get("copy_GBps") else
                 "copy bandwidth not measured")
                + (f"; load average at the start {load[0]:g} (1 min), {load[1]:g} (5 min) on "
                   f"{meta['device'].get('cores', '?')} cores" if load else ""),
                f"timing: {meta['timing']}, {bench.args.reps} runs (at least "
                f"{bench.args.min_reps} where a call takes over "
                f"{bench.args.max_timing_s / bench.args.reps:.2g} s); twell/scipy = twell ms / "
                "scipy ms (> 1: twell slower); for nbytes, bytes / bytes; every result checked "
                "against scipy's first; ! wrong result, FAIL/skip see JSON"]
    return [
        first + f"; kernels compiled in {meta.get('compile_s', '-')} s",
        "ceilings: copy {} GB/s (read + written), bf16 GEMM {} TFLOP/s, fp32 {} TFLOP/s, fp64 {} "
        "TFLOP/s".format(*(f"{c[k]:.4g}" if c.get(k) else "-" for k in (
            "copy_GBps", "bf16_gemm_TFLOPs", "fp32_gemm_TFLOPs", "fp64_gemm_TFLOPs"))),
        f"timing: {meta['timing']} of up to {bench.args.reps} runs; x<col> = contender ms / "
        "twell ms (> 1: twell faster); ! wrong result, ~ modelled, FAIL/skip see JSON; "
        "GB/s and %copy: twell's compulsory bytes / time; conversions: peak = twell's peak "
        "memory beyond its input, pk/io = peak / (input + output bytes)",
    ]


def problem_lines(bench):
    failed = [r for r in bench.rows if r["status"] == "failed"]
    wrong = [r for r in bench.rows if r["status"] == "wrong"]
    if not (failed or wrong or bench.notes):
        return []
    lines = ["", f"{len(failed)} failed, {len(wrong)} wrong, {len(bench.notes)} notes "
                 "(all in the JSON):"]
    for r in (failed + wrong)[:12]:
        what = r.get("error") or f"rel. error {r.get('rel_err')} > {r.get('tol')}"
        lines.append(f"  {r['status']}: {r['case']} {r['op']} {r['param']} {r['contender']} "
                     f"{r['variant']}: {what}")
    return lines + [f"  note: {x}" for x in bench.notes[:8]]


def sweep_lines(rows):
    f = sweep_summary(rows)["fit"]
    if not f:
        return []
    return ["", f"sweep (bf16 SpMM, A @ B by default, vs nnz): {f['ms_per_million_nnz']:.3f} ms "
                f"per million nnz + {f['intercept_ms']:.3f} ms, r2 {f['r2']:.3f}; nnz x"
                f"{f['nnz_ratio_max_min']:.0f} -> time x{f['time_ratio_max_min']:.1f}"]
