"""Name expressions of the SpMV candidates (probe)."""
NAMES = []
for T in ("float", "double"):
    for G, L in ((1, 8), (2, 4), (4, 2), (4, 4), (8, 2), (8, 4), (16, 2)):
        for ov in ("false", "true"):
            NAMES.append(f"twell_spmv_one_tile<{T}, {ov}, {G}, {L}, int>")
    NAMES.append(f"twell_spmv_overflow_chunks<{T}>")
