#!/usr/bin/env bash
# Builds the seven binaries of the previous release (UPGRADE_BASE, default: the last commit
# before the schema grew for issue 8) into target/previous/, for tests/tests/suite/upgrade.rs.
#
# The old sources are built in the workspace's own target dir: every dependency that did not
# change is reused, so only our own crates compile again (about 2 minutes on 2 cores instead
# of a second full build). Cargo then leaves the old binaries in target/debug/: they are
# copied out and the current ones, saved before, are put back.
set -euo pipefail
cd "$(dirname "$0")/../.."
BASE=${UPGRADE_BASE:-c97e054ddee3b7f88b68b3054e8690bc4bdf192b}
TARGET=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
OUT="$TARGET/previous"
SERVICES=(config-source pleg pod-sync probe volume node-status http-server)

have_all() {
  [ "$(cat "$OUT/.rev" 2>/dev/null)" = "$BASE" ] || return 1
  for s in "${SERVICES[@]}"; do [ -x "$OUT/nodeagent-$s" ] || return 1; done
}
if have_all; then
  echo "[previous] binaries of $BASE already in $OUT"
  exit 0
fi
git cat-file -e "$BASE^{commit}" 2>/dev/null || {
  echo "[previous] commit $BASE is not in this clone (a shallow clone?): git fetch --unshallow" >&2
  exit 1
}
SRC="$TARGET/previous-src"
rm -rf "$SRC" "$OUT"
mkdir -p "$SRC" "$OUT"
git archive "$BASE" | tar -x -C "$SRC"
SAVED="$TARGET/previous-saved"
rm -rf "$SAVED"
mkdir -p "$SAVED"
for s in "${SERVICES[@]}"; do
  [ -e "$TARGET/debug/nodeagent-$s" ] && cp -p "$TARGET/debug/nodeagent-$s" "$SAVED/"
done
echo "[previous] building $BASE"
(cd "$SRC" && CARGO_TARGET_DIR="$TARGET" cargo build --workspace --bins --quiet)
for s in "${SERVICES[@]}"; do
  cp "$TARGET/debug/nodeagent-$s" "$OUT/"
  if [ -e "$SAVED/nodeagent-$s" ]; then
    mv -f "$SAVED/nodeagent-$s" "$TARGET/debug/nodeagent-$s"
  else
    rm -f "$TARGET/debug/nodeagent-$s"
  fi
done
rm -rf "$SAVED"
echo "$BASE" > "$OUT/.rev"
rm -rf "$SRC"
echo "[previous] binaries of $BASE in $OUT"
