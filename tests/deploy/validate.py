#!/usr/bin/python3
"""Checks deploy/: the Kubernetes manifests hang together (the single broker
in deploy/kubernetes/, the cluster of brokers and its etcd in
deploy/kubernetes/cluster/), the systemd unit has its hardening, the
Dockerfile uses the shared build steps, and every example config (and each
ConfigMap's) is accepted by sandbox-brokerd.

usage: validate.py BROKERD_BINARY
"""
import configparser
import glob
import json
import os
import re
import subprocess
import sys
import tempfile

import yaml

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
passed = failed = 0


def check(name, ok, detail=""):
    global passed, failed
    if ok:
        passed += 1
        print(f"ok   {name}")
    else:
        failed += 1
        print(f"FAIL {name} {detail}")


def load(name):
    with open(os.path.join(ROOT, "deploy", "kubernetes", name)) as f:
        return yaml.safe_load(f)


def load_dir(sub):
    """Every document of every .yaml file in deploy/kubernetes/<sub>."""
    docs = []
    for path in sorted(glob.glob(os.path.join(ROOT, "deploy", "kubernetes", sub, "*.yaml"))):
        with open(path) as f:
            docs += [d for d in yaml.safe_load_all(f) if d]
    return docs


def selects(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def config_ok(brokerd, text, label):
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        f.write(text)
        path = f.name
    try:
        r = subprocess.run([brokerd, "--config", path, "--check-config"],
                           capture_output=True, text=True, timeout=30)
        check(f"config loads: {label}", r.returncode == 0 and r.stdout.strip() == "config ok",
              r.stderr.strip())
    finally:
        os.unlink(path)


def main():
    brokerd = sys.argv[1]
    dep = load("deployment.yaml")
    svc = load("service.yaml")
    pdb = load("pdb.yaml")
    cm = load("configmap.yaml")
    secret = load("secret.example.yaml")
    check("kinds", [d["kind"] for d in (dep, svc, pdb, cm, secret)] ==
          ["Deployment", "Service", "PodDisruptionBudget", "ConfigMap", "Secret"])

    labels = dep["spec"]["template"]["metadata"]["labels"]
    check("deployment selector matches its pods",
          all(labels.get(k) == v for k, v in dep["spec"]["selector"]["matchLabels"].items()))
    check("service selects the pods", all(labels.get(k) == v for k, v in svc["spec"]["selector"].items()))
    check("pdb selects the pods",
          all(labels.get(k) == v for k, v in pdb["spec"]["selector"]["matchLabels"].items()))
    check("pdb keeps one available", pdb["spec"].get("minAvailable") == 1)

    pod = dep["spec"]["template"]["spec"]
    c = pod["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    check("grpc and metrics ports", ports == {"grpc": 50051, "metrics": 9090})
    for probe in ("readinessProbe", "livenessProbe"):
        check(f"{probe} is a gRPC health probe on the grpc port",
              c[probe].get("grpc", {}).get("port") == 50051)
    check("service ports target the named ports",
          sorted(p["targetPort"] for p in svc["spec"]["ports"]) == ["grpc", "metrics"])
    res = c.get("resources", {})
    check("resource requests and limits", {"cpu", "memory"} <= set(res.get("requests", {})) and
          {"cpu", "memory"} <= set(res.get("limits", {})))
    sc = c["securityContext"]
    check("no privilege escalation, no capabilities",
          sc.get("allowPrivilegeEscalation") is False and sc["capabilities"]["drop"] == ["ALL"] and
          "add" not in sc["capabilities"])
    check("non-root pod", pod["securityContext"].get("runAsNonRoot") is True)
    check("seccomp relaxed only as documented (user namespaces for bubblewrap)",
          sc["seccompProfile"]["type"] == "Unconfined")
    check("/proc unmasked for bubblewrap's proc mount, in a pod user namespace",
          sc.get("procMount") == "Unmasked" and pod.get("hostUsers") is False)
    check("drain fits in the termination grace period",
          pod["terminationGracePeriodSeconds"] >
          json.loads(cm["data"]["config.json"]).get("drain_grace_seconds", 30))

    secret_keys = set(secret["stringData"])
    refs = [e["valueFrom"]["secretKeyRef"] for e in c.get("env", []) if "valueFrom" in e]
    check("env references existing Secret keys",
          refs and all(r["name"] == secret["metadata"]["name"] and r["key"] in secret_keys
                       for r in refs))
    vols = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    check("every mount has a volume", set(mounts) <= set(vols))
    check("config comes from the ConfigMap",
          vols["config"]["configMap"]["name"] == cm["metadata"]["name"] and
          os.path.dirname(c["args"][c["args"].index("--config") + 1]) ==
          mounts["config"]["mountPath"] and "subPath" not in mounts["config"])
    cfg = json.loads(cm["data"]["config.json"])
    tokens_path = cfg["auth"]["tokens_file"]
    check("tokens file is mounted from the Secret",
          os.path.dirname(tokens_path) == mounts["secrets"]["mountPath"] and
          vols["secrets"]["secret"]["items"][0]["path"] == os.path.basename(tokens_path) and
          vols["secrets"]["secret"]["items"][0]["key"] in secret_keys)
    check("workspace root is on a writable volume",
          cfg["providers"]["local"]["workspace_root"].startswith(mounts["workspaces"]["mountPath"]))

    # Configs load (tokens files replaced by a real one).
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as tf:
        tf.write(secret["stringData"]["tokens.json"])
        tokens_file = tf.name
    try:
        def fixed(text):
            c = json.loads(text)
            if "auth" in c:
                c["auth"]["tokens_file"] = tokens_file
            return json.dumps(c)
        config_ok(brokerd, fixed(cm["data"]["config.json"]), "the ConfigMap")
        for path in sorted(glob.glob(os.path.join(ROOT, "deploy", "configs", "*.json"))):
            with open(path) as f:
                config_ok(brokerd, fixed(f.read()), os.path.relpath(path, ROOT))
        with open(os.path.join(ROOT, "deploy", "configs", "local.json")) as f:
            bad = json.loads(f.read())
        bad["providers"]["local"]["memry_bytes"] = 1
        bad["auth"]["tokens_file"] = tokens_file
        r = subprocess.run([brokerd, "--config", "/dev/stdin", "--check-config"],
                           input=json.dumps(bad), capture_output=True, text=True, timeout=30)
        check("a bad key is refused and named", r.returncode != 0 and
              "providers.local.memry_bytes: unknown key" in r.stderr, r.stderr)
    finally:
        os.unlink(tokens_file)

    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str
    unit.read(os.path.join(ROOT, "deploy", "systemd", "sandbox-brokerd.service"))
    svc_sec = unit["Service"]
    for key in ("NoNewPrivileges", "ProtectSystem", "ProtectHome", "PrivateTmp",
                "ProtectKernelModules", "RestrictSUIDSGID", "CapabilityBoundingSet"):
        check(f"systemd hardening: {key}", key in svc_sec)
    check("systemd stops with SIGTERM and waits for the drain",
          svc_sec.get("KillSignal") == "SIGTERM" and int(svc_sec.get("TimeoutStopSec", 0)) > 30)

    with open(os.path.join(ROOT, "Dockerfile")) as f:
        docker = f.read()
    check("Dockerfile uses the shared build steps",
          "image-steps.sh build" in docker and "image-steps.sh runtime" in docker)
    check("Dockerfile: bookworm build, bookworm-slim runtime, non-root, HEALTHCHECK via sandboxctl",
          "FROM debian:bookworm AS build" in docker and "FROM debian:bookworm-slim" in docker and
          "USER 10001" in docker and "sandboxctl" in docker.split("HEALTHCHECK", 1)[1])

    check("Dockerfile: the image's config needs no file the run line does not give",
          "COPY deploy/configs/container.json /etc/sandbox-broker/config.json" in docker)
    with open(os.path.join(ROOT, "deploy", "configs", "container.json")) as f:
        image_cfg = json.load(f)
    check("image config: local provider, no tokens file", image_cfg.get("default_provider") ==
          "local" and "auth" not in image_cfg)
    with open(os.path.join(ROOT, ".dockerignore")) as f:
        ignored = [l.strip() for l in f if l.strip() and not l.startswith("#")]
    check(".dockerignore: the context is an allow-list (no .git, no build trees)",
          ignored[0] == "*" and "!.git" not in ignored and not any(
              l.startswith("!build") for l in ignored))

    cluster_checks(brokerd, dep, svc, pdb, cm, secret)

    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


def cluster_checks(brokerd, single_dep, single_svc, single_pdb, single_cm, single_secret):
    """deploy/kubernetes/cluster/: three brokers sharing sessions through the
    etcd StatefulSet next to them (docs/cluster.md)."""
    docs = load_dir("cluster")
    by_kind = {}
    for d in docs:
        by_kind.setdefault(d["kind"], []).append(d)
    kinds = sorted(d["kind"] for d in docs)
    check("cluster: kinds", kinds == sorted(["StatefulSet", "StatefulSet", "Service", "Service",
                                             "Service", "PodDisruptionBudget",
                                             "PodDisruptionBudget", "ConfigMap", "Secret"]),
          kinds)

    def is_etcd(d):
        pod_labels = d.get("spec", {}).get("template", {}).get("metadata", {}).get("labels", {})
        sel = d.get("spec", {}).get("selector", {})
        sel = sel.get("matchLabels", sel)
        return "etcd" in (d["metadata"]["labels"].get("app.kubernetes.io/name"),
                          pod_labels.get("app.kubernetes.io/name"),
                          sel.get("app.kubernetes.io/name"))

    (sts,) = [d for d in by_kind["StatefulSet"] if not is_etcd(d)]
    (etcd,) = [d for d in by_kind["StatefulSet"] if is_etcd(d)]
    (pdb,) = [d for d in by_kind["PodDisruptionBudget"] if not is_etcd(d)]
    (etcd_pdb,) = [d for d in by_kind["PodDisruptionBudget"] if is_etcd(d)]
    (cm,) = by_kind["ConfigMap"]
    (secret,) = by_kind["Secret"]
    services = {d["metadata"]["name"]: d for d in by_kind["Service"]}
    broker_svcs = [d for d in by_kind["Service"] if not is_etcd(d)]
    headless = [d for d in broker_svcs if d["spec"].get("clusterIP") == "None"]
    clients = [d for d in broker_svcs if d["spec"].get("clusterIP") != "None"]

    # ---- the brokers ----
    spec = sts["spec"]
    labels = spec["template"]["metadata"]["labels"]
    check("cluster: 3 replicas", spec.get("replicas") == 3)
    check("cluster: statefulset selector matches its pods",
          selects(spec["selector"]["matchLabels"], labels))
    check("cluster: a headless Service (clusterIP None) selects the broker pods",
          len(headless) == 1 and selects(headless[0]["spec"]["selector"], labels))
    check("cluster: the statefulset's serviceName is that headless Service",
          len(headless) == 1 and spec.get("serviceName") == headless[0]["metadata"]["name"])
    check("cluster: the headless Service lists replicas that are not ready too",
          len(headless) == 1 and headless[0]["spec"].get("publishNotReadyAddresses") is True)
    check("cluster: a client Service selects the broker pods",
          len(clients) == 1 and selects(clients[0]["spec"]["selector"], labels))
    check("cluster: service ports target the named ports",
          all(sorted(p["targetPort"] for p in d["spec"]["ports"]) == ["grpc", "metrics"]
              for d in broker_svcs))
    check("cluster: pdb selects the broker pods", selects(pdb["spec"]["selector"]["matchLabels"],
                                                         labels))
    check("cluster: pdb lets one replica go at a time",
          pdb["spec"].get("maxUnavailable") == 1 or pdb["spec"].get("minAvailable") == 2,
          pdb["spec"])
    single_labels = single_dep["spec"]["template"]["metadata"]["labels"]
    check("cluster: the single-broker manifests select none of its pods, it none of theirs",
          not any(selects(sel, labels) for sel in (
              single_svc["spec"]["selector"], single_pdb["spec"]["selector"]["matchLabels"],
              single_dep["spec"]["selector"]["matchLabels"])) and
          not any(selects(sel, single_labels) for sel in (
              spec["selector"]["matchLabels"], pdb["spec"]["selector"]["matchLabels"],
              *(d["spec"]["selector"] for d in broker_svcs))))
    single_names = {(d["kind"], d["metadata"]["name"]) for d in
                    (single_dep, single_svc, single_pdb, single_cm, single_secret)}
    check("cluster: no name clashes with the single-broker manifests (one namespace can hold both)",
          not single_names & {(d["kind"], d["metadata"]["name"]) for d in docs})

    pod = spec["template"]["spec"]
    (c,) = pod["containers"]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    check("cluster: grpc and metrics ports", ports == {"grpc": 50051, "metrics": 9090})
    rp, lp = c.get("readinessProbe", {}), c.get("livenessProbe", {})
    check("cluster: readinessProbe is the gRPC health probe on \"\" (NOT_SERVING while not a member)",
          rp.get("grpc", {}).get("port") == ports["grpc"] and
          rp["grpc"].get("service", "") == "")
    check("cluster: livenessProbe is a gRPC health probe on the grpc port",
          lp.get("grpc", {}).get("port") == ports["grpc"])
    single_pod = single_dep["spec"]["template"]["spec"]
    check("cluster: the single broker's securityContexts, resources and user namespace",
          c.get("securityContext") == single_pod["containers"][0]["securityContext"] and
          pod.get("securityContext") == single_pod["securityContext"] and
          pod.get("hostUsers") == single_pod.get("hostUsers") and
          c.get("resources") == single_pod["containers"][0]["resources"])

    env = c.get("env", [])
    env_names = [e["name"] for e in env]
    env_by_name = {e["name"]: e for e in env}

    def field_ref(name):
        return env_by_name.get(name, {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")

    check("cluster: SANDBOX_BROKER_MEMBER_ID is the pod name (fieldRef metadata.name)",
          field_ref("SANDBOX_BROKER_MEMBER_ID") == "metadata.name")
    adv = env_by_name.get("SANDBOX_BROKER_ADVERTISE_ADDRESS", {}).get("value", "")
    m = re.fullmatch(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\):(\d+)", adv)
    check("cluster: SANDBOX_BROKER_ADVERTISE_ADDRESS is $(pod IP):grpc port, the pod IP a fieldRef"
          " defined before it",
          m is not None and field_ref(m.group(1)) == "status.podIP" and
          env_names.index(m.group(1)) < env_names.index("SANDBOX_BROKER_ADVERTISE_ADDRESS") and
          int(m.group(2)) == ports["grpc"], adv)

    single_secret_keys = set(single_secret["stringData"])
    refs = [e["valueFrom"]["secretKeyRef"] for e in env if "secretKeyRef" in e.get("valueFrom", {})]
    check("cluster: env references existing keys of the single broker's Secret",
          refs and all(r["name"] == single_secret["metadata"]["name"] and
                       r["key"] in single_secret_keys for r in refs))
    check("cluster: drain fits in the termination grace period",
          pod["terminationGracePeriodSeconds"] >
          json.loads(cm["data"]["config.json"]).get("drain_grace_seconds", 30))

    vols = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    check("cluster: every mount has a volume", {m["name"] for m in mounts.values()} <= set(vols))

    def secret_file(path):
        """(Secret name, key) mounted at `path`, or None."""
        mnt = mounts.get(os.path.dirname(path))
        if mnt is None or "subPath" in mnt or "secret" not in vols.get(mnt["name"], {}):
            return None
        sv = vols[mnt["name"]]["secret"]
        items = {i["path"]: i["key"] for i in sv.get("items", [])}
        key = items.get(os.path.basename(path)) if items else os.path.basename(path)
        return (sv["secretName"], key) if key else None

    config_arg = c["args"][c["args"].index("--config") + 1]
    cmnt = mounts.get(os.path.dirname(config_arg), {})
    check("cluster: config comes from the cluster ConfigMap",
          vols.get(cmnt.get("name"), {}).get("configMap", {}).get("name") ==
          cm["metadata"]["name"] and "subPath" not in cmnt and
          os.path.basename(config_arg) in cm["data"])

    cfg = json.loads(cm["data"]["config.json"])
    cl = cfg.get("cluster", {})
    check("cluster: state.backend etcd, cluster mode on (cluster.token_file)",
          cfg.get("state", {}).get("backend") == "etcd" and bool(cl.get("token_file")) and
          "token" not in cl)
    check("cluster: member_id and advertise_address come from the pod, not the shared config",
          not cl.get("member_id") and not cl.get("advertise_address"))
    listen_port = int(cfg["listen"].rsplit(":", 1)[1])
    check("cluster: listen is the grpc port", listen_port == ports["grpc"])
    check("cluster: cluster.token_file is mounted from the cluster token Secret",
          secret_file(cl.get("token_file", "")) is not None and
          secret_file(cl["token_file"]) == (secret["metadata"]["name"],
                                            next(iter(secret["stringData"]), None)) and
          len(secret["stringData"]) == 1)
    tf = cfg.get("auth", {}).get("tokens_file", "")
    check("cluster: auth.tokens_file is mounted from the single broker's Secret",
          secret_file(tf) is not None and secret_file(tf)[0] == single_secret["metadata"]["name"] and
          secret_file(tf)[1] in single_secret_keys)
    wmnt = [p for p in mounts if cfg["providers"]["local"]["workspace_root"].startswith(p + "/")]
    check("cluster: workspace root is on a writable emptyDir",
          len(wmnt) == 1 and "emptyDir" in vols[mounts[wmnt[0]]["name"]] and
          not mounts[wmnt[0]].get("readOnly"))

    # ---- etcd ----
    espec = etcd["spec"]
    elabels = espec["template"]["metadata"]["labels"]
    (ec,) = espec["template"]["spec"]["containers"]
    eports = {p["name"]: p["containerPort"] for p in ec["ports"]}
    esvc = services.get(espec.get("serviceName"), {})
    check("cluster: etcd has 3 members", espec.get("replicas") == 3)
    check("cluster: etcd statefulset selector matches its pods",
          selects(espec["selector"]["matchLabels"], elabels))
    check("cluster: etcd's serviceName is a headless Service selecting its pods, not-ready too",
          esvc.get("spec", {}).get("clusterIP") == "None" and
          selects(esvc["spec"]["selector"], elabels) and
          esvc["spec"].get("publishNotReadyAddresses") is True)
    check("cluster: etcd's Service has its client and peer ports",
          {p["name"]: p["port"] for p in esvc.get("spec", {}).get("ports", [])} ==
          {"client": eports.get("client"), "peer": eports.get("peer")} and
          eports.get("client") == 2379 and eports.get("peer") == 2380)
    check("cluster: etcd pdb keeps a quorum",
          selects(etcd_pdb["spec"]["selector"]["matchLabels"], elabels) and
          (etcd_pdb["spec"].get("maxUnavailable") == 1 or
           etcd_pdb["spec"].get("minAvailable", 0) > espec["replicas"] // 2))
    check("cluster: etcd is not selected by the broker's Services and PDB, nor they by it",
          not any(selects(sel, elabels) for sel in (
              pdb["spec"]["selector"]["matchLabels"], *(d["spec"]["selector"] for d in broker_svcs)))
          and not selects(etcd_pdb["spec"]["selector"]["matchLabels"], labels) and
          not selects(esvc.get("spec", {}).get("selector"), labels))
    members = [f"{etcd['metadata']['name']}-{i}" for i in range(espec["replicas"])]
    host = lambda m: f"{m}.{espec['serviceName']}"
    check("cluster: state.etcd.endpoints are the etcd members' client URLs",
          cfg["state"]["etcd"].get("endpoints") ==
          [f"http://{host(m)}:{eports['client']}" for m in members],
          cfg["state"]["etcd"].get("endpoints"))
    args = dict(a[2:].split("=", 1) for a in ec.get("args", []) if a.startswith("--") and "=" in a)
    pod_var = re.fullmatch(r"http://\$\(([A-Za-z_]+)\)\." + re.escape(espec["serviceName"]) + r":(\d+)",
                           args.get("advertise-client-urls", ""))
    eenv = {e["name"]: e for e in ec.get("env", [])}
    check("cluster: each etcd member advertises <pod>.<service>:client port, named after its pod",
          pod_var is not None and int(pod_var.group(2)) == eports["client"] and
          args.get("name") == f"$({pod_var.group(1)})" and
          args.get("initial-advertise-peer-urls") ==
          f"http://$({pod_var.group(1)}).{espec['serviceName']}:{eports['peer']}" and
          eenv.get(pod_var.group(1), {}).get("valueFrom", {}).get("fieldRef", {}).get(
              "fieldPath") == "metadata.name", args)
    check("cluster: etcd's --initial-cluster lists every member at its peer URL",
          args.get("initial-cluster") ==
          ",".join(f"{m}=http://{host(m)}:{eports['peer']}" for m in members),
          args.get("initial-cluster"))
    check("cluster: etcd has a readiness probe and its data on a volume claim",
          "readinessProbe" in ec and
          any(t["metadata"]["name"] == vm["name"] and args.get("data-dir", "").startswith(
              vm["mountPath"] + "/") for t in espec.get("volumeClaimTemplates", [])
              for vm in ec.get("volumeMounts", [])))

    # ---- podman-ci plays the single broker only ----
    with open(os.path.join(ROOT, "deploy", "podman-ci.sh")) as f:
        played = re.findall(r'load\("([^"]+)"\)', f.read())
    check("podman-ci plays only top-level deploy/kubernetes files, none of cluster/",
          played and all("/" not in p and os.path.isfile(
              os.path.join(ROOT, "deploy", "kubernetes", p)) for p in played) and
          not any(d["kind"] == "StatefulSet" for d in load_dir("")), played)

    # ---- the config loads (token files replaced by real ones) ----
    with tempfile.TemporaryDirectory() as tmp:
        tokens_file = os.path.join(tmp, "tokens.json")
        with open(tokens_file, "w") as f:
            f.write(single_secret["stringData"]["tokens.json"])
        token_file = os.path.join(tmp, "token")
        with open(token_file, "w") as f:
            f.write(next(iter(secret["stringData"].values())))
        fixed = json.loads(cm["data"]["config.json"])
        fixed.setdefault("auth", {})["tokens_file"] = tokens_file
        if fixed.get("cluster", {}).get("token_file"):
            fixed["cluster"]["token_file"] = token_file
        config_ok(brokerd, json.dumps(fixed), "the cluster ConfigMap")


if __name__ == "__main__":
    sys.exit(main())
