#!/usr/bin/env bash
# The main job end to end on the embedded default: the local Docker engine and a bundled
# dataset (scikit-learn's digits). Set-up, a pinned base, the CPU image built from the
# committed lock and verified by a rebuild, mnist_convnet trained twice with determinism
# injected, and the verdict.
#
#   bash scripts/demo.sh            # workspace in ./demo-workspace (kept for inspection)
#   DEMO_DIR=/tmp/x bash scripts/demo.sh
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
L=.venv/bin/launcher
DEMO_DIR=${DEMO_DIR:-$PWD/demo-workspace}
EPOCHS=${EPOCHS:-4}

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "workspace: a scratch copy of this project's locks, Dockerfiles and recipes in $DEMO_DIR"
$L init "$DEMO_DIR" --from .
step "base image: Debian + Python from Debian packages, pushed to a local registry, pinned by digest"
$L -w "$DEMO_DIR" base bootstrap --start-registry
step "build: the CPU image from lockfiles/cpu.txt, offline, labelled, content-addressed"
$L -w "$DEMO_DIR" build --variant cpu
step "rebuild --verify: from scratch, the same filesystem tree and the same image ID"
$L -w "$DEMO_DIR" rebuild --variant cpu --verify
step "run: mnist_convnet twice on the local engine, seed 42, determinism profile 'deterministic'"
# On the 1,500 bundled digits, Adadelta at learning rate 1.0 and batch 32 learns in seconds; the recipe's
# defaults (learning rate 0.001, batch 128, 12 epochs) are the seed's own, made for the 60,000 MNIST images.
$L -w "$DEMO_DIR" run mnist_convnet --runs 2 --seed 42 --param dataset=digits --param epochs="$EPOCHS" \
  --param learning_rate=1.0 --param batch_size=32
step "verify: are the two runs bit-identical?"
status=0
$L -w "$DEMO_DIR" verify checksums || status=$?
step "and the model learned: final test accuracy of each run (chance is 0.10)"
group=$(.venv/bin/python -c 'import json,sys,pathlib; ms=[json.loads(p.read_text()) for p in pathlib.Path(sys.argv[1]).glob("runs/*/manifest.json")]; print(max(ms, key=lambda m: m["started_at"])["group"])' "$DEMO_DIR")
for manifest in "$DEMO_DIR"/runs/*/manifest.json; do
  .venv/bin/python - "$manifest" "$group" <<'PY'
import json, pathlib, sys
m = json.loads(pathlib.Path(sys.argv[1]).read_text())
if m["group"] == sys.argv[2]:
    last = pathlib.Path(sys.argv[1]).with_name("outputs").joinpath("metrics.jsonl").read_text().splitlines()[-1]
    print(f"{m['run_id']}: test accuracy {json.loads(last)['val_accuracy']:.3f} after {json.loads(last)['epoch'] + 1} epochs")
PY
done
exit "$status"
