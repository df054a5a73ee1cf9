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
EPOCHS=${EPOCHS:-3}

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "workspace: a scratch copy of this project's locks, Dockerfiles and recipes in $DEMO_DIR"
$L init "$DEMO_DIR" --from .
step "base image: Debian + Python from Debian packages, pushed to a local registry, pinned by digest"
$L -w "$DEMO_DIR" base bootstrap --start-registry
step "build: the CPU image from lockfiles/cpu.txt, offline, labelled, content-addressed"
$L -w "$DEMO_DIR" build cpu
step "rebuild --verify: from scratch, the same filesystem tree and the same image ID"
$L -w "$DEMO_DIR" rebuild cpu --verify
step "run: mnist_convnet twice on the local engine, seed 42, determinism profile 'deterministic'"
$L -w "$DEMO_DIR" run mnist_convnet --runs 2 --seed 42 --param dataset=digits --param epochs="$EPOCHS"
step "verify: are the two runs bit-identical?"
$L -w "$DEMO_DIR" verify checksums
