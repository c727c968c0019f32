#!/usr/bin/python3
"""Validates deploy/'s Kubernetes manifests offline, with Debian's python3-kubernetes and python3-yaml.

  deploy/check_manifests.py [--version_file=VERSION] [FILE.yaml|DIR ...]   (default: deploy/)
  deploy/check_manifests.py --self_test [...]

1. Schema. Every YAML document (duplicate keys are refused) is mapped from apiVersion/kind to the
   model class python3-kubernetes generated from Kubernetes' OpenAPI schema (v1 Service ->
   kubernetes.client.V1Service, batch/v1 Job -> V1Job, ...) and walked with each model's
   `openapi_types` and `attribute_map`: every key must be a field of the model, every value of
   the field's type (int, str, bool, list, map, nested model; `object` fields are int-or-string,
   resource quantities string or number), and every required field present: each object is
   constructed through its model class with client-side validation on, whose setters refuse a
   missing required field. A PyTorchJob (a CRD: no model) is checked against the small schema
   below, and each replica's pod template against V1PodTemplateSpec with the same walker.
   The models are Kubernetes 1.22's: a field added later is reported unknown.
2. Operations: what a drpc job needs to work (see check_pod, check_job, check_pytorchjob):
   one attempt per rank (backoffLimit 0, restartPolicy Never), Indexed completions = parallelism
   = DRPC_WORLD_SIZE, the image tagged with VERSION (never latest) and IfNotPresent, requests and
   a memory limit, the readiness probe on /healthz of a declared metrics port that Prometheus'
   annotations name too, the Secret mounted read-only as files the DRPC_TOKEN_FILE/TLS variables
   point into (never env vars), a headless Service publishing unready pods whose name is the
   pods' subdomain and whose selector matches them, DRPC_MASTER_ADDR = <job>-0.<service>, a
   non-root read-only container with a writable /tmp.

Prints one line per document and one per problem; exits 1 on any problem. --self_test mutates
in-memory copies of the manifests (an unknown key, a wrong type, a missing required field, a
wrong operational value, ...) and fails unless each mutation is reported and the unmutated
manifests pass.
"""

import argparse
import copy
import glob
import os
import re
import sys

import yaml
import kubernetes.client as k8s

CONFIG = k8s.Configuration()
CONFIG.client_side_validation = True  # the models' setters refuse missing required fields

# ---------------------------------------------------------------------------------------------
# YAML: like yaml.safe_load_all, but a key given twice in a map is an error (PyYAML keeps the
# last silently, as kubectl's parser would: the first value is lost without a word).


class DuplicateKeyError(yaml.YAMLError):
    pass


class StrictLoader(yaml.SafeLoader):
    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            if key in seen:
                raise DuplicateKeyError("line %d: duplicate key %r" % (key_node.start_mark.line + 1, key))
            seen.add(key)
        return super().construct_mapping(node, deep)


def load_documents(text):
    return [d for d in yaml.load_all(text, Loader=StrictLoader) if d is not None]


# ---------------------------------------------------------------------------------------------
# The schema walker over python3-kubernetes' models.

# Groups whose kinds map to kubernetes.client.<Version><Kind> without ambiguity.
PLAIN_GROUPS = {"", "apps", "batch", "policy", "autoscaling", "networking.k8s.io",
                "rbac.authorization.k8s.io", "scheduling.k8s.io", "storage.k8s.io"}

# Fields typed `str` (or map of str) in the models that are resource.Quantity, which
# Kubernetes also accepts as a number (cpu: 1).
QUANTITIES = {("V1ResourceRequirements", "limits"), ("V1ResourceRequirements", "requests"),
              ("V1EmptyDirVolumeSource", "size_limit"), ("V1PodSpec", "overhead")}
# Fields typed `object` that hold arbitrary JSON; every other `object` is an int-or-string.
RAW_OBJECTS = {("V1ControllerRevision", "data"), ("V1ManagedFieldsEntry", "fields_v1"),
               ("V1WatchEvent", "object")}

PRIMITIVES = {"str": (str,), "int": (int,), "float": (int, float), "bool": (bool,)}


def model_class(api_version, kind):
    if not isinstance(api_version, str) or not isinstance(kind, str):
        return None
    group, _, version = api_version.rpartition("/")
    if group not in PLAIN_GROUPS or not re.fullmatch(r"v[0-9]+((alpha|beta)[0-9]+)?", version):
        return None
    return getattr(k8s, version[0].upper() + version[1:] + kind, None)


def join(path, key):
    return "%s.%s" % (path, key) if path else key


def describe(value):
    return "%s %r" % (type(value).__name__, value) if not isinstance(value, (dict, list)) else type(value).__name__


class Walker:
    """Collects (path, message) problems of documents checked against the models."""

    def __init__(self):
        self.problems = []

    def report(self, path, message):
        self.problems.append((path, message))

    def value(self, value, typ, path, field=None):
        if value is None:
            self.report(path, "null value (give a value or remove the key)")
            return
        if typ.startswith("list["):
            if not isinstance(value, list):
                self.report(path, "expected a list, got %s" % describe(value))
                return
            for i, item in enumerate(value):
                self.value(item, typ[5:-1], "%s[%d]" % (path, i), field)
            return
        if typ.startswith("dict("):
            if not isinstance(value, dict):
                self.report(path, "expected a map, got %s" % describe(value))
                return
            sub = re.match(r"dict\(([^,]*), (.*)\)$", typ).group(2)
            for k, item in value.items():
                if not isinstance(k, str):
                    self.report(path, "map key %r is not a string" % (k,))
                self.value(item, sub, "%s[%r]" % (path, k), field)
            return
        if typ == "str" and field in QUANTITIES:
            if isinstance(value, bool) or not isinstance(value, (str, int, float)):
                self.report(path, "expected a quantity (string or number), got %s" % describe(value))
            elif parse_quantity(value) is None:
                self.report(path, "%r is not a quantity" % (value,))
            return
        if typ in PRIMITIVES:
            if isinstance(value, bool) and typ != "bool" or not isinstance(value, PRIMITIVES[typ]):
                self.report(path, "expected %s, got %s" % (typ, describe(value)))
            return
        if typ == "object":
            if field not in RAW_OBJECTS and (isinstance(value, bool) or not isinstance(value, (int, str))):
                self.report(path, "expected an int or a string, got %s" % describe(value))
            return
        if typ in ("datetime", "date"):
            if not isinstance(value, str) and not hasattr(value, "year"):
                self.report(path, "expected a timestamp, got %s" % describe(value))
            return
        cls = getattr(k8s, typ, None)
        if cls is None:
            self.report(path, "the schema's type %s is unknown to python3-kubernetes" % typ)
            return
        self.model(value, cls, path)

    def model(self, data, cls, path):
        if not isinstance(data, dict):
            self.report(path, "expected an object (%s), got %s" % (cls.__name__, describe(data)))
            return
        attr_of = {key: attr for attr, key in cls.attribute_map.items()}
        kwargs = {}
        for key, value in data.items():
            attr = attr_of.get(key)
            if attr is None:
                self.report(join(path, key), "unknown field")
                continue
            self.value(value, cls.openapi_types[attr], join(path, key), (cls.__name__, attr))
            if value is not None:
                kwargs[attr] = value
        # Required fields: the model's constructor raises on the first one missing; fill it in and
        # retry to find them all. (Setters check presence and a few patterns, not types: those
        # were checked above.)
        while True:
            try:
                cls(local_vars_configuration=CONFIG, **kwargs)
                return
            except ValueError as e:
                m = re.match(r"Invalid value for `(\w+)`, must not be `None`", str(e))
                if not m or m.group(1) in kwargs:
                    self.report(path, str(e))
                    return
                self.report(join(path, cls.attribute_map[m.group(1)]), "required field missing")
                kwargs[m.group(1)] = "<missing>"


# ---------------------------------------------------------------------------------------------
# The PyTorchJob CRD (kubeflow.org/v1), as far as this job uses it. Types: a Python type, a
# nested schema (dict), ("map", schema) for a map of schemas, or a model class name.

PYTORCH_REPLICA = {"replicas": int, "restartPolicy": str, "template": "V1PodTemplateSpec"}
PYTORCH_SCHEMA = {
    "apiVersion": str, "kind": str, "metadata": "V1ObjectMeta",
    "spec": {
        "pytorchReplicaSpecs": ("map", PYTORCH_REPLICA),
        "runPolicy": {"cleanPodPolicy": str, "ttlSecondsAfterFinished": int, "activeDeadlineSeconds": int,
                      "backoffLimit": int, "schedulingPolicy": dict, "suspend": bool},
        "elasticPolicy": {"minReplicas": int, "maxReplicas": int, "rdzvBackend": str, "rdzvPort": int,
                          "rdzvHost": str, "rdzvId": str, "rdzvConf": list, "standalone": bool,
                          "nProcPerNode": int, "maxRestarts": int, "metrics": list},
    },
}
PYTORCH_REQUIRED = {"": ["spec"], "spec": ["pytorchReplicaSpecs"], "replica": ["template"]}
PYTORCH_REPLICA_TYPES = {"Master", "Worker"}
PYTORCH_RESTART_POLICIES = {"Always", "OnFailure", "Never", "ExitCode"}
PYTORCH_CLEAN_POD_POLICIES = {"None", "Running", "All"}


def walk_crd(walker, data, schema, path):
    if not isinstance(data, dict):
        walker.report(path or "(document)", "expected an object, got %s" % describe(data))
        return
    for key, value in data.items():
        if key not in schema:
            walker.report(join(path, key), "unknown field")
            continue
        typ, p = schema[key], join(path, key)
        if isinstance(typ, str):
            walker.value(value, typ, p)
        elif isinstance(typ, dict):
            walk_crd(walker, value, typ, p)
        elif isinstance(typ, tuple):
            if not isinstance(value, dict):
                walker.report(p, "expected a map, got %s" % describe(value))
                continue
            for name, item in value.items():
                if name not in PYTORCH_REPLICA_TYPES:
                    walker.report(join(p, name), "unknown replica type (Master, Worker)")
                    continue
                walk_crd(walker, item, typ[1], join(p, name))
                for req in PYTORCH_REQUIRED["replica"]:
                    if isinstance(item, dict) and req not in item:
                        walker.report(join(join(p, name), req), "required field missing")
        elif isinstance(value, bool) and typ is not bool or not isinstance(value, typ):
            walker.report(p, "expected %s, got %s" % (typ.__name__, describe(value)))
    for req in PYTORCH_REQUIRED.get(path, []):
        if req not in data:
            walker.report(join(path, req), "required field missing")


# ---------------------------------------------------------------------------------------------
# Operational rules.

SUFFIXES = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
            "n": 1e-9, "u": 1e-6, "m": 1e-3, "": 1, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12,
            "P": 1e15, "E": 1e18}


def parse_quantity(q):
    if isinstance(q, bool):
        return None
    if isinstance(q, (int, float)):
        return float(q)
    m = re.fullmatch(r"\+?([0-9]+(?:\.[0-9]*)?|\.[0-9]+)([a-zA-Z]*)", q) if isinstance(q, str) else None
    if not m or m.group(2) not in SUFFIXES:
        return None
    return float(m.group(1)) * SUFFIXES[m.group(2)]


def get(data, *keys):
    """data[k0][k1]... or None when a level is missing or not a map/list."""
    for k in keys:
        if isinstance(data, dict):
            data = data.get(k)
        elif isinstance(data, list) and isinstance(k, int) and -len(data) <= k < len(data):
            data = data[k]
        else:
            return None
    return data


SECRET_ENV = ["DRPC_TOKEN_FILE", "DRPC_TLS_CERT", "DRPC_TLS_KEY", "DRPC_TLS_CA"]
IMAGE_COMMAND = "/usr/local/bin/fashion_mnist"
PYTORCH_SET = ["RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"]  # the operator's
IMAGE_MASTER_PORT = 29500  # deploy/Dockerfile: ENV DRPC_MASTER_PORT=29500


def env_of(container, report, p):
    """name -> entry of a container's env; reports duplicates (Kubernetes keeps the last)."""
    env = {}
    for i, e in enumerate(get(container, "env") or []):
        name = get(e, "name")
        if name in env:
            report("%s.env[%d]" % (p, i), "%s is set twice" % name)
        env[name] = e
    return env


def env_value(env, name):
    v = get(env, name, "value")
    return v if isinstance(v, str) else None


def check_pod(tmpl, p, report, version, container_name=None, probe=True):
    """The rules for a drpc pod template at path p; returns (container, env, ports) for more."""
    spec = get(tmpl, "spec") or {}
    sp = join(p, "spec")
    containers = get(spec, "containers") or []
    if len(containers) != 1:
        report(join(sp, "containers"), "expected exactly one container (the drpc worker), got %d" % len(containers))
        if not containers:
            return None, {}, {}
    c, cp = containers[0], join(sp, "containers") + "[0]"
    if container_name is not None and get(c, "name") != container_name:
        report(join(cp, "name"), "must be %r (the operator looks for that name), got %r" % (container_name, get(c, "name")))

    command = get(c, "command")
    if not isinstance(command, list) or not command or command[0] != IMAGE_COMMAND:
        report(join(cp, "command"), "must run the main job %s, got %r" % (IMAGE_COMMAND, command))

    image = get(c, "image")
    if isinstance(image, str):
        name, _, digest = image.partition("@")
        tag = name.rpartition("/")[2].partition(":")[2]
        if tag == "latest":
            report(join(cp, "image"), "%r: never :latest (which build runs is then unknown)" % image)
        elif not tag:
            report(join(cp, "image"), "%r has no tag (which means :latest); tag it %s" % (image, version))
        elif tag != version:
            report(join(cp, "image"), "%r: the tag must be the repository's VERSION %s" % (image, version))
    if get(c, "imagePullPolicy") != "IfNotPresent":
        report(join(cp, "imagePullPolicy"), "must be IfNotPresent (a pinned tag need not be pulled again), got %r"
               % get(c, "imagePullPolicy"))

    res, rp = get(c, "resources") or {}, join(cp, "resources")
    for kind, key in [("requests", "cpu"), ("requests", "memory"), ("limits", "memory")]:
        if get(res, kind, key) is None:
            report(join(join(rp, kind), key), "must be set (the scheduler places by requests; the limit bounds a leak)")
    for key in ("cpu", "memory"):
        req, lim = parse_quantity(get(res, "requests", key)), parse_quantity(get(res, "limits", key))
        if req is not None and lim is not None and lim < req:
            report(join(join(rp, "limits"), key), "is below the request")

    ports = {}
    for i, port in enumerate(get(c, "ports") or []):
        if get(port, "name") in ports:
            report("%s.ports[%d].name" % (cp, i), "port name %r declared twice" % get(port, "name"))
        if get(port, "name") is not None:
            ports[get(port, "name")] = get(port, "containerPort")
    metrics = ports.get("metrics")
    if metrics is None:
        report(join(cp, "ports"), "declares no port named metrics (/metrics and /healthz)")

    env = env_of(c, report, cp)
    ep = join(cp, "env")

    def want(name, value, why):
        if env_value(env, name) != value:
            report(ep, "%s must be %r (%s), got %r" % (name, value, why, env_value(env, name)))

    want("DRPC_LISTEN", "0.0.0.0", "peers dial the pod IP")
    want("DRPC_METRICS_HOST", "0.0.0.0", "the kubelet's probe and Prometheus dial the pod IP")
    if metrics is not None:
        want("DRPC_METRICS_PORT", str(metrics), "the declared metrics port")
    if get(env, "DRPC_ADVERTISE", "valueFrom", "fieldRef", "fieldPath") != "status.podIP":
        report(ep, "DRPC_ADVERTISE must come from fieldRef status.podIP (what the other workers dial)")
    if not env_value(env, "DRPC_TLS_SERVER_NAME"):
        report(ep, "DRPC_TLS_SERVER_NAME must be set (the certificates name drpc-job, not pod IPs)")
    if "DRPC_TOKEN" in env:
        report(ep, "DRPC_TOKEN: the token must come from a mounted file (DRPC_TOKEN_FILE), never an env var")
    for i, e in enumerate(get(c, "env") or []):
        if get(e, "valueFrom", "secretKeyRef") is not None:
            report("%s[%d]" % (ep, i), "a secret in an env var (%s): mount the Secret as files" % get(e, "name"))
    for i, e in enumerate(get(c, "envFrom") or []):
        if get(e, "secretRef") is not None:
            report("%s.envFrom[%d]" % (cp, i), "a secret in env vars: mount the Secret as files")

    # The readiness probe and Prometheus' annotations: both on the declared metrics port.
    rprobe, pp = get(c, "readinessProbe"), join(cp, "readinessProbe")
    if not probe:
        if rprobe is not None:
            report(pp, "must not be set here: the master is unready until every rank has joined, and the "
                   "operator's Service does not publish unready pods, so the workers could never resolve it")
    elif rprobe is None:
        report(pp, "missing: /healthz on the metrics port (ready once joined, unready after a peer failed)")
    else:
        if get(rprobe, "httpGet", "path") != "/healthz":
            report(join(pp, "httpGet.path"), "must be /healthz, got %r" % get(rprobe, "httpGet", "path"))
        port = get(rprobe, "httpGet", "port")
        if isinstance(port, str) and port not in ports:
            report(join(pp, "httpGet.port"), "%r is not a port the container declares" % port)
        elif isinstance(port, int) and port not in ports.values():
            report(join(pp, "httpGet.port"), "%r is not a port the container declares" % port)
        elif ports.get(port, port) != metrics:
            report(join(pp, "httpGet.port"), "%r is not the metrics port %r" % (port, metrics))
    ann, ap = get(tmpl, "metadata", "annotations") or {}, join(p, "metadata.annotations")
    for key, value in [("prometheus.io/scrape", "true"), ("prometheus.io/port", str(metrics)),
                       ("prometheus.io/path", "/metrics")]:
        if ann.get(key) != value:
            report("%s[%r]" % (ap, key), "must be %r (the declared metrics port), got %r" % (value, ann.get(key)))

    # The Secret: mounted read-only, and the token and TLS files are in it.
    volumes = {get(v, "name"): v for v in get(spec, "volumes") or []}
    mounts = get(c, "volumeMounts") or []
    secret_dirs = []
    for i, m in enumerate(mounts):
        mp = "%s.volumeMounts[%d]" % (cp, i)
        v = volumes.get(get(m, "name"))
        if v is None:
            report(join(mp, "name"), "no volume named %r" % get(m, "name"))
            continue
        if get(v, "secret") is not None:
            if get(m, "readOnly") is not True:
                report(join(mp, "readOnly"), "the Secret must be mounted readOnly: true")
            if get(v, "secret", "optional") is True:
                report(join(sp, "volumes"), "the Secret must not be optional (a worker would start without it)")
            items = get(v, "secret", "items")
            secret_dirs.append((str(get(m, "mountPath")).rstrip("/"),
                                None if items is None else {get(it, "path") for it in items}))
    if not secret_dirs:
        report(join(cp, "volumeMounts"), "no Secret volume mounted (the job token and TLS files)")
    for name in SECRET_ENV:
        path = env_value(env, name)
        d, _, f = (path or "").rpartition("/")
        if not any(d == sd and (files is None or f in files) for sd, files in secret_dirs):
            report(ep, "%s=%r is not a file of the mounted Secret" % (name, path))

    # Least privilege: non-root, no escalation, a read-only root with a writable /tmp (glog).
    psc, csc = get(spec, "securityContext") or {}, get(c, "securityContext") or {}
    non_root = csc.get("runAsNonRoot", psc.get("runAsNonRoot"))
    user = csc.get("runAsUser", psc.get("runAsUser"))
    if non_root is not True:
        report(join(sp, "securityContext.runAsNonRoot"), "must be true")
    if not isinstance(user, int) or isinstance(user, bool) or user <= 0:
        report(join(sp, "securityContext.runAsUser"), "must be a numeric non-root user (the image names none), got %r"
               % (user,))
    if csc.get("allowPrivilegeEscalation") is not False:
        report(join(cp, "securityContext.allowPrivilegeEscalation"), "must be false")
    if csc.get("readOnlyRootFilesystem") is not True:
        report(join(cp, "securityContext.readOnlyRootFilesystem"), "must be true")
    elif not any(get(m, "mountPath") == "/tmp" and get(volumes.get(get(m, "name")), "emptyDir") is not None
                 for m in mounts):
        report(join(cp, "volumeMounts"), "a read-only root needs an emptyDir at /tmp (glog writes its logs there)")
    if get(spec, "terminationGracePeriodSeconds") is None:
        report(join(sp, "terminationGracePeriodSeconds"), "must be set (a worker leaves at once on SIGTERM)")
    return c, env, ports


def selects(selector, labels):
    return isinstance(selector, dict) and bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def check_job(job, services, report, version):
    spec, name = get(job, "spec") or {}, get(job, "metadata", "name")
    tmpl = get(spec, "template") or {}
    c, env, ports = check_pod(tmpl, "spec.template", report, version)
    if get(spec, "completionMode") != "Indexed":
        report("spec.completionMode", "must be Indexed (each pod's index is its rank)")
    if get(spec, "backoffLimit") != 0:
        report("spec.backoffLimit", "must be 0 (a failed rank cannot rejoin; default 6), got %r" % get(spec, "backoffLimit"))
    if get(spec, "activeDeadlineSeconds") is None and get(spec, "ttlSecondsAfterFinished") is None:
        report("spec", "set activeDeadlineSeconds or ttlSecondsAfterFinished")
    if get(tmpl, "spec", "restartPolicy") != "Never":
        report("spec.template.spec.restartPolicy", "must be Never (a restarted rank cannot rejoin)")
    world = env_value(env, "DRPC_WORLD_SIZE")
    completions, parallelism = get(spec, "completions"), get(spec, "parallelism")
    if not (completions == parallelism and world == str(completions)):
        report("spec", "completions == parallelism == DRPC_WORLD_SIZE needed (all ranks at once), got %r, %r, %r"
               % (completions, parallelism, world))
    if "DRPC_RANK" in env or "RANK" in env:
        report("spec.template.spec.containers[0].env", "no DRPC_RANK/RANK: the rank is the pod's completion index")

    subdomain = get(tmpl, "spec", "subdomain")
    service = services.get(subdomain)
    if service is None:
        report("spec.template.spec.subdomain", "must name a headless Service of these manifests, got %r" % subdomain)
    else:
        labels = dict(get(tmpl, "metadata", "labels") or {})
        labels.update({"job-name": name, "batch.kubernetes.io/job-name": name})  # set by the Job controller
        if not selects(get(service, "spec", "selector"), labels):
            report("spec.template.spec.subdomain", "Service %s's selector %r does not match the Job's pods"
                   % (subdomain, get(service, "spec", "selector")))
    master = "%s-0.%s" % (name, subdomain)
    if env_value(env, "DRPC_MASTER_ADDR") != master:
        report("spec.template.spec.containers[0].env", "DRPC_MASTER_ADDR must be %r (rank 0's name), got %r"
               % (master, env_value(env, "DRPC_MASTER_ADDR")))
    mport = env_value(env, "DRPC_MASTER_PORT")
    if mport is None or not mport.isdigit() or int(mport) not in ports.values():
        report("spec.template.spec.containers[0].env", "DRPC_MASTER_PORT=%r is not a port the container declares" % mport)
    elif service is not None:
        targets = [ports.get(get(sp, "targetPort"), get(sp, "targetPort") or get(sp, "port"))
                   for sp in get(service, "spec", "ports") or []]
        if int(mport) not in targets:
            report("spec.template.spec.subdomain", "Service %s does not forward the store port %s" % (subdomain, mport))


def check_service(service, pods, report):
    spec = get(service, "spec") or {}
    if get(spec, "clusterIP") != "None":
        report("spec.clusterIP", "must be None (headless: each pod gets a name)")
    if get(spec, "publishNotReadyAddresses") is not True:
        report("spec.publishNotReadyAddresses", "must be true: rank 0 is unready until every rank joined through its name")
    if not any(selects(get(spec, "selector"), labels) for labels in pods):
        report("spec.selector", "%r selects no pod of these manifests" % get(spec, "selector"))


def check_pytorchjob(job, report, version):
    spec = get(job, "spec") or {}
    replicas = get(spec, "pytorchReplicaSpecs") or {}
    run = get(spec, "runPolicy") or {}
    if get(run, "backoffLimit") != 0:
        report("spec.runPolicy.backoffLimit", "must be 0 (a failed rank cannot rejoin), got %r" % get(run, "backoffLimit"))
    if get(run, "cleanPodPolicy") not in ("Running", "All"):
        report("spec.runPolicy.cleanPodPolicy", "must be Running or All (stop the ranks left when the job ends), got %r"
               % get(run, "cleanPodPolicy"))
    if get(run, "activeDeadlineSeconds") is None and get(run, "ttlSecondsAfterFinished") is None:
        report("spec.runPolicy", "set activeDeadlineSeconds or ttlSecondsAfterFinished")
    if get(replicas, "Master", "replicas") != 1:
        report("spec.pytorchReplicaSpecs.Master.replicas", "must be 1 (rank 0)")
    workers = get(replicas, "Worker", "replicas")
    if not isinstance(workers, int) or workers < 1:
        report("spec.pytorchReplicaSpecs.Worker.replicas", "must be at least 1")
    envs = {}
    for rtype in sorted(replicas):
        rp = "spec.pytorchReplicaSpecs." + rtype
        r = replicas[rtype]
        if get(r, "restartPolicy") != "Never":
            report(join(rp, "restartPolicy"), "must be Never (a restarted rank cannot rejoin), got %r" % get(r, "restartPolicy"))
        tmpl = get(r, "template") or {}
        if get(tmpl, "spec", "restartPolicy") not in (None, "Never"):
            report(join(rp, "template.spec.restartPolicy"), "must be Never or unset")
        c, env, ports = check_pod(tmpl, join(rp, "template"), report, version, container_name="pytorch",
                                  probe=rtype != "Master")
        cp = join(rp, "template.spec.containers[0]")
        for name in PYTORCH_SET:
            for var in (name, "DRPC_" + name):
                if var in env:
                    report(join(cp, "env"), "%s: the operator sets %s; drop it" % (var, name))
        if rtype == "Master" and ports.get("pytorchjob-port") != IMAGE_MASTER_PORT:
            report(join(cp, "ports"), "a port named pytorchjob-port must be %d (MASTER_PORT; the image's "
                   "DRPC_MASTER_PORT), got %r" % (IMAGE_MASTER_PORT, ports.get("pytorchjob-port")))
        envs[rtype] = get(c, "env")
    if len(envs) == 2 and envs["Master"] != envs["Worker"]:
        report("spec.pytorchReplicaSpecs.Worker.template.spec.containers[0].env", "differs from the Master's")


# ---------------------------------------------------------------------------------------------


def check(files, version):
    """files: {file name: YAML text}. Returns (lines, problems): a line per document, one per problem."""
    lines, problems = [], []
    loaded = []
    for fname, text in sorted(files.items()):
        try:
            docs = load_documents(text)
        except yaml.YAMLError as e:
            problems.append("%s: %s" % (fname, str(e).replace("\n", " ")))
            continue
        if not docs:
            problems.append("%s: no documents" % fname)
        loaded += [(fname, d) for d in docs]
    services = {get(d, "metadata", "name"): d for _, d in loaded if get(d, "kind") == "Service"}
    pods = []  # the labels of every pod template, as its controller completes them
    for _, d in loaded:
        if get(d, "kind") == "Job":
            labels = dict(get(d, "spec", "template", "metadata", "labels") or {})
            labels.update({"job-name": get(d, "metadata", "name"), "batch.kubernetes.io/job-name": get(d, "metadata", "name")})
            pods.append(labels)
    for fname, d in loaded:
        title = "%s: %s %s" % (fname, get(d, "kind"), get(d, "metadata", "name"))
        found = []

        def report(path, message):
            found.append("%s: %s: %s" % (title, path or "(document)", message))

        walker = Walker()
        api_version, kind = get(d, "apiVersion"), get(d, "kind")
        cls = model_class(api_version, kind)
        if not isinstance(d, dict):
            report("", "not a map")
        elif (api_version, kind) == ("kubeflow.org/v1", "PyTorchJob"):
            walk_crd(walker, d, PYTORCH_SCHEMA, "")
        elif cls is not None:
            walker.model(d, cls, "")
        else:
            report("", "unknown apiVersion/kind %s/%s" % (api_version, kind))
        for path, message in walker.problems:
            report(path, message)
        try:
            if not isinstance(d, dict):
                pass
            elif kind == "Job":
                check_job(d, services, report, version)
            elif kind == "Service":
                check_service(d, pods, report)
            elif kind == "PyTorchJob":
                check_pytorchjob(d, report, version)
            else:
                report("", "no operational rules for %s: is it part of the drpc job?" % kind)
        except (AttributeError, TypeError, KeyError, ValueError):
            if not walker.problems:
                raise  # a well-formed document: a bug here
            report("", "operational checks stopped at the malformed input above")
        lines.append("%s: %s" % (title, "%d problem(s)" % len(found) if found else "ok"))
        problems += found
    return lines, problems


def read_inputs(paths):
    files = {}
    for path in paths:
        names = sorted(glob.glob(os.path.join(path, "*.yaml"))) if os.path.isdir(path) else [path]
        for name in names:
            with open(name) as f:
                files[os.path.basename(name)] = f.read()
    return files


# ---------------------------------------------------------------------------------------------
# Self-test: each mutation of the real manifests must be reported (by a problem containing the
# expected text); the manifests themselves must pass.


def doc(docs, kind):
    return next(d for d in docs if d.get("kind") == kind)


def container(d):
    if d["kind"] == "PyTorchJob":
        return d["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    return d["spec"]["template"]["spec"]["containers"][0]


def env_entry(d, name):
    return next(e for e in container(d)["env"] if e["name"] == name)


def mutations():
    J, P = "drpc-job.yaml", "pytorchjob.yaml"
    job, svc, pt = (lambda ds: doc(ds, "Job")), (lambda ds: doc(ds, "Service")), (lambda ds: doc(ds, "PyTorchJob"))
    master = lambda ds: pt(ds)["spec"]["pytorchReplicaSpecs"]["Master"]  # noqa: E731
    return [
        ("an unknown key deep inside", J, lambda ds: container(job(ds)).update(imagePullPolicyy="Always"),
         "Job drpc: spec.template.spec.containers[0].imagePullPolicyy: unknown field"),
        ("a string for an int", J, lambda ds: job(ds)["spec"].update(completions="3"),
         "spec.completions: expected int, got str '3'"),
        ("an int for a string (unquoted env value)", J, lambda ds: env_entry(job(ds), "DRPC_EPOCHS").update(value=2),
         "].value: expected str, got int 2"),
        ("a string for a bool", J, lambda ds: container(job(ds))["volumeMounts"][0].update(readOnly="true"),
         "volumeMounts[0].readOnly: expected bool, got str 'true'"),
        ("a list for an object", J, lambda ds: svc(ds)["spec"].update(selector=["job-name"]),
         "Service drpc: spec.selector: expected a map"),
        ("a bool for an int-or-string", J,
         lambda ds: container(job(ds))["readinessProbe"]["httpGet"].update(port=True),
         "readinessProbe.httpGet.port: expected an int or a string, got bool True"),
        ("a container without a name", J, lambda ds: container(job(ds)).pop("name"),
         "spec.template.spec.containers[0].name: required field missing"),
        ("a Job without a template", J, lambda ds: job(ds)["spec"].pop("template"),
         "Job drpc: spec.template: required field missing"),
        ("an env var without a name", J, lambda ds: env_entry(job(ds), "DRPC_EPOCHS").pop("name"),
         "].name: required field missing"),
        ("a duplicate key", J, "  backoffLimit: 0 ", "duplicate key 'backoffLimit'"),
        ("backoffLimit 6", J, lambda ds: job(ds)["spec"].update(backoffLimit=6), "spec.backoffLimit: must be 0"),
        ("no backoffLimit (the default is 6)", J, lambda ds: job(ds)["spec"].pop("backoffLimit"),
         "spec.backoffLimit: must be 0"),
        ("image :latest", J, lambda ds: container(job(ds)).update(image="drpc-worker:latest"), "never :latest"),
        ("an untagged image", J, lambda ds: container(job(ds)).update(image="drpc-worker"), "has no tag"),
        ("another version's tag", J, lambda ds: container(job(ds)).update(image="drpc-worker:0.0.9"),
         "the tag must be the repository's VERSION"),
        ("imagePullPolicy Always", J, lambda ds: container(job(ds)).update(imagePullPolicy="Always"),
         "imagePullPolicy: must be IfNotPresent"),
        ("no memory limit", J, lambda ds: container(job(ds))["resources"].pop("limits"),
         "resources.limits.memory: must be set"),
        ("a probe on an undeclared port", J,
         lambda ds: container(job(ds))["readinessProbe"]["httpGet"].update(port="http"),
         "readinessProbe.httpGet.port: 'http' is not a port the container declares"),
        ("a probe on the store port", J,
         lambda ds: container(job(ds))["readinessProbe"]["httpGet"].update(port="store"),
         "'store' is not the metrics port"),
        ("a probe on another path", J,
         lambda ds: container(job(ds))["readinessProbe"]["httpGet"].update(path="/metrics"),
         "httpGet.path: must be /healthz"),
        ("no readiness probe", J, lambda ds: container(job(ds)).pop("readinessProbe"), "readinessProbe: missing"),
        ("Prometheus told another port", J,
         lambda ds: job(ds)["spec"]["template"]["metadata"]["annotations"].update({"prometheus.io/port": "9091"}),
         "metadata.annotations['prometheus.io/port']: must be '9090'"),
        ("metrics on loopback", J, lambda ds: env_entry(job(ds), "DRPC_METRICS_HOST").update(value="127.0.0.1"),
         "DRPC_METRICS_HOST must be '0.0.0.0'"),
        ("a writable Secret mount", J, lambda ds: container(job(ds))["volumeMounts"][0].update(readOnly=False),
         "the Secret must be mounted readOnly"),
        ("the token in an env var", J,
         lambda ds: container(job(ds))["env"].append(
             {"name": "DRPC_TOKEN", "valueFrom": {"secretKeyRef": {"name": "drpc-job", "key": "token"}}}),
         "never an env var"),
        ("a TLS file outside the Secret", J, lambda ds: env_entry(job(ds), "DRPC_TLS_KEY").update(value="/tmp/worker.key"),
         "DRPC_TLS_KEY='/tmp/worker.key' is not a file of the mounted Secret"),
        ("restartPolicy OnFailure", J, lambda ds: job(ds)["spec"]["template"]["spec"].update(restartPolicy="OnFailure"),
         "restartPolicy: must be Never"),
        ("a NonIndexed Job", J, lambda ds: job(ds)["spec"].update(completionMode="NonIndexed"),
         "completionMode: must be Indexed"),
        ("parallelism below completions", J, lambda ds: job(ds)["spec"].update(parallelism=2),
         "completions == parallelism == DRPC_WORLD_SIZE"),
        ("a wrong master address", J, lambda ds: env_entry(job(ds), "DRPC_MASTER_ADDR").update(value="drpc-0"),
         "DRPC_MASTER_ADDR must be 'drpc-0.drpc'"),
        ("a subdomain naming no Service", J, lambda ds: job(ds)["spec"]["template"]["spec"].update(subdomain="workers"),
         "subdomain: must name a headless Service"),
        ("a selector missing the pods", J, lambda ds: svc(ds)["spec"].update(selector={"job-name": "other"}),
         "selects no pod"),
        ("unready pods unpublished", J, lambda ds: svc(ds)["spec"].pop("publishNotReadyAddresses"),
         "spec.publishNotReadyAddresses: must be true"),
        ("running as root", J, lambda ds: job(ds)["spec"]["template"]["spec"]["securityContext"].update(runAsUser=0),
         "runAsUser: must be a numeric non-root user"),
        ("a read-only root without /tmp", J, lambda ds: container(job(ds))["volumeMounts"].pop(1),
         "needs an emptyDir at /tmp"),
        ("a PyTorchJob with an unknown spec key", P, lambda ds: pt(ds)["spec"].update(pytorchReplicaSpec={}),
         "PyTorchJob drpc-pytorch: spec.pytorchReplicaSpec: unknown field"),
        ("a wrong type inside a replica's template", P,
         lambda ds: container(pt(ds))["ports"][0].update(containerPort="29500"),
         "spec.pytorchReplicaSpecs.Worker.template.spec.containers[0].ports[0].containerPort: expected int"),
        ("a replica without a template", P, lambda ds: master(ds).pop("template"),
         "spec.pytorchReplicaSpecs.Master.template: required field missing"),
        ("the container not named pytorch", P, lambda ds: container(pt(ds)).update(name="worker"),
         "name: must be 'pytorch'"),
        ("a PyTorchJob with backoffLimit 3", P, lambda ds: pt(ds)["spec"]["runPolicy"].update(backoffLimit=3),
         "spec.runPolicy.backoffLimit: must be 0"),
        ("a probe on the PyTorchJob's master", P,
         lambda ds: master(ds)["template"]["spec"]["containers"][0].update(
             readinessProbe=copy.deepcopy(container(pt(ds))["readinessProbe"])),
         "Master.template.spec.containers[0].readinessProbe: must not be set"),
        ("DRPC_RANK in a PyTorchJob", P,
         lambda ds: container(pt(ds))["env"].append({"name": "DRPC_RANK", "value": "1"}),
         "DRPC_RANK: the operator sets RANK"),
        ("the master port not the image's", P,
         lambda ds: master(ds)["template"]["spec"]["containers"][0]["ports"][0].update(containerPort=23456),
         "pytorchjob-port must be 29500"),
    ]


def self_test(files, version):
    lines, problems = check(files, version)
    failures = ["the unmutated manifests: " + p for p in problems]
    for description, fname, mutate, expected in mutations():
        mutated = dict(files)
        if isinstance(mutate, str):  # a text mutation: the line given, twice
            if mutate not in files[fname]:
                failures.append("%s: %r is not in %s" % (description, mutate, fname))
                continue
            mutated[fname] = files[fname].replace(mutate, mutate + "\n" + mutate, 1)
        else:
            docs = copy.deepcopy(load_documents(files[fname]))
            mutate(docs)
            mutated[fname] = yaml.safe_dump_all(docs, sort_keys=False)
        _, found = check(mutated, version)
        hits = [p for p in found if expected in p]
        if hits:
            print("self-test: %s: reported: %s" % (description, hits[0]))
        else:
            failures.append("%s: not reported (expected %r); got %s" % (description, expected, found or "nothing"))
    for f in failures:
        print("self-test FAILED: " + f)
    print("self-test: %d mutations, %d failure(s)" % (len(mutations()), len(failures)))
    return not failures


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="*", help="manifests or directories of *.yaml (default: this script's)")
    parser.add_argument("--version_file", default=os.path.join(os.path.dirname(here), "VERSION"))
    parser.add_argument("--self_test", action="store_true", help="prove the checks can fail")
    args = parser.parse_args()
    with open(args.version_file) as f:
        version = f.read().strip()
    if not re.fullmatch(r"[0-9]+\.[0-9]+\.[0-9]+", version):
        print("%s: %r is not a version MAJOR.MINOR.PATCH" % (args.version_file, version))
        return 1
    files = read_inputs(args.paths or [here])
    if not files:
        print("no manifests in %s" % (args.paths or [here]))
        return 1
    if args.self_test:
        return 0 if self_test(files, version) else 1
    lines, problems = check(files, version)
    for line in lines + problems:
        print(line)
    print("%d document(s), %d problem(s)" % (len(lines), len(problems)))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
