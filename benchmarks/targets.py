"""Row queries, the speed-up ratios of each twell row, and the targets each suite checks.

GPU targets: those of issue 3 (GPU performance). CPU targets: those of issue 36 (the host path
at scipy's speed; the bytes of a TwELLMatrix against the CSR's).
"""

import statistics

from arrays import TOLERANCE

#: Statuses whose rows carry a time.
TIMED = ("ok", "wrong", "model")

#: Contender families, in the order of the GPU table's columns; ``scipy`` is the CPU suite's.
FAMILIES = ("dense", "cupyx", "torch", "ref", "scipy")


def group_key(row):
    return (row["case"], row["op"], row["param"])


def find(rows, **where):
    return [r for r in rows if all(r.get(k) == v for k, v in where.items())]


def best(rows, **where):
    """The fastest correct row matching ``where``, or None."""
    ok = [r for r in find(rows, **where) if r["status"] in ("ok", "model") and r["ms"]]
    return min(ok, key=lambda r: r["ms"]) if ok else None


def twell_row(rows, **where):
    """The twell row with the default (auto) slots, else the first twell row."""
    cands = [r for r in find(rows, family="twell", **where) if r["status"] in TIMED]
    auto = [r for r in cands if "auto" in r["variant"]]
    return (auto or cands or [None])[0]


def add_ratios(rows, case_id):
    """For every twell row of the case: ``speedup[c] = ms(c) / ms(twell)`` for each contender
    and ``speedup_best[family]`` for the fastest correct one of each family."""
    groups = {}
    for r in rows:
        if r["case"] == case_id:
            groups.setdefault(group_key(r), []).append(r)
    for group in groups.values():
        for tw in group:
            if tw["family"] != "twell" or tw["status"] not in TIMED:
                continue
            tw["speedup"] = {
                f"{r['contender']} {r['variant']}".strip(): r["ms"] / tw["ms"]
                for r in group if r is not tw and r["status"] in TIMED and r["ms"]
            }
            fastest = {}
            for r in group:
                if r["family"] in FAMILIES and r["status"] in ("ok", "model") and r["ms"]:
                    if r["family"] not in fastest or r["ms"] < fastest[r["family"]]:
                        fastest[r["family"]] = r["ms"]
            tw["speedup_best"] = {f: ms / tw["ms"] for f, ms in fastest.items()}


def _twell_failed(rows, **where):
    return any(r["status"] == "failed" for r in find(rows, family="twell", **where))


def _ratio_target(rows, name, threshold, twell_where, other, **other_where):
    tw = twell_row(rows, **twell_where)
    base = best(rows, **{**twell_where, **other_where, "family": other})
    value = base["ms"] / tw["ms"] if tw and base else None
    met = None if value is None else bool(value >= threshold and tw["status"] == "ok")
    if tw is None and _twell_failed(rows, **twell_where):
        met = False  # twell ran and failed: a miss, not a gap in the run
    return {"target": name, "value": value, "threshold": threshold, "met": met,
            "twell_ms": tw and tw["ms"], "other_ms": base and base["ms"],
            "other": base and base["contender"],
            "twell_status": tw["status"] if tw else "failed" if met is False else None}


def gpu_targets(rows):
    """The targets of issue 3, read off this run's rows."""
    out = []
    for s, fam, thr, name in ((0.99, "dense", 3.0, "SpMM 99% bf16 vs dense cuBLAS"),
                              (0.99, "ref", 3.0, "SpMM 99% bf16 vs reference T2D"),
                              (0.99, "torch", 8.0, "SpMM 99% bf16 vs cuSPARSE CSR (torch)"),
                              (0.95, "dense", 1.0, "SpMM 95% bf16 vs dense cuBLAS"),
                              (0.90, "torch", 2.0, "SpMM 90% bf16 vs cuSPARSE CSR (torch)")):
        out.append(_ratio_target(rows, name, thr, dict(workload="ffn", dtype="bf16",
                                                       sparsity=s, op="spmm"), fam))
    for s, fam, thr, name in (
            (0.99, "ref", 1.0, "D2T 99% bf16 vs reference D2T (no slower)"),
            (0.99, "composed", 1.0, "D2T 99% bf16 vs cuBLAS GEMM + ReLU + twell pack"),
            (0.99, "dense", 1.8, "gated FFN 99% bf16 vs dense (3 GEMMs)"),
            (0.95, "dense", 1.0, "gated FFN 95% bf16 vs dense (3 GEMMs)")):
        op = "gemm+pack" if name.startswith("D2T") else "gated ffn"
        out.append(_ratio_target(rows, name, thr, dict(workload="ffn", dtype="bf16",
                                                       sparsity=s, op=op), fam))
    for s, thr, name in ((0.99, 1.3, "gated FFN 99% bf16 module in a CUDA graph vs dense"),
                         (0.95, 1.0, "gated FFN 95% bf16 module in a CUDA graph vs dense")):
        out.append(_ratio_target(rows, name, thr, dict(
            workload="ffn", dtype="bf16", sparsity=s, op="gated ffn",
            variant="module, CUDA graph"), "dense", variant=""))
    where = dict(workload="ffn", dtype="bf16", sparsity=0.90, op="spmm")
    tw = twell_row(rows, **where)
    out.append({"target": "SpMM 90% bf16 lossless (overflow kept)",
                "value": tw and tw.get("rel_err"), "threshold": TOLERANCE["bf16"],
                "met": tw["status"] == "ok" if tw else False if _twell_failed(rows, **where)
                else None})
    out.append(_ratio_target(rows, "SpMM 99% fp32 vs cupyx CSR", 5.0,
                             dict(workload="ffn", dtype="fp32", sparsity=0.99, op="spmm"), "cupyx"))
    # Hot neurons and scientific matrices: faster than cuSPARSE (best of cupyx/torch) everywhere.
    for wl in ("hot", "sci"):
        worst = None
        for tw in find(rows, workload=wl, op="spmm", family="twell"):
            if tw["status"] not in TIMED or (wl == "hot" and "auto" not in tw["variant"]):
                continue
            where = dict(case=tw["case"], op="spmm", param=tw["param"])
            base = [b for b in (best(rows, family=f, **where) for f in ("cupyx", "torch")) if b]
            if not base:
                continue
            b = min(base, key=lambda r: r["ms"])
            v = b["ms"] / tw["ms"]
            d = best(rows, family="dense", **where)
            item = {"case": f"{tw['case']} {tw['param']} {tw['variant']}".strip(), "value": v,
                    "vs_dense": d and d["ms"] / tw["ms"]}
            if worst is None or v < worst["value"]:
                worst = item
        out.append({"target": f"SpMM {wl}: faster than cuSPARSE on every case (worst)",
                    "value": worst and worst["value"], "threshold": 1.0,
                    "met": None if worst is None else worst["value"] > 1.0, "worst": worst})
    packs = [r for r in find(rows, workload="ffn", op="pack", family="twell")
             if r["status"] in TIMED and r.get("frac_copy")]
    low = min(packs, key=lambda r: r["frac_copy"]) if packs else None
    out.append({"target": "pack dense->TwELL: fraction of copy bandwidth (worst ffn case)",
                "value": low and low["frac_copy"], "threshold": 0.75,
                "met": None if low is None else low["frac_copy"] >= 0.75,
                "case": low and f"{low['case']} {low['variant']}"})
    for s in (0.99, 0.95, 0.90):
        out.append(_ratio_target(rows, f"pack fp32 {s:.0%} vs cupyx csr_matrix(dense)", 10.0,
                                 dict(workload="ffn", dtype="fp32", sparsity=s, op="pack"),
                                 "cupyx"))
    for op in ("csr->twell", "twell->csr", "twell->dense"):
        fr = [r["frac_copy"] for r in find(rows, op=op, family="twell")
              if r["status"] in TIMED and r.get("frac_copy")]
        out.append({"target": f"{op}: fraction of copy bandwidth (min / median / max)",
                    "value": [min(fr), statistics.median(fr), max(fr)] if fr else None,
                    "threshold": None, "met": None})
    return out


#: The CPU suite's ceilings on twell / scipy, per operation (issue 36); ``nbytes`` compares
#: the bytes of ``TwELLMatrix(csr)`` with those of the CSR matrix.
CPU_TARGETS = {"spmv": 1.5, "spmm": 1.5, "transpose": 3.0, "csr->twell": 2.0,
               "twell->csr": 2.0, "twell->dense": 1.5, "pack": 1.2, "nbytes": 3.0}


def cpu_targets(rows):
    """One target per twell row of the CPU suite: twell / scipy at most ``CPU_TARGETS[op]``.

    A row that twell could not run (failed, or skipped for want of time or memory) misses;
    one skipped because the operation does not apply (a dense form of a large matrix) is
    left out.
    """
    out = []
    order = list(CPU_TARGETS)
    cases = list(dict.fromkeys(r["case"] for r in rows))
    twells = sorted(find(rows, family="twell", workload="cpu"),
                    key=lambda r: (cases.index(r["case"]),
                                   order.index(r["op"]) if r["op"] in order else len(order)))
    for tw in twells:
        thr = CPU_TARGETS.get(tw["op"])
        if thr is None or (tw["status"] == "skipped" and tw.get("not_applicable")):
            continue
        value = tw.get("twell_over_scipy")
        if value is None:
            met = False if tw["status"] in ("failed", "skipped", "wrong") else None
        else:
            met = bool(value <= thr and tw["status"] in ("ok", "size"))
        out.append({"target": f"{tw['op']} {tw['matrix']} {tw['dtype']}: twell / scipy",
                    "value": value, "threshold": thr, "compare": "<=", "met": met,
                    "case": tw["case"], "op": tw["op"], "contender": tw["contender"],
                    "twell_status": tw["status"]})
    return out


def targets(rows, suite):
    return cpu_targets(rows) if suite == "cpu" else gpu_targets(rows)


def targets_lines(items):
    """The targets as text, one line each: value, goal, verdict and what it compares."""
    out = []
    for t in items:
        v = t["value"]
        le = t.get("compare") == "<="
        if isinstance(v, list):
            text = " / ".join(f"{x:.0%}" for x in v)
        elif v is None:
            text = "twell FAILED" if t["met"] is False else "not measured"
        elif "fraction" in t["target"]:
            text = f"{v:.0%}"
        elif "lossless" in t["target"]:
            text = f"rel. error {v:.1e}"
        else:
            text = f"x{v:.2f}"
        thr = t["threshold"]
        goal = "" if thr is None or "lossless" in t["target"] else (
            f"(<= x{thr:g})" if le else
            f"(>= {thr:.0%})" if "fraction" in t["target"] else f"(>= x{thr:g})")
        verdict = {True: "met", False: "MISSED", None: "-"}[t["met"]]
        extra = ""
        if le:
            extra = "" if t.get("twell_status") in ("ok", "size") else \
                f"  (twell {t.get('twell_status')})"
        elif t.get("worst"):
            w = t["worst"]
            extra = f"  worst: {w['case']}" + (
                f", x{w['vs_dense']:.2f} vs dense" if w.get("vs_dense") else "")
        elif t.get("other") and t.get("twell_ms"):
            extra = f"  ({t['twell_ms']:.3f} ms vs {t['other']} {t['other_ms']:.3f} ms" + (
                ", twell result WRONG" if t.get("twell_status") == "wrong" else "") + ")"
        elif t.get("other"):
            extra = f"  (twell not timed; {t['other']} {t['other_ms']:.3f} ms)"
        elif t.get("case"):
            extra = f"  ({t['case']})"
        out.append(f"  {t['target']:<58} {text:>16} {goal:>9}  {verdict}{extra}")
    return out
