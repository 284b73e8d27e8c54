#!/usr/bin/env bash
# Records the shrunk capsule of every planted plan again from the current code
# (fault-plans/README.md, "Regressions"): the first failing seed of 0..5, shrunk, replacing the
# plan's file in fault-plans/capsules/planted/. Review the diff; `cargo sim regressions` checks them.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo sim list > /dev/null
sim=target/sim/release/sim
for plan in $(ls fault-plans/planted-*.toml | xargs -n1 basename | sed 's/\.toml$//'); do
  rm -f target/sim-capsules/"$plan"-*.toml
  "$sim" run "$plan" --seeds 0..5 > /dev/null || true
  first=$(ls target/sim-capsules/"$plan"-[0-9].toml 2>/dev/null | sort | head -1 || true)
  if [ -z "$first" ]; then
    echo "$plan: no failing seed in 0..5 (the planted plan no longer catches its bug)" >&2
    exit 1
  fi
  "$sim" shrink "$first" > /dev/null
  rm -f fault-plans/capsules/planted/"$plan"-*-shrunk.toml
  cp "${first%.toml}-shrunk.toml" fault-plans/capsules/planted/
  echo "$plan: $(basename "${first%.toml}-shrunk.toml")"
done
