#!/usr/bin/env bash
# The cross-service tests that read or write cgroups, run again on a cgroup v2 host (a
# qemu guest, tests/cgroup2/run.sh): the pod cgroup's v2 files (memory.max, cpu.max,
# cpu.weight, pids.max), its removal, the QoS tree, oom_score_adj, /stats/summary's v2
# reads, and OOM kills (a container's limit, and the whole guest: the SystemOOM event).
# deploy/test.sh runs it after the suite; it uses the test binaries that run
# already built (it builds nothing new).
#
# Under TCG (these VMs' /dev/kvm cannot boot a stock kernel) the guest is about five times
# slower than the host: the tests chosen wait on conditions with deadlines, never on
# timings.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

# test binary -> the tests of it to run ("" for all of them).
declare -A TESTS=(
  [resources]=""
  [stats]=""
  [skeleton]="a_static_pod_runs_is_replaced_on_edit_and_cleaned_up_on_removal"
  [lifecycle]="env_expansion_downward_api_and_active_deadline"
  [oom]=""
)

args=()
for t in "${!TESTS[@]}"; do args+=(--test "$t"); done
# Where cargo left each test binary (no compilation: they are up to date).
mapfile -t lines < <(cargo test -p nodeagent-tests --no-run --message-format=json "${args[@]}" 2>/dev/null |
  python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and "test" in m["target"]["kind"]:
        print(m["target"]["name"], m["executable"])
')
[ "${#lines[@]}" -eq "${#TESTS[@]}" ] || { echo "[cgroup2] expected ${#TESTS[@]} test binaries, found: ${lines[*]}" >&2; exit 1; }

# The guest may run out of memory as a whole: oom.rs's node-wide OOM test runs here only.
script='export NODEAGENT_TEST_NODE_OOM=1; rc=0'
for line in "${lines[@]}"; do
  name=${line%% *} exe=${line#* }
  script+="; echo \"== $name on cgroup v2\"; $exe --test-threads 1 ${TESTS[$name]} || rc=1"
done
script+='; exit $rc'
exec bash tests/cgroup2/run.sh -- bash -c "$script"
