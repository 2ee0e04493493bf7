#!/usr/bin/env bash
# Installs the project's Rust tools into $NOTIFY_TOOLS_DIR (default
# ${XDG_CACHE_HOME:-~/.cache}/notify/tools/cargo), pinned and --locked, once; later runs,
# in this clone or another on the same machine (CI's clean clones), find them there
# instead of compiling them again (cargo-deny: about 3 minutes of a cold `make lint`).
# A binary of another version is replaced.
#
#   deploy/tools.sh cargo-deny    # supply-chain checks (make lint)
#   deploy/tools.sh cargo-fuzz    # fuzzing (make fuzz)
#
# Prints the installed binary's path.
set -euo pipefail
if [ -n "${NOTIFY_TOOLS_DIR:-}" ]; then
  root=$NOTIFY_TOOLS_DIR
elif [ -n "${XDG_CACHE_HOME:-}" ] || [ -n "${HOME:-}" ]; then
  root=${XDG_CACHE_HOME:-$HOME/.cache}/notify/tools/cargo
else # no home: the clone's own stack directory, as before
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/.stack/tools/cargo
fi

declare -A version=([cargo-deny]=0.20.2 [cargo-fuzz]=0.13.2)
tool=${1:?usage: deploy/tools.sh cargo-deny|cargo-fuzz}
want=${version[$tool]:?unknown tool $tool}
bin=$root/bin/$tool
if [ -x "$bin" ] && "$bin" --version 2>/dev/null | grep -q "$want"; then
  echo "$bin"
  exit 0
fi
echo "[tools] installing $tool $want into $root (first time only; a few minutes)" >&2
# Its own target dir, so the workspace build is not disturbed.
CARGO_TARGET_DIR=$root/build cargo install --quiet --locked --root "$root" --version "$want" "$tool" >&2
rm -rf "$root/build"
echo "$bin"
