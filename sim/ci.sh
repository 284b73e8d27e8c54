#!/usr/bin/env bash
# The simulation part of the test suite (called by .ci/test-all). Deterministic: the same commit
# always runs the same seeds. Set SIM_SEEDS (e.g. "1000..1100") to sweep more or other seeds.
set -euo pipefail
cd "$(dirname "$0")/.."
seeds=${SIM_SEEDS:-0..12}

echo "--- regression corpus (fault-plans/capsules/: each passes; capsules/planted/: each still fails, and passes without its bug)"
cargo sim regressions

echo "--- capsules replay the run they recorded, exactly, and keep it when a plan's draw order changes"
cargo sim capsule-check standard --seeds 0..2
cargo sim capsule-check swarm --seeds 0..2

echo "--- planted bugs: each must be caught (and each scenario is clean without its bug)"
cargo sim planted --seeds 0..20

echo "--- determinism: every tokio::select! in src/ and sim/ is biased"
# tokio's select! draws its branch order from a thread-local RNG that madsim does not seed: an
# unbiased select whose branches are ready at one simulated instant makes runs differ.
unbiased=$(grep -rn -A1 --include='*.rs' 'select! {' src sim | awk '/select! \{/ { line = $0; getline next_line; if (next_line !~ /biased;/) print line }')
if [ -n "${unbiased}" ]; then
  echo "unbiased tokio::select! (add \`biased;\` as its first line):"
  echo "${unbiased}"
  exit 1
fi

echo "--- determinism: every seed run twice, full event traces compared"
cargo sim run standard --seeds 0..3 --check-determinism
cargo sim run swarm --seeds 0..3 --check-determinism

echo "--- every plan over seeds ${seeds}, each seed run twice (traces compared)"
cargo sim run all --seeds "${seeds}" --jobs 2 --check-determinism

echo "--- coverage: every item of fault-plans/must-reach.toml reached over seeds 0..2"
cargo sim coverage --seeds 0..2
