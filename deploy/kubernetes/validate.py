#!/usr/bin/env python3
"""Offline checks of the deployment files, run by deploy/check-deploy.sh.

    validate.py keda-schemas OUTDIR
        Writes strict JSON schemas of KEDA's ScaledObject and TriggerAuthentication to
        OUTDIR, from the pydantic models of the pinned cloudcoil-models-keda package
        (generated from the KEDA v2.16.1 CRDs). Run once per tools install.

    validate.py manifests --k8s-version 1.33 --keda-schemas DIR NAME=FILE...
        Validates every object of each rendered kustomization FILE: Kubernetes kinds
        against the strict schemas bundled with kubernetes-validate, KEDA kinds against
        the schemas above; any other kind is an error. Then checks the project's rules
        (see RULES below). Prints one line per problem, naming the rendering, the object
        and the field, and a summary; exits 1 on any problem.

    validate.py monitoring --dir deploy/monitoring [--docs docs/operations.md]
                           [--alerts FILE] [--dashboard FILE]
        Checks the Grafana dashboard and the alerting rules against metrics.txt (the one
        list of metric names) and the runbook anchors in docs/operations.md.

Strict means what kubeconform -strict means: a field the schema does not name is an
error (additionalProperties: false wherever an object schema lists properties).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import re
import sys
from typing import Any, Iterable

import yaml

# ---------------------------------------------------------------------------------------
# Facts the rules check against.

BINARIES = {
    "ingest", "http-api", "worker-email", "worker-push", "worker-line", "worker-inapp", "worker-webhook",
    "notifyctl", "provider-sim",
}
WORKER_CHANNELS = ("email", "push", "line", "inapp")
ALLOWED_SECRETS = {"notify-secrets", "notify-provider-keys"}
PROVIDER_KEYS_SECRET = "notify-provider-keys"
CONFIG_MAP = "notify-config"
BUDGET_ANNOTATION = "notify.example.com/postgres-connection-budget"
# Provider quotas the per-process rate limits multiply into (docs/channels.md,
# crates/notify-worker DEFAULT_RATE_LIMITS): calls per second.
PROVIDER_QUOTAS = {"line": ("worker-line", 2000), "fcm": ("worker-push", 10000)}
# Default pool sizes (README) when a Deployment does not set NOTIFY_DB_POOL_SIZE.
DEFAULT_POOL = {"ingest": 16}
DEFAULT_POOL_OTHER = 10
# Ingest's event writer opens a pool of its own besides NOTIFY_DB_POOL_SIZE: this many
# connections for each of NOTIFY_INGEST_WRITERS (crates/ingest CONNECTIONS_PER_WRITER).
WRITER_POOL_PER_WRITER = 4
# Prometheus-generated series that alert expressions may use besides metrics.txt.
PROMETHEUS_SERIES = {"up"}

KEDA_KINDS = {("keda.sh/v1alpha1", "ScaledObject"): "scaledobject.json",
              ("keda.sh/v1alpha1", "TriggerAuthentication"): "triggerauthentication.json"}

RULES = """\
every Deployment: no spec.replicas, exactly one HPA or ScaledObject and one PDB select it;
  each container: /usr/local/bin/<binary>, requests+limits for cpu and memory, liveness
  (/healthz) and readiness (/readyz, or gRPC on 50051 for ingest) probes on declared ports,
  preStop sleep, no exec (distroless has no shell), runAsNonRoot, no privilege escalation,
  read-only root, drop ALL, seccomp RuntimeDefault; image tagged, not :latest;
every env: secretKeyRef only to notify-secrets / notify-provider-keys (key = variable),
  $(VAR) defined before use, *_FILE under the notify-provider-keys mount, envFrom of an
  existing notify-config;
terminationGracePeriodSeconds covers preStop + drain/shutdown grace + the longest call;
every worker: a ScaledObject on deliveries.<channel>, rabbitmq over protocol http
  (unacked counted), mode QueueLength, authenticated by an existing TriggerAuthentication
  reading NOTIFY_AMQP_MANAGEMENT_URL from notify-secrets;
rate limit x maxReplicaCount within the provider quota; maxReplicas x pool within the
  PostgreSQL connection budget; Services select pods and name their ports; one default-deny
  NetworkPolicy covers every pod; overlays set one namespace, the base none."""


class Problems:
    def __init__(self) -> None:
        self.items: list[str] = []

    def add(self, where: str, msg: str) -> None:
        self.items.append(f"{where}: {msg}")

    def __bool__(self) -> bool:
        return bool(self.items)


def obj_id(o: dict) -> str:
    return f"{o.get('kind', '?')}/{(o.get('metadata') or {}).get('name', '?')}"


def json_path(parts: Iterable[Any]) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "(top)"


# ---------------------------------------------------------------------------------------
# Schemas


def strictify(node: Any) -> Any:
    """additionalProperties: false on every object schema with properties and no
    additionalProperties; `null` dropped from anyOf (a YAML key with no value is a
    mistake in a manifest, not an explicit null)."""
    if isinstance(node, list):
        return [strictify(n) for n in node]
    if not isinstance(node, dict):
        return node
    node = {k: strictify(v) for k, v in node.items()}
    if "properties" in node and "additionalProperties" not in node:
        node["additionalProperties"] = False
    if "anyOf" in node:
        alts = [a for a in node["anyOf"] if a != {"type": "null"}]
        if len(alts) == 1:
            del node["anyOf"]
            node.update(alts[0])
        else:
            node["anyOf"] = alts
    if node.get("default", 0) is None:
        del node["default"]
    return node


def cmd_keda_schemas(outdir: str) -> int:
    from cloudcoil.models.keda import v1alpha1  # type: ignore

    os.makedirs(outdir, exist_ok=True)
    for (api, kind), fname in KEDA_KINDS.items():
        model = getattr(v1alpha1, kind)
        schema = strictify(model.model_json_schema(by_alias=True))
        # apiVersion, kind and metadata are required of a manifest.
        schema["required"] = sorted(set(schema.get("required", [])) | {"apiVersion", "kind", "metadata"})
        schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
        with open(os.path.join(outdir, fname), "w") as f:
            json.dump(schema, f, indent=1, sort_keys=True)
    with open(os.path.join(outdir, "SOURCE"), "w") as f:
        f.write("cloudcoil-models-keda 2.16.1.0 (KEDA v2.16.1 CRDs), strictified by validate.py\n")
    return 0


class Validator:
    def __init__(self, k8s_version: str, keda_dir: str) -> None:
        import jsonschema
        import kubernetes_validate.utils as kvu
        from referencing import Registry, Resource

        self.jsonschema = jsonschema
        self.kvu = kvu
        self.Registry, self.Resource = Registry, Resource
        versions = [v for v in kvu.all_versions() if kvu.major_minor(v) == k8s_version]
        if not versions:
            raise SystemExit(f"kubernetes-validate has no schemas for Kubernetes {k8s_version}")
        self.schema_dir = f"kubernetes-json-schema/v{versions[-1]}-local-strict"
        self.k8s_version = k8s_version
        self.definitions = Resource.from_contents(
            kvu.schema_contents(f"{self.schema_dir}/_definitions.json", k8s_version))
        self.cache: dict[tuple[str, str], Any] = {}
        self.keda: dict[tuple[str, str], Any] = {}
        for key, fname in KEDA_KINDS.items():
            with open(os.path.join(keda_dir, fname)) as f:
                self.keda[key] = jsonschema.Draft202012Validator(json.load(f))

    def validator_for(self, api: str, kind: str):
        key = (api, kind)
        if key in self.keda:
            return self.keda[key]
        if key not in self.cache:
            group = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api)
            try:
                schema = self.kvu.schema_contents(f"{self.schema_dir}/{kind.lower()}-{group}.json",
                                                  self.k8s_version)
            except FileNotFoundError:
                self.cache[key] = None
            else:
                registry = self.definitions @ (self.Resource.from_contents(schema) @ self.Registry())
                self.cache[key] = self.jsonschema.Draft202012Validator(schema, registry=registry)
        return self.cache[key]

    def validate(self, o: dict, where: str, problems: Problems) -> bool:
        api, kind = o.get("apiVersion"), o.get("kind")
        if not isinstance(api, str) or not isinstance(kind, str):
            problems.add(where, "object without apiVersion or kind")
            return False
        v = self.validator_for(api, kind)
        if v is None:
            problems.add(f"{where} {obj_id(o)}",
                         f"unknown kind {kind} ({api}): no Kubernetes {self.k8s_version} or KEDA schema")
            return False
        ok = True
        for e in sorted(v.iter_errors(o), key=lambda e: list(map(str, e.absolute_path))):
            ok = False
            problems.add(f"{where} {obj_id(o)}", f"{json_path(e.absolute_path)}: {e.message}")
        return ok


# ---------------------------------------------------------------------------------------
# Project rules over one rendering


def duration_seconds(text: str) -> float:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*", str(text))
    if not m:
        raise ValueError(f"not a duration: {text!r}")
    n = float(m.group(1))
    return n * {"ms": 0.001, "s": 1, None: 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]


def labels_match(selector: dict, labels: dict) -> bool:
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, vals = expr.get("key"), expr.get("operator"), expr.get("values") or []
        if op == "In" and labels.get(key) not in vals:
            return False
        if op == "NotIn" and labels.get(key) in vals:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def pod_containers(spec: dict) -> list[tuple[str, dict]]:
    out = [("containers", c) for c in spec.get("containers") or []]
    out += [("initContainers", c) for c in spec.get("initContainers") or []]
    return out


class Rendering:
    def __init__(self, name: str, objs: list[dict], problems: Problems) -> None:
        self.name, self.objs, self.p = name, objs, problems
        self.by_kind: dict[str, list[dict]] = {}
        for o in objs:
            self.by_kind.setdefault(o.get("kind", ""), []).append(o)
        cms = [o for o in self.by_kind.get("ConfigMap", []) if o["metadata"]["name"] == CONFIG_MAP]
        self.config = (cms[0].get("data") or {}) if cms else {}
        self.config_obj = cms[0] if cms else None

    def where(self, o: dict, field: str = "") -> str:
        return f"{self.name} {obj_id(o)}" + (f" {field}" if field else "")

    def err(self, o: dict, field: str, msg: str) -> None:
        self.p.add(self.where(o, field), msg)

    def cfg_seconds(self, key: str, default: str) -> float:
        return duration_seconds(self.config.get(key) or default)

    # --- per container -------------------------------------------------------------------

    def check_container(self, o: dict, spec: dict, path: str, c: dict, long_running: bool) -> None:
        f = f"{path}[{c.get('name')}]"
        cmd = c.get("command") or []
        if not cmd or not re.fullmatch(r"/usr/local/bin/(.+)", cmd[0]) or cmd[0].rsplit("/", 1)[1] not in BINARIES:
            self.err(o, f + ".command", f"must start with /usr/local/bin/<one of {sorted(BINARIES)}>, got {cmd}")
        image = c.get("image", "")
        tag = image.rsplit("/", 1)[-1]
        if "@sha256:" not in image and (":" not in tag or tag.endswith(":latest")):
            self.err(o, f + ".image", f"{image!r}: pin a version tag or digest (never :latest)")
        res = c.get("resources") or {}
        for kind in ("requests", "limits"):
            for r in ("cpu", "memory"):
                if r not in (res.get(kind) or {}):
                    self.err(o, f"{f}.resources.{kind}.{r}", "missing")
        sc = c.get("securityContext") or {}
        psc = spec.get("securityContext") or {}
        if not (sc.get("runAsNonRoot", psc.get("runAsNonRoot")) is True):
            self.err(o, f + ".securityContext.runAsNonRoot", "must be true (pod or container)")
        if sc.get("allowPrivilegeEscalation") is not False:
            self.err(o, f + ".securityContext.allowPrivilegeEscalation", "must be false")
        if sc.get("readOnlyRootFilesystem") is not True:
            self.err(o, f + ".securityContext.readOnlyRootFilesystem", "must be true")
        if "ALL" not in ((sc.get("capabilities") or {}).get("drop") or []):
            self.err(o, f + ".securityContext.capabilities.drop", "must contain ALL")
        seccomp = (sc.get("seccompProfile") or psc.get("seccompProfile") or {}).get("type")
        if seccomp != "RuntimeDefault":
            self.err(o, f + ".securityContext.seccompProfile.type", f"must be RuntimeDefault, got {seccomp}")
        # No shell in the distroless image: exec handlers cannot run.
        for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
            if "exec" in (c.get(probe) or {}):
                self.err(o, f"{f}.{probe}.exec", "the image has no shell or tools: use httpGet/grpc")
        for hook in ("preStop", "postStart"):
            if "exec" in ((c.get("lifecycle") or {}).get(hook) or {}):
                self.err(o, f"{f}.lifecycle.{hook}.exec", "the image has no shell: use sleep/httpGet")
        self.check_env(o, spec, f, c)
        if long_running:
            self.check_probes(o, f, c)

    def check_probes(self, o: dict, f: str, c: dict) -> None:
        ports = {p.get("name"): p.get("containerPort") for p in c.get("ports") or []}
        numbers = set(ports.values())
        binary = (c.get("command") or ["/"])[0].rsplit("/", 1)[-1]

        def port_ok(probe: str, port: Any) -> None:
            if (isinstance(port, str) and port not in ports) or (isinstance(port, int) and port not in numbers):
                self.err(o, f"{f}.{probe}", f"port {port!r} is not a declared container port")

        live, ready = c.get("livenessProbe"), c.get("readinessProbe")
        if not live:
            self.err(o, f + ".livenessProbe", "missing")
        elif "httpGet" in live:
            port_ok("livenessProbe", live["httpGet"].get("port"))
            if live["httpGet"].get("path") != "/healthz":
                self.err(o, f + ".livenessProbe.httpGet.path",
                         "must be /healthz (liveness must not depend on PostgreSQL or RabbitMQ)")
        elif "grpc" not in live:
            self.err(o, f + ".livenessProbe", "must be httpGet /healthz or grpc")
        if not ready:
            self.err(o, f + ".readinessProbe", "missing")
        elif binary == "ingest":
            if (ready.get("grpc") or {}).get("port") != 50051:
                self.err(o, f + ".readinessProbe", "ingest must use the native gRPC probe on 50051")
        elif "httpGet" in ready:
            port_ok("readinessProbe", ready["httpGet"].get("port"))
            if ready["httpGet"].get("path") != "/readyz":
                self.err(o, f + ".readinessProbe.httpGet.path", "must be /readyz")
        else:
            self.err(o, f + ".readinessProbe", "must be httpGet /readyz")
        sleep = (((c.get("lifecycle") or {}).get("preStop") or {}).get("sleep") or {}).get("seconds")
        if not isinstance(sleep, int) or sleep < 1:
            self.err(o, f + ".lifecycle.preStop.sleep.seconds", "missing (native sleep action, >= 1)")

    def check_env(self, o: dict, spec: dict, f: str, c: dict) -> None:
        defined: set[str] = set()
        mounts = {}
        volumes = {v.get("name"): v for v in spec.get("volumes") or []}
        for m in c.get("volumeMounts") or []:
            vol = volumes.get(m.get("name"))
            if vol is None:
                self.err(o, f"{f}.volumeMounts[{m.get('name')}]", "no such volume")
            else:
                mounts[m.get("mountPath", "").rstrip("/")] = vol
        for ef in c.get("envFrom") or []:
            ref = ef.get("configMapRef") or ef.get("secretRef")
            if ef.get("secretRef"):
                self.err(o, f + ".envFrom", "secrets only through secretKeyRef, one key per variable")
            elif ref and ref.get("name") != CONFIG_MAP and not ref.get("name", "").startswith(CONFIG_MAP + "-"):
                self.err(o, f + ".envFrom", f"unexpected ConfigMap {ref.get('name')!r}")
            elif ref and self.config_obj is None:
                self.err(o, f + ".envFrom", f"ConfigMap {CONFIG_MAP} is not in this rendering")
        for e in c.get("env") or []:
            name = e.get("name", "")
            value = e.get("value")
            if isinstance(value, str):
                for ref in re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", value):
                    if ref not in defined:
                        self.err(o, f"{f}.env[{name}]", f"$({ref}) is not defined before it (Kubernetes leaves it as text)")
                if name.endswith("_FILE") and value:
                    base = os.path.dirname(value)
                    vol = mounts.get(base)
                    if vol is None or (vol.get("secret") or {}).get("secretName") != PROVIDER_KEYS_SECRET:
                        self.err(o, f"{f}.env[{name}]", f"{value} is not in a mount of Secret {PROVIDER_KEYS_SECRET}")
            skr = (e.get("valueFrom") or {}).get("secretKeyRef")
            if skr is not None:
                sname = skr.get("name")
                if sname not in ALLOWED_SECRETS:
                    self.err(o, f"{f}.env[{name}].valueFrom.secretKeyRef.name",
                             f"{sname!r}: secrets come only from {sorted(ALLOWED_SECRETS)}")
                elif sname == "notify-secrets" and skr.get("key") != name:
                    self.err(o, f"{f}.env[{name}].valueFrom.secretKeyRef.key",
                             f"{skr.get('key')!r}: the key must be the variable's name")
            cmr = (e.get("valueFrom") or {}).get("configMapKeyRef")
            if cmr is not None and cmr.get("name") != CONFIG_MAP:
                self.err(o, f"{f}.env[{name}]", f"unexpected ConfigMap {cmr.get('name')!r}")
            defined.add(name)
        for vname, vol in volumes.items():
            sec = (vol.get("secret") or {}).get("secretName")
            if sec is not None and sec not in ALLOWED_SECRETS:
                self.err(o, f"volumes[{vname}].secret.secretName", f"{sec!r}: only {sorted(ALLOWED_SECRETS)}")

    def env_of(self, c: dict, key: str) -> str | None:
        for e in c.get("env") or []:
            if e.get("name") == key and "value" in e:
                return e["value"]
        if any((ef.get("configMapRef") or {}).get("name") == CONFIG_MAP for ef in c.get("envFrom") or []):
            return self.config.get(key)
        return None

    # --- whole rendering -----------------------------------------------------------------

    def check(self) -> None:
        deployments = self.by_kind.get("Deployment", [])
        hpas = self.by_kind.get("HorizontalPodAutoscaler", [])
        sos = self.by_kind.get("ScaledObject", [])
        pdbs = self.by_kind.get("PodDisruptionBudget", [])
        if self.config_obj is None:
            self.p.add(self.name, f"ConfigMap {CONFIG_MAP} missing")
        comps = {}
        max_replicas: dict[str, int] = {}
        for d in deployments:
            name = d["metadata"]["name"]
            spec = d["spec"]["template"]["spec"]
            labels = d["spec"]["template"]["metadata"].get("labels") or {}
            comp = labels.get("app.kubernetes.io/component", "")
            comps[comp] = d
            if not labels_match(d["spec"].get("selector") or {}, labels):
                self.err(d, "spec.selector", "does not match the pod template's labels")
            if "replicas" in d["spec"]:
                self.err(d, "spec.replicas", "set, but an autoscaler owns the count (apply would reset it)")
            scalers = [h for h in hpas if (h["spec"].get("scaleTargetRef") or {}).get("name") == name
                       and (h["spec"]["scaleTargetRef"].get("kind") == "Deployment")]
            scalers += [s for s in sos if (s["spec"].get("scaleTargetRef") or {}).get("name") == name]
            if len(scalers) != 1:
                self.err(d, "", f"needs exactly one HorizontalPodAutoscaler or ScaledObject, found {len(scalers)}")
            for s in scalers:
                lo = s["spec"].get("minReplicas", s["spec"].get("minReplicaCount", 1))
                hi = s["spec"].get("maxReplicas", s["spec"].get("maxReplicaCount", 100))
                if lo > hi:
                    self.err(s, "spec", f"min replicas {lo} > max replicas {hi}")
                max_replicas[name] = hi
            sel = [p for p in pdbs if labels_match(p["spec"].get("selector") or {}, labels)]
            if len(sel) != 1:
                self.err(d, "", f"needs exactly one PodDisruptionBudget selecting its pods, found {len(sel)}")
            containers = spec.get("containers") or []
            for path, c in pod_containers(spec):
                self.check_container(d, spec, f"spec.template.spec.{path}", c, path == "containers")
            if containers:
                self.check_grace(d, comp, spec, containers[0])
        for ch in WORKER_CHANNELS:
            if f"worker-{ch}" not in comps:
                self.p.add(self.name, f"no Deployment with app.kubernetes.io/component=worker-{ch}")
        for comp in ("ingest", "http-api"):
            if comp not in comps:
                self.p.add(self.name, f"no Deployment with app.kubernetes.io/component={comp}")
        self.check_scaled_objects(comps, sos)
        self.check_budgets(deployments, max_replicas)
        for j in self.by_kind.get("Job", []):
            spec = j["spec"]["template"]["spec"]
            for path, c in pod_containers(spec):
                self.check_container(j, spec, f"spec.template.spec.{path}", c, False)
        self.check_services(deployments)
        self.check_network_policies(deployments)
        self.check_namespaces()

    def check_grace(self, d: dict, comp: str, spec: dict, c: dict) -> None:
        tgps = spec.get("terminationGracePeriodSeconds", 30)
        pre = ((((c.get("lifecycle") or {}).get("preStop") or {}).get("sleep")) or {}).get("seconds", 0)
        try:
            if comp.startswith("worker-"):
                grace = duration_seconds(self.env_of(c, "NOTIFY_SHUTDOWN_GRACE") or "30s")
                calls = max(duration_seconds(self.env_of(c, "NOTIFY_HTTP_TIMEOUT") or "10s"),
                            duration_seconds(self.env_of(c, "NOTIFY_SMTP_TIMEOUT") or "15s"))
                if grace < calls + 10:
                    self.err(d, "NOTIFY_SHUTDOWN_GRACE",
                             f"{grace:g}s does not cover the longest provider call ({calls:g}s) + 10s to record it")
                need = pre + grace + 10
                why = f"preStop {pre}s + NOTIFY_SHUTDOWN_GRACE {grace:g}s + 10s to close and flush"
            elif comp == "ingest":
                drain = float(self.env_of(c, "NOTIFY_DRAIN_SECONDS") or 0)
                req = duration_seconds(self.env_of(c, "NOTIFY_REQUEST_TIMEOUT") or "30s")
                need = pre + drain + req + 5
                why = f"preStop {pre}s + NOTIFY_DRAIN_SECONDS {drain:g}s + NOTIFY_REQUEST_TIMEOUT {req:g}s + 5s"
            else:
                need = pre + 25
                why = f"preStop {pre}s + 20s requests in flight + 5s"
        except ValueError as e:
            self.err(d, "env", str(e))
            return
        if tgps < need:
            self.err(d, "spec.template.spec.terminationGracePeriodSeconds", f"{tgps} < {need:g} = {why}")

    def check_scaled_objects(self, comps: dict, sos: list[dict]) -> None:
        tas = {t["metadata"]["name"]: t for t in self.by_kind.get("TriggerAuthentication", [])}
        prefix = self.config.get("NOTIFY_AMQP_PREFIX") or ""
        for ch in WORKER_CHANNELS:
            d = comps.get(f"worker-{ch}")
            if d is None:
                continue
            mine = [s for s in sos if (s["spec"].get("scaleTargetRef") or {}).get("name") == d["metadata"]["name"]]
            if not mine:
                self.err(d, "", f"no KEDA ScaledObject scales worker-{ch}")
                continue
            for s in mine:
                triggers = s["spec"].get("triggers") or []
                rabbit = [t for t in triggers if t.get("type") == "rabbitmq"]
                if not rabbit:
                    self.err(s, "spec.triggers", "needs a rabbitmq trigger")
                for i, t in enumerate(rabbit):
                    md = t.get("metadata") or {}
                    f = f"spec.triggers[{i}].metadata"
                    if md.get("queueName") != f"{prefix}deliveries.{ch}":
                        self.err(s, f + ".queueName", f"{md.get('queueName')!r}, expected {prefix}deliveries.{ch}")
                    if md.get("protocol") != "http":
                        self.err(s, f + ".protocol",
                                 f"{md.get('protocol')!r}: must be http (the management API counts unacked messages; amqp sees only ready ones)")
                    if md.get("mode") != "QueueLength":
                        self.err(s, f + ".mode", f"{md.get('mode')!r}: must be QueueLength")
                    if str(md.get("excludeUnacknowledged", "false")).lower() == "true":
                        self.err(s, f + ".excludeUnacknowledged", "unacked messages are load: do not exclude them")
                    try:
                        if float(md.get("value", "x")) <= 0:
                            raise ValueError
                    except ValueError:
                        self.err(s, f + ".value", f"{md.get('value')!r}: a positive number of messages per replica")
                    if "host" in md or "hostFromEnv" in md:
                        self.err(s, f, "the management URL (with its password) belongs in the TriggerAuthentication")
                    ref = (t.get("authenticationRef") or {}).get("name")
                    ta = tas.get(ref)
                    if ta is None:
                        self.err(s, f"spec.triggers[{i}].authenticationRef", f"no TriggerAuthentication {ref!r}")
                        continue
                    hosts = [r for r in ta["spec"].get("secretTargetRef") or [] if r.get("parameter") == "host"]
                    if not any(r.get("name") == "notify-secrets" and r.get("key") == "NOTIFY_AMQP_MANAGEMENT_URL" for r in hosts):
                        self.err(ta, "spec.secretTargetRef",
                                 "needs parameter host from notify-secrets key NOTIFY_AMQP_MANAGEMENT_URL")

    def check_budgets(self, deployments: list[dict], max_replicas: dict[str, int]) -> None:
        rates = {}
        raw = self.config.get("NOTIFY_RATE_LIMITS") or "line=1000,fcm=5000"
        for part in filter(None, (p.strip() for p in raw.split(","))):
            k, _, v = part.partition("=")
            try:
                rates[k.strip()] = int(v)
            except ValueError:
                self.p.add(f"{self.name} ConfigMap/{CONFIG_MAP}", f"NOTIFY_RATE_LIMITS: bad entry {part!r}")
        by_comp = {d["spec"]["template"]["metadata"]["labels"].get("app.kubernetes.io/component"): d for d in deployments}
        for provider, (comp, quota) in PROVIDER_QUOTAS.items():
            d = by_comp.get(comp)
            if d is None:
                continue
            n = max_replicas.get(d["metadata"]["name"], 1)
            rate = rates.get(provider)
            if rate is None:
                self.p.add(f"{self.name} ConfigMap/{CONFIG_MAP}",
                           f"NOTIFY_RATE_LIMITS has no {provider}= limit: {comp} would be unlimited")
            elif rate * n > quota:
                self.p.add(f"{self.name} ConfigMap/{CONFIG_MAP}",
                           f"NOTIFY_RATE_LIMITS {provider}={rate}/s x {n} {comp} replicas = {rate * n}/s > {provider} quota {quota}/s")
        if self.config_obj is None:
            return
        budget = (self.config_obj["metadata"].get("annotations") or {}).get(BUDGET_ANNOTATION)
        if budget is None:
            self.p.add(f"{self.name} ConfigMap/{CONFIG_MAP}", f"annotation {BUDGET_ANNOTATION} missing")
            return
        total, parts = 0, []
        for d in deployments:
            c = d["spec"]["template"]["spec"]["containers"][0]
            comp = d["spec"]["template"]["metadata"]["labels"].get("app.kubernetes.io/component", "")
            pool = int(self.env_of(c, "NOTIFY_DB_POOL_SIZE") or DEFAULT_POOL.get(comp, DEFAULT_POOL_OTHER))
            if comp == "ingest":
                pool += WRITER_POOL_PER_WRITER * int(self.env_of(c, "NOTIFY_INGEST_WRITERS") or 1)
            n = max_replicas.get(d["metadata"]["name"], 1)
            total += pool * n
            parts.append(f"{comp} {n}x{pool}")
        if total > int(budget):
            self.p.add(f"{self.name} ConfigMap/{CONFIG_MAP}",
                       f"PostgreSQL connections at max scale {total} ({', '.join(parts)}) > budget {budget}")

    def check_services(self, deployments: list[dict]) -> None:
        for s in self.by_kind.get("Service", []):
            sel = s["spec"].get("selector") or {}
            pods = [d for d in deployments if labels_match({"matchLabels": sel}, d["spec"]["template"]["metadata"].get("labels") or {})]
            if not sel or not pods:
                self.err(s, "spec.selector", "selects no Deployment's pods")
                continue
            for port in s["spec"].get("ports") or []:
                tp = port.get("targetPort", port.get("port"))
                for d in pods:
                    cports = [p for c in d["spec"]["template"]["spec"]["containers"] for p in c.get("ports") or []]
                    if not any(tp in (p.get("name"), p.get("containerPort")) for p in cports):
                        self.err(s, f"spec.ports[{port.get('name')}].targetPort", f"{tp!r} is not a port of {obj_id(d)}")

    def check_network_policies(self, deployments: list[dict]) -> None:
        nps = self.by_kind.get("NetworkPolicy", [])
        deny = [n for n in nps if set(n["spec"].get("policyTypes") or []) >= {"Ingress", "Egress"}
                and not n["spec"].get("ingress") and not n["spec"].get("egress")]
        if not deny:
            self.p.add(self.name, "no default-deny NetworkPolicy (Ingress and Egress, no rules)")
        pods = [(d, d["spec"]["template"]["metadata"].get("labels") or {}) for d in deployments]
        pods += [(j, j["spec"]["template"]["metadata"].get("labels") or {}) for j in self.by_kind.get("Job", [])]
        for o, labels in pods:
            if not any(labels_match(n["spec"].get("podSelector") or {}, labels) for n in deny):
                self.err(o, "", "its pods are not covered by the default-deny NetworkPolicy")
            dns = [n for n in nps if labels_match(n["spec"].get("podSelector") or {}, labels)
                   and any(p.get("port") == 53 for r in n["spec"].get("egress") or [] for p in r.get("ports") or [])]
            if not dns:
                self.err(o, "", "no NetworkPolicy lets its pods reach DNS (53)")

    def check_namespaces(self) -> None:
        namespaces = {(o.get("metadata") or {}).get("namespace") for o in self.objs}
        if self.name == "base":
            if namespaces != {None}:
                self.p.add(self.name, f"the base must be namespace-agnostic, found {sorted(map(str, namespaces))}")
        elif len(namespaces) != 1 or None in namespaces:
            self.p.add(self.name, f"an overlay must put every object in one namespace, found {sorted(map(str, namespaces))}")


def cmd_manifests(args: argparse.Namespace) -> int:
    problems = Problems()
    v = Validator(args.k8s_version, args.keda_schemas)
    total = 0
    schema_only = set(args.schema_only or [])
    for spec in list(args.renderings) + sorted(schema_only):
        name, _, path = spec.partition("=")
        try:
            with open(path) as f:
                objs = [o for o in yaml.safe_load_all(f) if o is not None]
        except (OSError, yaml.YAMLError) as e:
            problems.add(name, f"cannot read {path}: {e}")
            continue
        if not objs:
            problems.add(name, "renders no objects")
        valid = [o for o in objs if v.validate(o, name, problems)] if isinstance(objs, list) else []
        total += len(objs)
        if spec in schema_only:
            continue
        if len(valid) == len(objs):
            Rendering(name, objs, problems).check()
        else:
            problems.add(name, "project rules not checked: schema errors first")
    return report(problems, "manifests", f"{len(args.renderings)} renderings, {total} objects valid; rules OK")


# ---------------------------------------------------------------------------------------
# Monitoring

PROMQL_KEYWORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or",
    "unless", "offset", "inf", "nan", "atan2",
}


def load_metrics(path: str) -> dict[str, tuple[str, set[str]]]:
    """metrics.txt: `name type labels` per line (labels comma-separated or -)."""
    out = {}
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            parts = line.split()
            if len(parts) != 3 or parts[1] not in ("counter", "gauge", "histogram"):
                raise SystemExit(f"{path}:{n}: expected `name counter|gauge|histogram labels`")
            labels = set() if parts[2] == "-" else set(parts[2].split(","))
            out[parts[0]] = (parts[1], labels)
    return out


def series_names(metrics: dict[str, tuple[str, set[str]]]) -> dict[str, tuple[str, set[str]]]:
    """Every series name a metric exposes, with its type and labels."""
    out = {}
    for name, (kind, labels) in metrics.items():
        if kind == "histogram":
            out[name + "_bucket"] = ("counter", labels | {"le"})
            out[name + "_sum"] = ("counter", labels)
            out[name + "_count"] = ("counter", labels)
        else:
            out[name] = (kind, labels)
    return out


SCRAPE_LABELS = {"job", "instance", "namespace", "pod", "container", "service", "endpoint"}


def promql_problems(expr: str, series: dict, extra: set[str]) -> list[str]:
    """Metric names an expression uses that are not listed, labels that a listed metric
    does not have, and counters read without a range (a raw counter value means nothing)."""
    out = []
    text = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`', '""', expr)
    text = re.sub(r"\$\{?\w+\}?", "1", text)  # Grafana variables ($__rate_interval, ...)
    # Selectors with matchers: check label names, then drop the braces.
    for m in re.finditer(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\s*\{([^}]*)\}", text):
        name = m.group(1)
        if name in series:
            for lab in re.findall(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)", m.group(2)):
                if lab not in series[name][1] and lab not in SCRAPE_LABELS and lab != "__name__":
                    out.append(f"{name} has no label {lab!r}")
    text = re.sub(r"\{[^}]*\}", "", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    for m in re.finditer(r"(?<![\w.])([a-zA-Z_:][a-zA-Z0-9_:]*)\b(?!\s*\()", text):
        name = m.group(1)
        if name.lower() in PROMQL_KEYWORDS:
            continue
        if name not in series and name not in extra:
            out.append(f"unknown metric {name!r} (not in metrics.txt)")
            continue
        if name in series and series[name][0] == "counter":
            after = text[m.end():].lstrip()
            if not after.startswith("["):
                out.append(f"counter {name} used without a range: wrap it in rate()/increase()")
    return out


def github_anchors(markdown: str) -> set[str]:
    anchors = set()
    for line in markdown.splitlines():
        m = re.match(r"#{1,6}\s+(.*)", line)
        if m:
            t = m.group(1).strip().lower()
            t = re.sub(r"[^\w\- ]", "", t).replace(" ", "-")
            anchors.add(t)
    return anchors


def cmd_monitoring(args: argparse.Namespace) -> int:
    problems = Problems()
    mdir = args.dir
    metrics = load_metrics(os.path.join(mdir, "metrics.txt"))
    series = series_names(metrics)
    dash_path = args.dashboard or os.path.join(mdir, "grafana-dashboard.json")
    alerts_path = args.alerts or os.path.join(mdir, "alerts.yaml")
    tests_path = os.path.join(mdir, "alerts.test.yaml")

    # --- dashboard ---
    try:
        with open(dash_path) as f:
            dash = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        problems.add(dash_path, f"not valid JSON: {e}")
        dash = None
    used_in_dashboard: set[str] = set()
    panels_checked = 0
    if dash is not None:
        if not isinstance(dash.get("schemaVersion"), int) or dash["schemaVersion"] < 36:
            problems.add(dash_path, "schemaVersion must be an integer >= 36")
        for k in ("title", "uid", "panels", "templating"):
            if k not in dash:
                problems.add(dash_path, f"missing {k}")
        variables = {v.get("name"): v for v in (dash.get("templating") or {}).get("list", [])}
        ds = variables.get("datasource")
        if not ds or ds.get("type") != "datasource" or ds.get("query") != "prometheus":
            problems.add(dash_path, "templating: needs variable `datasource` of type datasource, query prometheus")
        if "channel" not in variables:
            problems.add(dash_path, "templating: needs variable `channel`")
        for vname, var in variables.items():
            if var.get("type") == "query":
                q = var.get("query")
                q = q.get("query", "") if isinstance(q, dict) else (q or "")
                m = re.fullmatch(r"\s*label_values\((.*),\s*(\w+)\s*\)\s*", q)
                inner = m.group(1) if m else q
                for msg in promql_problems(inner, series, set()):
                    problems.add(f"{dash_path} variable {vname}", msg)
        ids = set()

        def walk(panels: list[dict]) -> Iterable[dict]:
            for p in panels:
                yield p
                yield from walk(p.get("panels") or [])

        for p in walk(dash.get("panels") or []):
            where = f"{dash_path} panel {p.get('id')} {p.get('title')!r}"
            if p.get("id") in ids:
                problems.add(where, "duplicate panel id")
            ids.add(p.get("id"))
            if "gridPos" not in p:
                problems.add(where, "missing gridPos")
            if p.get("type") == "row":
                continue
            panels_checked += 1
            if (p.get("datasource") or {}).get("uid") != "${datasource}":
                problems.add(where, "datasource.uid must be ${datasource}")
            targets = p.get("targets") or []
            if not targets:
                problems.add(where, "no targets")
            for t in targets:
                expr = t.get("expr", "")
                if not expr.strip():
                    problems.add(where, f"target {t.get('refId')} has no expr")
                for msg in promql_problems(expr, series, set()):
                    problems.add(f"{where} target {t.get('refId')}", msg)
                for name in re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", expr):
                    for metric, (kind, _) in metrics.items():
                        if name == metric or (kind == "histogram" and name in (metric + "_bucket", metric + "_sum", metric + "_count")):
                            used_in_dashboard.add(metric)
        for metric in sorted(set(metrics) - used_in_dashboard):
            problems.add(dash_path, f"no panel shows {metric}")

    # --- alerts ---
    docs = ""
    if args.docs:
        with open(args.docs) as f:
            docs = f.read()
    anchors = github_anchors(docs)
    alert_names: list[str] = []
    try:
        with open(alerts_path) as f:
            rules = yaml.safe_load(f)
    except (OSError, yaml.YAMLError) as e:
        problems.add(alerts_path, f"cannot read: {e}")
        rules = {}
    for g in (rules or {}).get("groups") or []:
        for r in g.get("rules") or []:
            if "alert" not in r:
                continue
            name = r["alert"]
            alert_names.append(name)
            where = f"{alerts_path} alert {name}"
            if not re.fullmatch(r"Notify[A-Z][A-Za-z]+", name):
                problems.add(where, "alert names are Notify<CamelCase>")
            if "for" not in r:
                problems.add(where, "missing `for`")
            sev = (r.get("labels") or {}).get("severity")
            if sev not in ("critical", "warning", "info"):
                problems.add(where, f"labels.severity {sev!r}: critical, warning or info")
            ann = r.get("annotations") or {}
            for k in ("summary", "description", "runbook_url"):
                if not ann.get(k):
                    problems.add(where, f"annotations.{k} missing")
            want = f"docs/operations.md#{name.lower()}"
            if ann.get("runbook_url") and not str(ann["runbook_url"]).endswith(want):
                problems.add(where, f"annotations.runbook_url must end with {want}")
            if args.docs and name.lower() not in anchors:
                problems.add(where, f"{args.docs} has no section `### {name}` (anchor #{name.lower()})")
            for msg in promql_problems(str(r.get("expr", "")), series, PROMETHEUS_SERIES):
                problems.add(where + " expr", msg)
    if args.docs:
        # Every link to a section of the runbook resolves: in the runbook itself and in
        # the deployment files (deploy/, broken test cases excluded).
        refs = [(args.docs, a) for a in re.findall(r"\]\(#([\w-]+)\)", docs)]
        deploy_dir = os.path.dirname(os.path.abspath(mdir))
        for root, dirs, files in os.walk(deploy_dir):
            dirs[:] = [d for d in dirs if d != "tests"]
            for fname in files:
                path = os.path.join(root, fname)
                try:
                    with open(path, encoding="utf-8") as f:
                        text = f.read()
                except (UnicodeDecodeError, OSError):
                    continue
                refs += [(path, a) for a in re.findall(r"operations\.md#([\w-]+)", text)]
        for path, anchor in refs:
            if anchor not in anchors:
                problems.add(os.path.relpath(path), f"link to docs/operations.md#{anchor}: no such section")
    for name in args.require_alert or []:
        if name not in alert_names:
            problems.add(alerts_path, f"alert {name} missing")

    # --- unit tests cover each alert both ways ---
    if os.path.exists(tests_path) and not args.alerts:
        with open(tests_path) as f:
            tests = yaml.safe_load(f) or {}
        fires, quiet = set(), set()
        for t in tests.get("tests") or []:
            for a in t.get("alert_rule_test") or []:
                (fires if a.get("exp_alerts") else quiet).add(a.get("alertname"))
        for name in alert_names:
            if name not in fires:
                problems.add(tests_path, f"no test shows {name} firing")
            if name not in quiet:
                problems.add(tests_path, f"no test shows {name} quiet on healthy series")

    return report(
        problems,
        "monitoring",
        f"dashboard OK ({panels_checked} panels, {len(metrics)} metrics); {len(alert_names)} alerts OK",
    )



def report(problems, what: str, ok_line: str) -> int:
    """Prints every problem (exit 1) or the one-line summary (exit 0)."""
    for item in problems.items:
        print(f"ERROR {item}", file=sys.stderr)
    if problems:
        print(f"{what}: {len(problems.items)} problem(s)", file=sys.stderr)
        return 1
    print(ok_line)
    return 0

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    k = sub.add_parser("keda-schemas")
    k.add_argument("outdir")
    m = sub.add_parser("manifests", epilog="rules:\n" + RULES, formatter_class=argparse.RawDescriptionHelpFormatter)
    m.add_argument("--k8s-version", required=True)
    m.add_argument("--keda-schemas", required=True)
    m.add_argument("--schema-only", action="append", metavar="NAME=FILE",
                   help="also validate these objects against the schemas, without the rules")
    m.add_argument("renderings", nargs="+", metavar="NAME=FILE")
    mo = sub.add_parser("monitoring")
    mo.add_argument("--dir", required=True)
    mo.add_argument("--docs")
    mo.add_argument("--alerts", help="check this rule file instead (tests are then skipped)")
    mo.add_argument("--dashboard")
    mo.add_argument("--require-alert", action="append")
    args = ap.parse_args()
    if args.cmd == "keda-schemas":
        return cmd_keda_schemas(args.outdir)
    if args.cmd == "manifests":
        return cmd_manifests(args)
    return cmd_monitoring(args)


if __name__ == "__main__":
    sys.exit(main())
