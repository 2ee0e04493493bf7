#!/usr/bin/env bash
# Builds the platform's container image without a container engine or a Docker daemon:
# an OCI image layout (https://github.com/opencontainers/image-spec/blob/main/image-layout.md)
# assembled here from tar layers, a config and a manifest, from scratch. Nothing is
# fetched from a registry; the image holds only
#
#   layer 1 "base": the shared libraries the binaries link (found with ldd: glibc's
#     libc/libm/ld.so and libgcc_s, merged-/usr paths as on Debian), the CA bundle
#     /etc/ssl/certs/ca-certificates.crt made from Debian's Mozilla set (reqwest's
#     platform verifier reads the system roots; sqlx, lapin, lettre and the OTLP exporter
#     use built-in webpki roots),
#     /etc/passwd and /etc/group with `nonroot` (65532:65532), /etc/nsswitch.conf, an
#     empty /tmp, and the Debian copyright files of what it copies. No tzdata: chrono-tz
#     compiles the zone database into the binaries and nothing reads /etc/localtime;
#   layer 2 "app": the binaries in /usr/local/bin and /etc/notify/notification-types.json.
#
# The config runs as User 65532:65532, entrypoint `ingest serve` (Kubernetes picks the
# binary with `command:`), and needs no writable path: the binaries write nothing to
# disk (deploy/image-check.sh runs each from a read-only root filesystem).
#
#   deploy/image.sh          build, print the sizes and the digest
#   deploy/image.sh --pin    the same, then write the digest into the production overlay
#                            (deploy/kubernetes/overlays/production/kustomization.yaml)
#
# Settings (environment, with defaults):
#   NOTIFY_IMAGE_BIN_DIR  prebuilt binaries to use; when unset, `cargo build --release --bins`
#                         runs and ${CARGO_TARGET_DIR:-target}/release is used
#   NOTIFY_IMAGE_DIR      output folder                 (${NOTIFY_STACK_DIR:-<repo>/.stack}/image)
#   NOTIFY_IMAGE_NAME     image name                    (ghcr.io/example/notify)
#   NOTIFY_IMAGE_TAG      tag in the layout             (the workspace version)
#   NOTIFY_IMAGE_CA_FILE  CA bundle for the image       (Debian's Mozilla set, not the
#                         build machine's own /etc/ssl/certs, which may hold local CAs)
#   SOURCE_DATE_EPOCH     time stamp of every file and of the config (commit time of HEAD)
#
# Output in NOTIFY_IMAGE_DIR: oci/ (the layout; copy it to a registry with
# `skopeo copy --preserve-digests oci:DIR/oci:TAG docker://NAME:TAG`), rootfs/ (the layers
# unpacked, for deploy/image-check.sh), digest (sha256 of the manifest, what Kubernetes
# pins), build.log. The same binaries and commit give the same digest (sorted tar entries,
# fixed owners and time stamps, gzip -n).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
STACK=${NOTIFY_STACK_DIR:-$repo/.stack}
OUT=${NOTIFY_IMAGE_DIR:-$STACK/image}
NAME=${NOTIFY_IMAGE_NAME:-ghcr.io/example/notify}
VERSION=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' "$repo/Cargo.toml")
TAG=${NOTIFY_IMAGE_TAG:-$VERSION}
REVISION=$(git -C "$repo" rev-parse HEAD 2>/dev/null || echo unknown)
EPOCH=${SOURCE_DATE_EPOCH:-$(git -C "$repo" log -1 --format=%ct 2>/dev/null || echo 0)}
# Every binary of the workspace, as the Dockerfile lists them.
BINS=(ingest worker-email worker-push worker-line worker-inapp worker-webhook http-api notifyctl provider-sim)
OVERLAY=$here/kubernetes/overlays/production/kustomization.yaml
UID_NONROOT=65532

pin=0
case "${1:-}" in
  "") ;;
  --pin) pin=1 ;;
  *) echo "usage: $0 [--pin]" >&2; exit 64 ;;
esac

log() { printf 'image: %s\n' "$*" | tee -a "$OUT/build.log" >&2; }
die() { printf 'image: error: %s\n' "$*" >&2; exit 1; }

mkdir -p "$OUT"
: >"$OUT/build.log"
for tool in tar gzip sha256sum ldd; do command -v "$tool" >/dev/null || die "$tool is missing"; done

if [ -n "${NOTIFY_IMAGE_BIN_DIR:-}" ]; then
  bin_dir=$NOTIFY_IMAGE_BIN_DIR
else
  log "cargo build --release --bins"
  (cd "$repo" && cargo build --release --locked --bins) || die "cargo build --release failed"
  bin_dir=${CARGO_TARGET_DIR:-$repo/target}/release
fi
for b in "${BINS[@]}"; do [ -x "$bin_dir/$b" ] || die "$bin_dir/$b is missing"; done
log "binaries from $bin_dir (revision $REVISION)"

work=$OUT/work
rm -rf "$work" "$OUT/oci" "$OUT/rootfs"
mkdir -p "$work/base" "$work/app" "$OUT/oci/blobs/sha256"

# ---------------------------------------------------------------- layer 1: base
base=$work/base
# Debian's merged /usr: /lib and /lib64 are links into /usr, as on the build machine.
mkdir -p "$base/usr/lib" "$base/usr/lib64"
[ -L /lib ] && ln -s usr/lib "$base/lib"
[ -L /lib64 ] && ln -s usr/lib64 "$base/lib64"
copy_file() { # host path -> same path in $base (links resolved), mode kept
  local real; real=$(readlink -f "$1")
  mkdir -p "$base$(dirname "$real")"
  cp --preserve=mode "$real" "$base$real"
  if [ "$real" != "$1" ] && [ ! -e "$base$1" ]; then
    mkdir -p "$base$(dirname "$1")"
    ln -s "$real" "$base$1"
  fi
}
# Every library and the ELF interpreter any binary names (ldd lists both).
mapfile -t libs < <(for b in "${BINS[@]}"; do ldd "$bin_dir/$b"; done |
  awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}' | sort -u)
[ ${#libs[@]} -gt 0 ] || die "ldd found no shared libraries (static binaries need no base layer; not handled)"
for l in "${libs[@]}"; do copy_file "$l"; done
# Copyright files of the Debian packages the libraries come from (licence terms travel
# with the copies).
if command -v dpkg >/dev/null; then
  for pkg in $(dpkg -S "${libs[@]}" 2>/dev/null | cut -d: -f1 | sort -u) ca-certificates; do
    [ -f "/usr/share/doc/$pkg/copyright" ] && copy_file "/usr/share/doc/$pkg/copyright"
  done
fi
# The CA bundle: Debian's Mozilla set as /etc/ca-certificates.conf selects it, not the
# machine's /etc/ssl/certs/ca-certificates.crt, which also holds whatever local CAs the
# build machine trusts (/usr/local/share/ca-certificates). NOTIFY_IMAGE_CA_FILE replaces
# it with a bundle of your own.
mkdir -p "$base/etc/ssl/certs"
if [ -n "${NOTIFY_IMAGE_CA_FILE:-}" ]; then
  cp "$NOTIFY_IMAGE_CA_FILE" "$base/etc/ssl/certs/ca-certificates.crt"
  ca_source=$NOTIFY_IMAGE_CA_FILE
else
  if [ ! -f /etc/ca-certificates.conf ] || [ ! -d /usr/share/ca-certificates/mozilla ]; then
    die "Debian's ca-certificates is missing (install it, or set NOTIFY_IMAGE_CA_FILE)"
  fi
  grep -E '^mozilla/' /etc/ca-certificates.conf | LC_ALL=C sort | while read -r crt; do
    cat "/usr/share/ca-certificates/$crt"
    # update-ca-certificates adds a missing final newline the same way.
    [ -z "$(tail -c 1 "/usr/share/ca-certificates/$crt")" ] || echo
  done >"$base/etc/ssl/certs/ca-certificates.crt"
  ca_source="Debian ca-certificates $(dpkg-query -W -f '${Version}' ca-certificates 2>/dev/null || echo '?') (mozilla/)"
fi
chmod 0644 "$base/etc/ssl/certs/ca-certificates.crt"
ca_count=$(grep -c 'BEGIN CERTIFICATE' "$base/etc/ssl/certs/ca-certificates.crt" || true)
[ "$ca_count" -gt 0 ] || die "the CA bundle holds no certificate"
log "CA bundle: $ca_count certificates from $ca_source"
cat >"$base/etc/passwd" <<EOF
root:x:0:0:root:/root:/sbin/nologin
nonroot:x:$UID_NONROOT:$UID_NONROOT:nonroot:/home/nonroot:/sbin/nologin
EOF
cat >"$base/etc/group" <<EOF
root:x:0:
nonroot:x:$UID_NONROOT:
EOF
printf 'hosts: files dns\n' >"$base/etc/nsswitch.conf"
chmod 0644 "$base/etc/passwd" "$base/etc/group" "$base/etc/nsswitch.conf"
mkdir -p "$base/tmp" "$base/home/nonroot"
chmod 1777 "$base/tmp"
chmod 0755 "$base/home/nonroot"
chown "$UID_NONROOT:$UID_NONROOT" "$base/home/nonroot" 2>/dev/null || true

# ---------------------------------------------------------------- layer 2: app
app=$work/app
mkdir -p "$app/usr/local/bin" "$app/etc/notify"
for b in "${BINS[@]}"; do install -m 0755 "$bin_dir/$b" "$app/usr/local/bin/$b"; done
install -m 0644 "$here/notification-types.json" "$app/etc/notify/notification-types.json"

# ---------------------------------------------------------------- blobs
blob() { # file -> prints its digest and size, moves it into the layout
  local d s; d=$(sha256sum "$1" | cut -d' ' -f1); s=$(stat -c %s "$1")
  mv "$1" "$OUT/oci/blobs/sha256/$d"
  echo "$d $s"
}
human() { numfmt --to=iec --suffix=B --format='%.1f' "$1"; }

layer_digests=() layer_sizes=() diff_ids=()
for layer in base app; do
  dir=$work/$layer
  # Directories normalised too: their mode comes from the umask otherwise.
  find "$dir" -type d ! -path "$dir/tmp" -exec chmod 0755 {} +
  find "$dir" -exec touch -h -d "@$EPOCH" {} +
  # Owners: root, except what the chown above gave to nonroot (numeric ids only).
  (cd "$dir" && find . -mindepth 1 -maxdepth 1 -printf '%P\n' | LC_ALL=C sort |
    tar --create --file - --sort=name --format=posix --numeric-owner \
      --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime \
      --mtime="@$EPOCH" --files-from -) >"$work/$layer.tar"
  diff_id=$(sha256sum "$work/$layer.tar" | cut -d' ' -f1)
  raw=$(stat -c %s "$work/$layer.tar")
  gzip -n -9 "$work/$layer.tar"
  read -r digest size < <(blob "$work/$layer.tar.gz")
  diff_ids+=("$diff_id") layer_digests+=("$digest") layer_sizes+=("$size")
  log "layer $layer: $(human "$size") compressed ($size bytes), $(human "$raw") unpacked, sha256:$digest"
done

created=$(date -u -d "@$EPOCH" +%Y-%m-%dT%H:%M:%SZ)
labels=$(cat <<EOF
"org.opencontainers.image.title": "notify",
        "org.opencontainers.image.description": "Notification delivery platform: ingest, channel workers, http-api",
        "org.opencontainers.image.licenses": "Apache-2.0",
        "org.opencontainers.image.version": "$VERSION",
        "org.opencontainers.image.revision": "$REVISION",
        "org.opencontainers.image.created": "$created"
EOF
)
cat >"$work/config.json" <<EOF
{
  "created": "$created",
  "architecture": "amd64",
  "os": "linux",
  "config": {
    "User": "$UID_NONROOT:$UID_NONROOT",
    "Env": [
      "PATH=/usr/local/bin:/usr/bin:/bin",
      "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt"
    ],
    "Entrypoint": ["/usr/local/bin/ingest"],
    "Cmd": ["serve"],
    "WorkingDir": "/",
    "ExposedPorts": {"50051/tcp": {}, "9464/tcp": {}, "8080/tcp": {}},
    "Labels": {
        $labels
    }
  },
  "rootfs": {
    "type": "layers",
    "diff_ids": ["sha256:${diff_ids[0]}", "sha256:${diff_ids[1]}"]
  },
  "history": [
    {"created": "$created", "created_by": "deploy/image.sh: base (shared libraries from ldd, CA certificates, passwd with nonroot 65532)"},
    {"created": "$created", "created_by": "deploy/image.sh: app (/usr/local/bin: ${BINS[*]})"}
  ]
}
EOF
read -r config_digest config_size < <(blob "$work/config.json")

cat >"$work/manifest.json" <<EOF
{
  "schemaVersion": 2,
  "mediaType": "application/vnd.oci.image.manifest.v1+json",
  "config": {
    "mediaType": "application/vnd.oci.image.config.v1+json",
    "digest": "sha256:$config_digest",
    "size": $config_size
  },
  "layers": [
    {"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": "sha256:${layer_digests[0]}", "size": ${layer_sizes[0]}},
    {"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": "sha256:${layer_digests[1]}", "size": ${layer_sizes[1]}}
  ],
  "annotations": {
        $labels
  }
}
EOF
read -r manifest_digest manifest_size < <(blob "$work/manifest.json")

cat >"$OUT/oci/index.json" <<EOF
{
  "schemaVersion": 2,
  "mediaType": "application/vnd.oci.image.index.v1+json",
  "manifests": [
    {
      "mediaType": "application/vnd.oci.image.manifest.v1+json",
      "digest": "sha256:$manifest_digest",
      "size": $manifest_size,
      "platform": {"architecture": "amd64", "os": "linux"},
      "annotations": {"org.opencontainers.image.ref.name": "$TAG"}
    }
  ]
}
EOF
printf '{"imageLayoutVersion": "1.0.0"}\n' >"$OUT/oci/oci-layout"
echo "sha256:$manifest_digest" >"$OUT/digest"
echo "$NAME:$TAG" >"$OUT/ref"

# The layers unpacked in order, as a runtime would, for deploy/image-check.sh.
mkdir -p "$OUT/rootfs"
for d in "${layer_digests[@]}"; do
  tar -xzf "$OUT/oci/blobs/sha256/$d" -C "$OUT/rootfs" --numeric-owner --same-owner 2>/dev/null ||
    tar -xzf "$OUT/oci/blobs/sha256/$d" -C "$OUT/rootfs"
done
rm -rf "$work"

total=$((layer_sizes[0] + layer_sizes[1] + config_size + manifest_size))
log "built $NAME:$TAG: $(human "$total") compressed in total ($total bytes: 2 layers, config $config_size B, manifest $manifest_size B), $(du -sh --apparent-size "$OUT/rootfs" | cut -f1)B unpacked"
log "layout $OUT/oci (tag $TAG)"
log "digest sha256:$manifest_digest"

if [ "$pin" = 1 ]; then
  # The production overlay's images: entry carries the digest (kustomize renders
  # NAME:TAG@sha256:...); the line is replaced in place.
  grep -q '^    digest: sha256:[0-9a-f]\{64\}$' "$OVERLAY" || die "no 'digest: sha256:...' line under images: in $OVERLAY"
  sed -i "s/^    digest: sha256:[0-9a-f]\{64\}$/    digest: sha256:$manifest_digest/" "$OVERLAY"
  log "pinned sha256:$manifest_digest in ${OVERLAY#"$repo"/}"
fi
