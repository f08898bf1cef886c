# shellcheck shell=bash
# Sourced by the deploy and compose scripts: where the node agent's binary is.
#
# What ships is one multi-call binary, `nodeagent`, and a link `nodeagent-<service>` to
# it per service: seven processes of one file share one copy of the code in memory (see
# the README's section on memory). Cargo also builds each service's own binary
# (`nodeagent-<service>`, what the cross-service tests start); a binary directory here is
# one that holds `nodeagent`.
#
# nodeagent_bin_dir [DIR]: DIR if given, else target/release or target/debug (relative to
# the repository root, the current directory), whichever holds `nodeagent`, the newer
# build if both do. Prints the absolute directory; fails with a message if it is missing.
NODEAGENT_SERVICES=(config-source pleg volume pod-sync probe node-status http-server)

# nodeagent_target_dir: where cargo puts this workspace's builds (./target, or
# CARGO_TARGET_DIR's), as an absolute path.
nodeagent_target_dir() {
  cargo metadata --format-version 1 --no-deps |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])'
}

nodeagent_bin_dir() {
  local want=${1:-} d best="" best_time=0 t
  if [ -z "$want" ]; then
    for d in target/release target/debug; do
      [ -x "$d/nodeagent" ] || continue
      t=$(stat -c %Y "$d/nodeagent")
      if [ "$t" -gt "$best_time" ]; then best=$d; best_time=$t; fi
    done
    [ -n "$best" ] || { echo "no nodeagent binary in target/release or target/debug (build with cargo build --release -p nodeagent)" >&2; return 1; }
    want=$best
  fi
  [ -x "$want/nodeagent" ] || { echo "$want/nodeagent is missing or not executable" >&2; return 1; }
  (cd "$want" && pwd)
}

# nodeagent_link_services DIR: the seven `nodeagent-<service>` links to DIR/nodeagent,
# each replaced by a rename (a running service keeps its binary; a regular file of an
# older installation is replaced by the link).
nodeagent_link_services() {
  local dir=$1 s
  for s in "${NODEAGENT_SERVICES[@]}"; do
    ln -sfn nodeagent "$dir/.nodeagent-$s.link"
    mv -fT "$dir/.nodeagent-$s.link" "$dir/nodeagent-$s"
  done
}

# nodeagent_snapshot_bins SRC DEST: copies `nodeagent` (a consistent copy, even while
# cargo rewrites SRC: copied to a temporary name and renamed, so a half-written file never
# appears under the final name) and links the seven services to it.
nodeagent_snapshot_bins() {
  local src=$1 dest=$2
  mkdir -p "$dest"
  cp "$src/nodeagent" "$dest/.nodeagent.tmp"
  mv -f "$dest/.nodeagent.tmp" "$dest/nodeagent"
  nodeagent_link_services "$dest"
}

# nodeagent_bench_bins: what the benchmark scripts measure. PROFILE=dev: the debug build of
# each service's own binary (nothing to do); else (default release) builds the multi-call
# binary with that profile and points NODEAGENT_TEST_BIN_DIR at a snapshot of it and its
# links. Sets bench_dir (empty for dev) to where cargo put the build.
nodeagent_bench_bins() {
  bench_profile=${PROFILE:-release}
  bench_dir=
  [ "$bench_profile" != dev ] || return 0
  cargo build -p nodeagent --profile "$bench_profile"
  bench_dir="$(nodeagent_target_dir)/$bench_profile"
  export NODEAGENT_TEST_BIN_DIR="$bench_dir/bench-bin"
  nodeagent_snapshot_bins "$bench_dir" "$NODEAGENT_TEST_BIN_DIR"
}
