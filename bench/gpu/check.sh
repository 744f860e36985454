#!/bin/bash
# The check on a real GPU machine (docs/gpu-check.md): every dtrain command that reads a GPU
# or NCCL, on localhost, against the real driver, nvidia-smi and NCCL. Run from the repo
# root as root on a machine with at least one NVIDIA GPU and torch; writes everything under
# $OUT (default /tmp/gpu-check-out): summary.txt and all.tgz. Each step has its own timeout
# and the script goes on after a failed step: the summary says which failed.
set -u
OUT=${OUT:-/tmp/gpu-check-out}
W=${W:-/tmp/gpu-check}; rm -rf "$W"; mkdir -p "$W/nccl" "$OUT"  # W: the working directory
export DTRAIN_ARCHIVE_DIR=$W/runs DTRAIN_RESIDENT=0 PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
PY=${PYTHON:-python3}
NPROC=${NPROC:-gpu}  # a rehearsal without a GPU: NPROC=1
mkdir -p "$W/bin"; printf '#!/bin/sh\nexec %s -m launcher "$@"\n' "$PY" > "$W/bin/dtrain"
chmod +x "$W/bin/dtrain"; export PATH=$W/bin:$PATH
S=$W/summary.txt
step() {  # step NAME TIMEOUT CMD...: output in $W/NAME.txt, rc in the summary
  local name=$1 t=$2; shift 2
  local t0=$(date +%s%N)
  timeout -k 5 "$t" "$@" > "$W/$name.txt" 2>&1; local rc=$?
  local ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  printf '%-22s rc=%-4s %4d.%03d s\n' "$name" "$rc" $((ms / 1000)) $((ms % 1000)) | tee -a "$S"
  return $rc
}
{ date; uname -a; nvidia-smi -L; nvidia-smi --query-gpu=driver_version,name,memory.total --format=csv
  "$PY" -c 'import torch,sys; print(sys.version.split()[0], torch.__version__, torch.version.cuda, torch.cuda.nccl.version(), torch.cuda.device_count())'
  ip -br addr 2>/dev/null || cat /proc/net/dev; ls /dev/infiniband 2>&1; } > "$W/machine.txt" 2>&1
cat "$W/machine.txt" >> "$S"

step doctor 120 dtrain doctor -H localhost
step doctor-json 120 dtrain doctor -H localhost --json
step doctor-health 180 dtrain doctor -H localhost --health --json
step dry-run 120 dtrain run -H localhost --nproc-per-node "$NPROC" --dry-run examples/ddp_smoke.py
# NCCL's own account, read by the supervisor (nothing set by the user)
step run-ddp 300 dtrain run -H localhost --nproc-per-node "$NPROC" --run-id ddp --json examples/ddp_smoke.py
# the same NCCL lines kept raw (the user's own NCCL_DEBUG: dtrain then reads nothing)
step run-raw-nccl 300 dtrain run -H localhost --nproc-per-node "$NPROC" --run-id raw \
  -e NCCL_DEBUG=INFO -e NCCL_DEBUG_SUBSYS=INIT,NET -e "NCCL_DEBUG_FILE=$W/nccl/nccl.%h.%p.log" \
  examples/ddp_smoke.py
# a detached run watched from outside: top (the real nvidia-smi), stacks, ps, stop
step run-detach 180 dtrain run -H localhost --nproc-per-node "$NPROC" --run-id det --detach \
  --sample-interval 1 -e GPU_STEPS=400 -e GPU_MATMULS=400 bench/gpu/workload.py
sleep 12
step top-once 60 dtrain top --once -H localhost
step top-once-json 60 dtrain top --once -H localhost --json
step stacks 60 dtrain stacks det
step ps-json 60 dtrain ps --json
nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv > "$W/apps-during.txt" 2>&1
step stop 60 dtrain stop det
sleep 3
nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv > "$W/apps-after-stop.txt" 2>&1
# a rank stuck in a GPU kernel: the hang verdict with stacks, then teardown frees the GPU
step run-hang 300 dtrain run -H localhost --nproc-per-node "$NPROC" --run-id hang --hang-timeout 15 \
  --on-hang stop --grace 5 -e GPU_STUCK_AT=5 -e GPU_STEPS=30 --json bench/gpu/workload.py
sleep 3
nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv > "$W/apps-after-hang.txt" 2>&1
# two ranks on one GPU (a script without set_device): NCCL refuses; the verdict must say so
step two-ranks-one-gpu 300 dtrain run -H localhost --nproc-per-node 2 --run-id dup \
  -e GPU_SAME_DEVICE=1 -e GPU_STEPS=3 --json bench/gpu/workload.py
step health-run 300 dtrain run -H localhost --nproc-per-node "$NPROC" --run-id health --health-check \
  -e GPU_STEPS=4 bench/gpu/workload.py
step smoke 300 dtrain smoke -H localhost --json
step report 120 dtrain report ddp --json
step report-hang 120 dtrain report hang --json
ps -eo pid,ppid,stat,etime,args | grep -v grep | grep -E 'torchrun|workload|ddp_smoke|supervisor' > "$W/left-processes.txt"
echo "left processes: $(wc -l < "$W/left-processes.txt")" >> "$S"
cp "$S" "$OUT/summary.txt"
tar -C "$(dirname "$W")" -czf "$OUT/all.tgz" "$(basename "$W")"
