# Every CI step is a target here. The local stack (PostgreSQL, RabbitMQ, MailDev,
# provider-sim) is installed and started by deploy/local-stack.sh; nothing is needed
# beforehand but a Rust toolchain.

SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
TARGET_DIR := $(or $(CARGO_TARGET_DIR),$(CURDIR)/target)
STACK_DIR := $(or $(NOTIFY_STACK_DIR),$(CURDIR)/.stack)

.PHONY: demo test chaos chaos-ha bench up down status migrate lint fmt build check-deploy fuzz deny-advisories image

## demo: start the stack and the services, send one event to every channel, show the outcome
demo:
	deploy/demo.sh

## test: deployment files validated offline, what earlier runs left on the stack swept
## away (deploy/local-stack.sh sweep), then unit and end-to-end tests against the real
## services of the local stack
test: up check-deploy
	deploy/local-stack.sh sweep
	source $(STACK_DIR)/env && cargo test --workspace --all-targets 2>&1 | tee $(STACK_DIR)/logs/test.log
	@awk '/^test result:/ {p += $$4; f += $$6} END {printf "tests: %d passed, %d failed\n", p, f}' $(STACK_DIR)/logs/test.log

## chaos: broadcasts under kill -9, SIGTERM, RabbitMQ and PostgreSQL restarts; prints chaos: lines
chaos:
	deploy/chaos.sh

## chaos-ha: the chaos broadcasts on a three-node RabbitMQ cluster and a PostgreSQL primary
## with a synchronous standby behind HAProxy, killing the node leading the LINE queue and
## failing Postgres over; a failover check before. Prints chaos: lines with
## broker_failovers and db_failovers. Not in `test`
chaos-ha:
	deploy/chaos.sh ha

## bench: release build; broker and Postgres ceilings, ingest, end-to-end and fan-out figures
bench:
	deploy/bench.sh

## check-deploy: render the Kubernetes overlays and validate them against the Kubernetes and
## KEDA schemas; check the alert rules (promtool, with their unit tests) and the dashboard
check-deploy:
	deploy/check-deploy.sh

## image: the container image without a container engine (deploy/image.sh: an OCI layout
## from scratch, layer sizes and digest printed; NOTIFY_IMAGE_BIN_DIR=DIR uses prebuilt
## binaries instead of a release build), then every binary started from it until /healthz
## answers and stopped with SIGTERM (deploy/image-check.sh: podman, else chroot). Not in `test`
image:
	deploy/image.sh
	deploy/image-check.sh

## up: install what is missing and start PostgreSQL, RabbitMQ, MailDev and provider-sim
up:
	cargo build --workspace --bins
	PROVIDER_SIM_BIN=$(TARGET_DIR)/debug/provider-sim deploy/local-stack.sh up

## down: stop everything `make up` started
down:
	deploy/local-stack.sh down

status:
	deploy/local-stack.sh status

## migrate: apply database migrations to NOTIFY_DATABASE_URL (default: the local stack's)
migrate: up
	source $(STACK_DIR)/env && $(TARGET_DIR)/debug/ingest migrate

## lint: formatting, clippy (warnings are errors), no import cycles between a crate's
## top-level modules, test code included (.ci/import-cycles.py), and cargo deny (licences,
## bans incl. duplicate versions, sources; deny.toml)
lint:
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets -- -D warnings
	python3 .ci/import-cycles.py
	$$(deploy/tools.sh cargo-deny) check licenses bans sources

## deny-advisories: the RustSec advisory check (needs github.com, unreachable on the build machine)
deny-advisories:
	$$(deploy/tools.sh cargo-deny) check advisories

## fuzz: every cargo-fuzz target for FUZZ_SECONDS (60) each; corpus in fuzz/corpus/
fuzz:
	deploy/fuzz.sh

fmt:
	cargo fmt --all

build:
	cargo build --workspace --bins
