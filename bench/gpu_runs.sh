#!/usr/bin/env bash
# The README's "GPU runs" list, every step time-boxed, so that one call on a
# lent GPU machine (or a user's own GPU box) brings back whatever finished:
#
#   OUT=DIR BUDGET_S=480 bash bench/gpu_runs.sh
#
# 1. the real-GPU tests (pytest -m gpu: runtime, CUDA IPC under mpirun,
#    profile, bench), 2. bench/gpu_step.py (step vs PyTorch CUDA), 3. its
#    simulate --compare part, 4. `legionpy profile --zoo` into
#    legionpy/data/profiles for MODELS with the time left, 5. `legionpy
#    machines`. Writes OUT/log.txt (all output) and OUT/profiles.tgz (the
#    PRESET-MODEL.json files recorded, and the tile cache a later run
#    resumes from: LEGIONPY_CACHE=DIR with it unpacked there).
#
# The lent machines cannot pip install: their python3 has CuPy, PyTorch,
# numba and mpi4py. If .whl/ holds the mpich and mpi4py wheels (README,
# "GPU runs"), they are unpacked and used, so mpirun is the one CI uses.
set -u
OUT=${OUT:-$PWD/gpu-out}
BUDGET_S=${BUDGET_S:-480}
MODELS=${MODELS:-alexnet,resnet101,rnnlm,lenet,rnntc,nmt,vgg16,inception_v3}
PY=${PY:-python3}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/log.txt") 2>&1

left() { echo $((BUDGET_S - SECONDS)); }
step() {  # step NAME MAX_S CMD...: run CMD for at most MAX_S (and the budget left)
    local name=$1 max=$2 t
    shift 2
    t=$(left)
    ((t < max)) && max=$t
    if ((max < 20)); then echo "== $name: skipped, ${t}s of the budget left"; return; fi
    echo "== $name (at most ${max}s, at ${SECONDS}s): $*"
    timeout -k 5 "$max" "$@"
    echo "== $name: exit $? at ${SECONDS}s"
}

export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
export LEGIONPY_CACHE=${LEGIONPY_CACHE:-/tmp/legionpy-gpu-cache}
# tiles an earlier GPU session measured (bench/gpu-cache: the per-GPU tile
# cache `profile --zoo` resumes from; commit the one OUT/profiles.tgz brings back)
mkdir -p "$LEGIONPY_CACHE"
for f in bench/gpu-cache/profile-*.json; do
    [ -e "$f" ] && [ ! -e "$LEGIONPY_CACHE/$(basename "$f")" ] && cp "$f" "$LEGIONPY_CACHE/"
done
if ls .whl/mpich-*.whl .whl/mpi4py-*.whl >/dev/null 2>&1; then
    site=/tmp/legionpy-gpu-site
    rm -rf "$site" && mkdir -p "$site"
    for w in .whl/mpich-*.whl .whl/mpi4py-*.whl; do $PY -m zipfile -e "$w" "$site"; done
    mpich=$(echo "$site"/mpich-*.data/data)
    chmod +x "$mpich"/bin/*
    export PATH=$mpich/bin:$PATH LD_LIBRARY_PATH=$mpich/lib:${LD_LIBRARY_PATH:-}
    export PYTHONPATH=$site:$PYTHONPATH
fi

echo "== machine"
nvidia-smi -L 2>&1 | head -4
$PY - <<'PY'
import numpy, sys
print("python", sys.version.split()[0], "numpy", numpy.__version__)
for mod in ("cupy", "torch", "numba", "mpi4py"):
    try:
        m = __import__(mod)
        print(mod, m.__version__, getattr(m, "__file__", ""))
    except Exception as e:  # noqa: BLE001
        print(mod, "missing:", e)
try:
    from mpi4py import MPI
    print(MPI.Get_library_version().splitlines()[0])
except Exception as e:  # noqa: BLE001
    print("MPI:", e)
PY
command -v mpirun

step gpu-tests 120 $PY -m pytest -m gpu -q -rs --durations=8 -p no:cacheprovider tests
step "gpu_step (steps)" 90 $PY bench/gpu_step.py --models alexnet,resnet101,rnnlm --repeat 3 \
    --no-compare --json
step "gpu_step (compare)" 150 $PY bench/gpu_step.py --models alexnet,resnet101,rnnlm \
    --no-steps --compare-steps 3 --json
# tiles already measured come from the cache (LEGIONPY_CACHE): a run cut short resumes
step "profile --zoo" $(($(left) - 15)) $PY -m legionpy profile --zoo --out legionpy/data/profiles \
    --models "$MODELS"
ls -la legionpy/data/profiles
$PY -m legionpy machines 2>&1 | head -30
tar czf "$OUT/profiles.tgz" legionpy/data/profiles/*.json -C "$LEGIONPY_CACHE" . 2>/dev/null
echo "== done at ${SECONDS}s"
