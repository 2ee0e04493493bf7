# syntax=docker/dockerfile:1
#
# One image for every service of the platform. Kubernetes picks the binary with
# `command:` (deploy/kubernetes); the default is `ingest serve`.
#
#   docker build -t ghcr.io/example/notify:0.1.0 .
#
# The tested way to build the image is `make image` (deploy/image.sh): no container
# engine, from scratch with the same binaries, libraries, CA certificates and user, and
# deploy/image-check.sh starts every binary from it (docs/images.md). This Dockerfile is
# the equivalent for pipelines that build with BuildKit; the project's machines have no
# Docker engine and do not build it. What it needs from the tree is listed in
# .dockerignore (an allowlist).

############################ build ############################
FROM rust:1.95-bookworm AS builder
WORKDIR /src

# The workspace manifests, the sources, the .proto files (notify-proto's build.rs compiles
# them with protox, no protoc needed) and the SQL migrations (embedded by sqlx::migrate!).
COPY Cargo.toml Cargo.lock ./
COPY crates ./crates
COPY proto ./proto
COPY migrations ./migrations

# --locked: the build uses exactly Cargo.lock. The registry and target caches survive
# between builds on the same builder (BuildKit cache mounts), so the binaries are copied
# out of the cached target directory in the same step.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/usr/local/cargo/git \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bins \
 && mkdir -p /out \
 && for bin in ingest worker-email worker-push worker-line worker-inapp worker-webhook http-api notifyctl provider-sim; do \
        cp "target/release/$bin" /out/ ; \
    done

############################ runtime ############################
# Distroless: glibc, libgcc, CA certificates and tzdata, no shell and no package manager.
# Probes and preStop hooks therefore use grpc/httpGet/sleep actions, never exec.
FROM gcr.io/distroless/cc-debian12:nonroot

LABEL org.opencontainers.image.title="notify" \
      org.opencontainers.image.description="Notification delivery platform: ingest, channel workers, http-api" \
      org.opencontainers.image.licenses="Apache-2.0"

COPY --from=builder /out/ /usr/local/bin/
# The example notification-type file `ingest load-types` applies (the Job
# notify-load-types in deploy/kubernetes); replace it by mounting a ConfigMap there.
COPY deploy/notification-types.json /etc/notify/notification-types.json

# nonroot = 65532:65532 in the distroless image; the manifests also say runAsNonRoot.
USER 65532:65532

# 50051 gRPC (ingest), 9464 admin HTTP (/healthz, /readyz, /metrics), 8080 http-api.
EXPOSE 50051 9464 8080

# Exec form only: there is no shell in this image.
ENTRYPOINT ["/usr/local/bin/ingest"]
CMD ["serve"]
