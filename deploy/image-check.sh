#!/usr/bin/env bash
# Runs every binary of the image deploy/image.sh built, from the image, far enough to
# answer its health endpoint, then sends SIGTERM and requires exit status 0. Each runs as
# uid/gid 65532 on a read-only root filesystem, with the local stack's PostgreSQL and
# RabbitMQ (the services drain through the database on SIGTERM: without one they exit 1)
# and the stack's provider keys mounted read-only at /var/run/secrets/notify, as the
# Kubernetes manifests mount them.
#
#   deploy/image-check.sh
#
# One line per binary, e.g. `image: ingest healthz 200, SIGTERM exit 0`; exit 1 when any
# fails (its last log lines are shown). The health endpoint is /healthz on
# NOTIFY_ADMIN_ADDR for ingest and the workers, /healthz on NOTIFY_HTTP_ADDR for http-api
# and /_sim/health for provider-sim; notifyctl, a command-line tool with no server, runs
# `notifyctl keys list` against the database instead. `ingest migrate` from the image
# prepares the check's database (notify_image, made anew).
#
# Runner (NOTIFY_IMAGE_RUNNER: auto, podman or chroot; auto by default):
#   podman  `podman run --read-only --read-only-tmpfs=false --user 65532:65532
#           --cap-drop=all --network host` with the runc runtime, storage under
#           NOTIFY_IMAGE_DIR/podman (nothing in the system's image store). podman and runc
#           are installed (Debian packages, deploy/local-stack.sh install) when missing.
#           Debian 12's default runtime crun refuses a cgroup v1/v2 hybrid host ("cgroups
#           in hybrid mode not supported"); runc does not. Resource limits are lowered
#           explicitly (--ulimit): some sandboxes refuse the default ones podman asks for.
#   chroot  when podman cannot start a container (auto tries it first and says why not):
#           the unpacked layers (NOTIFY_IMAGE_DIR/rootfs) under a read-only overlay whose
#           other lower layer holds the secrets, in a private mount namespace (unshare -m),
#           entered with `chroot --userspec=65532:65532`. Needs root.
#
# Settings: NOTIFY_IMAGE_DIR (as deploy/image.sh), NOTIFY_IMAGE_CHECK_PORT (63400: the
# binaries listen on +51 gRPC, +64 admin, +80 http-api, +90 provider-sim, one at a time).
# The local stack (NOTIFY_STACK_DIR, its port settings) is started with
# `deploy/local-stack.sh up` when it is not running, and stopped again at the end.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
STACK=${NOTIFY_STACK_DIR:-$repo/.stack}
OUT=${NOTIFY_IMAGE_DIR:-$STACK/image}
RUNNER=${NOTIFY_IMAGE_RUNNER:-auto}
PORT=${NOTIFY_IMAGE_CHECK_PORT:-63400}
GRPC_ADDR=127.0.0.1:$((PORT + 51))
ADMIN_ADDR=127.0.0.1:$((PORT + 64))
HTTP_ADDR=127.0.0.1:$((PORT + 80))
SIM_ADDR=127.0.0.1:$((PORT + 90))
SECRETS=/var/run/secrets/notify
CHECK=$OUT/check

log() { printf 'image: %s\n' "$*" >&2; }
die() { printf 'image: error: %s\n' "$*" >&2; exit 1; }

if [ ! -f "$OUT/ref" ] || [ ! -d "$OUT/rootfs/usr/local/bin" ]; then die "no image in $OUT: run deploy/image.sh first"; fi
REF=$(cat "$OUT/ref")
DIGEST=$(cat "$OUT/digest")
TAG=${REF##*:}
mkdir -p "$CHECK/logs"

# ---------------------------------------------------------------- the stack
started_stack=0
status=$("$here/local-stack.sh" status)
if [ ! -f "$STACK/env" ] || ! grep -q '^postgres: running' <<<"$status" || ! grep -q '^rabbitmq: running' <<<"$status"; then
  log "starting the local stack (deploy/local-stack.sh up)"
  PROVIDER_SIM_BIN=${PROVIDER_SIM_BIN:-$OUT/rootfs/usr/local/bin/provider-sim} "$here/local-stack.sh" up
  started_stack=1
fi
# shellcheck disable=SC1091
source "$STACK/env"

cleanup() {
  if [ -n "${cleanup_container:-}" ]; then "${podman[@]}" rm -f "$cleanup_container" >/dev/null 2>&1 || true; fi
  if [ -n "${cleanup_pid:-}" ]; then kill -9 "$cleanup_pid" 2>/dev/null || true; fi
  if [ "$started_stack" = 1 ]; then "$here/local-stack.sh" down || true; fi
}
trap cleanup EXIT

# The secrets as a pod would see them: copies readable by 65532 (the stack's own files are
# private to their owner).
rm -rf "$CHECK/secrets"
mkdir -p "$CHECK/secrets$SECRETS"
cp "$STACK"/keys/* "$CHECK/secrets$SECRETS/"
chmod 0755 "$CHECK/secrets$SECRETS"
chmod 0644 "$CHECK/secrets$SECRETS"/*

db=notify_image
PGOPTIONS='-c client_min_messages=warning' psql "$NOTIFY_TEST_DATABASE_URL" -qc "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null
psql "$NOTIFY_TEST_DATABASE_URL" -qc "CREATE DATABASE $db" >/dev/null

# What every binary gets: the stack's settings with this check's database, addresses and
# secret paths.
export NOTIFY_DATABASE_URL=${NOTIFY_DATABASE_URL%/*}/$db
export NOTIFY_GRPC_ADDR=$GRPC_ADDR NOTIFY_ADMIN_ADDR=$ADMIN_ADDR NOTIFY_HTTP_ADDR=$HTTP_ADDR
export NOTIFY_EMAIL_FROM='notify image check <image-check@example.test>'
export NOTIFY_FCM_SERVICE_ACCOUNT_FILE=$SECRETS/fcm-service-account.json
export NOTIFY_APNS_KEY_FILE=$SECRETS/apns-key.p8
export NOTIFY_VAPID_PRIVATE_KEY_FILE=$SECRETS/vapid-key.pem
export SIM_ADDR=$SIM_ADDR SIM_LINE_CHANNEL_TOKEN=$NOTIFY_LINE_CHANNEL_TOKEN
export SIM_FCM_PUBLIC_KEY_FILE=$SECRETS/fcm-public.pem SIM_FCM_CLIENT_EMAIL=notify@notify-local.iam.gserviceaccount.com
unset NOTIFY_FCM_PUBLIC_KEY_FILE NOTIFY_APNS_PUBLIC_KEY_FILE
mapfile -t env_names < <(compgen -e | grep -E '^(NOTIFY|SIM|RUST)_' | grep -vE '^NOTIFY_(TEST_DATABASE_URL|BROWSER_MODULES|CHROMIUM|EXAMPLES_.*|STACK_DIR|IMAGE_.*)$')

# ---------------------------------------------------------------- runners
podman=(podman --root "$OUT/podman/storage" --runroot "$OUT/podman/run" --runtime runc)
nofile=$(ulimit -Hn); [ "$nofile" = unlimited ] || [ "$nofile" -gt 65536 ] && nofile=65536
podman_flags=(--read-only --read-only-tmpfs=false --user 65532:65532 --cap-drop=all
  --security-opt=no-new-privileges --network host --pull never
  --ulimit "nofile=$nofile:$nofile" --ulimit nproc=8192:8192
  -v "$CHECK/secrets$SECRETS:$SECRETS:ro")
for n in "${env_names[@]}"; do podman_flags+=(-e "$n"); done
image_id=""

podman_ready() { # loads the layout into the private store; fails with the reason on stderr
  local missing=()
  command -v podman >/dev/null || missing+=(podman)
  command -v runc >/dev/null || missing+=(runc)
  if [ ${#missing[@]} -gt 0 ]; then "$here/local-stack.sh" install "${missing[@]}" || return 1; fi
  # podman names an image pulled from a layout after its path, and a path with a
  # component starting with a dot (the stack's `.stack`) or with capitals is not a valid
  # image name: it is pulled through a link whose path is lowercase and dot-free.
  local link=/tmp/notify-image-oci-$$
  ln -sfn "$(cd "$OUT/oci" && pwd)" "$link"
  "${podman[@]}" pull -q "oci:$link:$TAG" >"$CHECK/podman-pull.log" 2>&1 || { rm -f "$link"; tail -n 1 "$CHECK/podman-pull.log" >&2; return 1; }
  rm -f "$link"
  image_id=$(tail -n 1 "$CHECK/podman-pull.log")
  "${podman[@]}" run --rm "${podman_flags[@]}" --entrypoint /usr/local/bin/ingest "$image_id" --help >/dev/null 2>"$CHECK/podman-try.log" ||
    { tail -n 1 "$CHECK/podman-try.log" >&2; return 1; }
}

chroot_ready() {
  [ "$(id -u)" = 0 ] || { echo "chroot needs root" >&2; return 1; }
  mkdir -p "$CHECK/root"
  # shellcheck disable=SC2016 # expanded by the inner sh
  unshare --mount --propagation private sh -c \
    'mount -t overlay overlay -o "ro,lowerdir=$1:$2" "$3" && exec chroot --userspec=65532:65532 "$3" /usr/local/bin/ingest --help' \
    sh "$CHECK/secrets" "$OUT/rootfs" "$CHECK/root" >/dev/null 2>"$CHECK/chroot-try.log" ||
    { tail -n 1 "$CHECK/chroot-try.log" >&2; return 1; }
}

case "$RUNNER" in
  podman) podman_ready 2>"$CHECK/runner.err" || die "podman cannot run the image: $(cat "$CHECK/runner.err")" ;;
  chroot) chroot_ready 2>"$CHECK/runner.err" || die "chroot cannot run the image: $(cat "$CHECK/runner.err")" ;;
  auto)
    if podman_ready 2>"$CHECK/runner.err"; then
      RUNNER=podman
    else
      log "podman cannot run a container here: $(cat "$CHECK/runner.err"); using chroot"
      RUNNER=chroot
      chroot_ready 2>"$CHECK/runner.err" || die "chroot cannot run the image either: $(cat "$CHECK/runner.err")"
    fi ;;
  *) die "NOTIFY_IMAGE_RUNNER=$RUNNER: use auto, podman or chroot" ;;
esac
case "$RUNNER" in
  podman) log "runner: podman $(podman --version | awk '{print $3}') with runc $(runc --version | awk 'NR==1 {print $3}'), image $REF $DIGEST (id ${image_id:0:12})" ;;
  chroot) log "runner: chroot into $OUT/rootfs (read-only overlay, private mount namespace), image $REF $DIGEST" ;;
esac

# start NAME BIN ARGS...: runs BIN from the image in the background; sets `handle`.
start() {
  local name=$1 bin=$2; shift 2
  if [ "$RUNNER" = podman ]; then
    handle=notify-image-check-$name
    "${podman[@]}" rm -f "$handle" >/dev/null 2>&1 || true
    "${podman[@]}" run -d --name "$handle" "${podman_flags[@]}" --entrypoint "/usr/local/bin/$bin" "$image_id" "$@" >/dev/null
    cleanup_container=$handle
  else
    local envs=(PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt) n
    for n in "${env_names[@]}"; do envs+=("$n=${!n}"); done
    # env -i: the binary sees only the image's and this check's variables. One process
    # all along (env, unshare, sh, chroot each exec the next), so $! is the binary.
    # shellcheck disable=SC2016 # expanded by the inner sh
    env -i "${envs[@]}" unshare --mount --propagation private sh -c \
      'root=$1 lower=$2; shift 2; mount -t overlay overlay -o "ro,lowerdir=$lower" "$root" && exec chroot --userspec=65532:65532 "$root" "$@"' \
      sh "$CHECK/root" "$CHECK/secrets:$OUT/rootfs" "/usr/local/bin/$bin" "$@" \
      >"$CHECK/logs/$name.log" 2>&1 &
    handle=$!
    cleanup_pid=$handle
  fi
}
running() { if [ "$RUNNER" = podman ]; then [ "$("${podman[@]}" inspect -f '{{.State.Running}}' "$handle" 2>/dev/null)" = true ]; else kill -0 "$handle" 2>/dev/null; fi; }
stop_and_wait() { # sends SIGTERM; sets exit_status (a number, or "none within 90 s")
  exit_status="none within 90 s"
  if [ "$RUNNER" = podman ]; then
    "${podman[@]}" kill --signal TERM "$handle" >/dev/null
    exit_status=$(timeout 90 "${podman[@]}" wait "$handle") || exit_status="none within 90 s"
    "${podman[@]}" logs "$handle" >"$CHECK/logs/$name.log" 2>&1 || true
    "${podman[@]}" rm -f "$handle" >/dev/null 2>&1 || true
    cleanup_container=""
  else
    kill -TERM "$handle"
    local until=$((SECONDS + 90))
    while kill -0 "$handle" 2>/dev/null && [ $SECONDS -lt $until ]; do sleep 0.2; done
    if kill -0 "$handle" 2>/dev/null; then
      kill -9 "$handle"
    else
      exit_status=0
      wait "$handle" || exit_status=$?
    fi
    cleanup_pid=""
  fi
}
# once NAME BIN ARGS...: runs BIN to completion from the image; sets exit_status.
once() {
  local name=$1 bin=$2; shift 2
  exit_status=0
  if [ "$RUNNER" = podman ]; then
    "${podman[@]}" run --rm "${podman_flags[@]}" --entrypoint "/usr/local/bin/$bin" "$image_id" "$@" >"$CHECK/logs/$name.log" 2>&1 || exit_status=$?
  else
    start "$name" "$bin" "$@"
    wait "$handle" || exit_status=$?
    cleanup_pid=""
  fi
}

failed=0
fail() { # binary message
  printf 'image: %s FAILED: %s\n' "$1" "$2"
  tail -n 15 "$CHECK/logs/$1.log" 2>/dev/null | cut -c1-300 >&2 || true
  failed=1
}

once ingest-migrate ingest migrate
if [ "$exit_status" = 0 ]; then echo "image: ingest migrate exit 0"; else fail ingest-migrate "ingest migrate exit $exit_status"; fi

# name binary health-url args...
check_server() {
  local name=$1 bin=$2 url=$3 code=000; shift 3
  start "$name" "$bin" "$@"
  local until=$((SECONDS + 60))
  while [ $SECONDS -lt $until ]; do
    code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 "$url" || true)
    [ "$code" = 200 ] && break
    running || break
    sleep 0.3
  done
  if [ "$code" != 200 ]; then
    stop_and_wait
    fail "$name" "$url answered ${code:-nothing} within 60 s"
    return
  fi
  stop_and_wait
  if [ "$exit_status" = 0 ]; then
    echo "image: $name healthz 200, SIGTERM exit 0"
  else
    fail "$name" "healthz 200, SIGTERM exit $exit_status"
  fi
}

check_server ingest ingest "http://$ADMIN_ADDR/healthz" serve
check_server http-api http-api "http://$HTTP_ADDR/healthz"
for w in worker-email worker-push worker-line worker-inapp worker-webhook; do
  check_server "$w" "$w" "http://$ADMIN_ADDR/healthz"
done
check_server provider-sim provider-sim "http://$SIM_ADDR/_sim/health"

once notifyctl notifyctl keys list
if [ "$exit_status" = 0 ]; then
  echo "image: notifyctl keys list exit 0 (a CLI: no health endpoint)"
else
  fail notifyctl "notifyctl keys list exit $exit_status"
fi

[ "$failed" = 0 ] || die "some binaries failed from the image (logs in $CHECK/logs)"
log "every binary ran from $REF ($DIGEST) via $RUNNER"
