export PYTHONPATH=.
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
timeout 200 python -m pytest -q -x tests/test_ffn.py -k "gated" -p no:cacheprovider 2>&1 | tail -15
python benchmarks/prototypes/sparse_up/sparse_up.py 2>&1 | tail -8
python benchmarks/prototypes/sparse_up/upphase.py 2>&1 | tail -8
python benchmarks/prototypes/sparse_up/host_profile.py 2>&1 | cut -c1-180 | head -90
python benchmarks/prototypes/sparse_up/d2t_profile.py 2>&1 | grep -v "^-\|^$" | tail -40 | cut -c1-170
