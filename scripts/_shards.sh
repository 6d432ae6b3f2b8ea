# Sourced by gpu_check.sh and sanitize.sh: test_shards N fills the array `shards` with N
# space-separated lists of test files, dealt largest first (bytes: a proxy for the number of
# tests) in snake order, so that N pytest processes run for about the same time.
test_shards() {
    local n=$1 files i round pos j
    mapfile -t files < <(ls -S tests/test_*.py)
    shards=()
    for ((j = 0; j < n; j++)); do shards[j]=""; done
    for ((i = 0; i < ${#files[@]}; i++)); do
        round=$((i / n)) pos=$((i % n))
        j=$(( round % 2 == 0 ? pos : n - 1 - pos ))
        shards[j]="${shards[j]} ${files[i]}"
    done
}
