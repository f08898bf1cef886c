# shellcheck shell=bash
# Sourced by the deploy and compose scripts: where the seven binaries are.
# nodeagent_bin_dir [DIR]: DIR if given, else target/release or target/debug (relative to
# the repository root, the current directory), whichever holds all seven, the newer build
# if both do. Prints the absolute directory; fails with a message if a binary is missing.
NODEAGENT_SERVICES=(config-source pleg volume pod-sync probe node-status http-server)

nodeagent_bin_dir() {
  local want=${1:-} d s best="" best_time=0 t
  if [ -z "$want" ]; then
    for d in target/release target/debug; do
      t=0
      for s in "${NODEAGENT_SERVICES[@]}"; do
        [ -x "$d/nodeagent-$s" ] || { t=-1; break; }
        local m
        m=$(stat -c %Y "$d/nodeagent-$s")
        [ "$m" -gt "$t" ] && t=$m
      done
      if [ "$t" -gt "$best_time" ]; then best=$d; best_time=$t; fi
    done
    [ -n "$best" ] || { echo "no complete set of nodeagent binaries in target/release or target/debug (build with cargo build --workspace --bins)" >&2; return 1; }
    want=$best
  fi
  for s in "${NODEAGENT_SERVICES[@]}"; do
    [ -x "$want/nodeagent-$s" ] || { echo "$want/nodeagent-$s is missing or not executable" >&2; return 1; }
  done
  (cd "$want" && pwd)
}

# nodeagent_snapshot_bins SRC DEST: copies the seven binaries (a consistent set, even while
# cargo rewrites SRC). Copies to a temporary name and renames, so a half-written file never
# appears under the final name.
nodeagent_snapshot_bins() {
  local src=$1 dest=$2 s
  mkdir -p "$dest"
  for s in "${NODEAGENT_SERVICES[@]}"; do
    cp "$src/nodeagent-$s" "$dest/.nodeagent-$s.tmp"
    mv -f "$dest/.nodeagent-$s.tmp" "$dest/nodeagent-$s"
  done
}
