# A/B of docs/experiments/tile_store.patch on a GPU (docs/benchmarks.md, "The byte stores as
# one tile"). Set up from a checkout, then run on the GPU machine:
#   mkdir -p bench_var && cp -r gpu bench_var/gpu_head && cp -r gpu bench_var/gpu_new
#   (cd bench_var/gpu_new && patch -p2 < ../../docs/experiments/tile_store.patch)
#   OUT=. bash docs/experiments/tile_store_ab.sh
set -x
nvidia-smi -L; date -u
run() { ln -sfn ../bench_var/gpu_$1 lynx_npu/gpu; shift; name=$1; shift
  python -m lynx_npu.cli bench kernels --device cuda --json "$OUT/$name.json" "$@" 2>&1 | tail -8; }
run head default_head
run head k5_head --set anchor_bits=5
run new k5_new --set anchor_bits=5
run new default_new
run head k5_head2 --set anchor_bits=5
run new k5_new2 --set anchor_bits=5
run new k3_new --set anchor_bits=3
run head k3_head --set anchor_bits=3
date -u
ln -sfn ../bench_var/gpu_new lynx_npu/gpu
timeout 150 python -m pytest -q -x tests/gpu/test_triton_kernels.py -k "per_tensor_splits or compress_bytes" 2>&1 | tail -5
