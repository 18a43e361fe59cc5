#!/usr/bin/env bash
# Starts a real Kubernetes control plane on 127.0.0.1 for the cluster tests: etcd (Debian's),
# kube-apiserver and kube-controller-manager (built by scripts/kube-build.sh from Debian's
# kubernetes source), with the certificates, RBAC and bootstrap token of kubeadm's TLS-bootstrap
# flow: a kubelet holding only the bootstrap token gets its CSR auto-approved and signed.
#
# Where it runs: anywhere as root (it needs no namespace of its own, only free loopback ports).
# The tests start it inside the systemd harness (tests/cluster/mod.rs), so a harness stop also
# ends it for certain; the node (kubelet, containerd) must run inside a hybrid harness
# (scripts/kube-node-start.sh).
#
# Ports are picked free at random (etcd client and peer, apiserver), so several clusters can run
# side by side on this shared machine. Every process is started by this script, recorded by PID
# in $STATE/pids, and ended only by scripts/kube-cluster-stop.sh (same state directory).
#
# Environment:
#   NODEWARD_CLUSTER_STATE   state directory (default /tmp/nodeward-cluster); must not exist or
#                            be empty
#   NODEWARD_KUBE_DIR        the kube-build cache directory (default: ask scripts/kube-build.sh)
#   NODEWARD_CLUSTER_TIMEOUT seconds to wait for each component (default 60)
#   NODEWARD_KUBECTL         kubectl binary (default the kube-build one)
#   NODEWARD_CLUSTER_AUDIT   1: the apiserver writes an audit log of every request but its own
#                            loopback ones (Metadata level: who, verb, URI, code, times; no
#                            bodies) to $STATE/logs/audit.log, one JSON event a line
#                            (benches/fleet.rs counts the fleet's requests with it)
# Writes $STATE/cluster.env (shell assignments; the Rust fixture reads it):
#   API_URL CA_CERT CA_KEY ADMIN_KUBECONFIG BOOTSTRAP_KUBECONFIG BOOTSTRAP_TOKEN KUBECTL
#   KUBE_DIR KUBELET KUBELET_UPGRADE KUBE_VERSION KUBE_UPGRADE_VERSION PAUSE_IMAGE_TAR
#   WORKLOAD_IMAGE_TAR PAUSE_IMAGE WORKLOAD_IMAGE KUBELET_CLIENT_CERT KUBELET_CLIENT_KEY
#   AUDIT_LOG (empty without NODEWARD_CLUSTER_AUDIT=1)
# and $STATE/kube-apiserver.cmd (the apiserver's command line, NUL-separated), from which
# scripts/kube-apiserver-restart.sh starts it again with the same flags.
set -euo pipefail

STATE=${NODEWARD_CLUSTER_STATE:-/tmp/nodeward-cluster}
TIMEOUT=${NODEWARD_CLUSTER_TIMEOUT:-60}
AUDIT=${NODEWARD_CLUSTER_AUDIT:-0}
HERE=$(cd "$(dirname "$0")" && pwd)
MARKER=.nodeward-cluster

log() { echo "kube-cluster-start: $*" >&2; }
die() { log "$*"; exit 1; }
case $STATE in /?*) ;; *) die "NODEWARD_CLUSTER_STATE must be an absolute path other than /, got '$STATE'" ;; esac
[ "$(id -u)" = 0 ] || die "must run as root"
case $AUDIT in 0 | 1) ;; *) die "NODEWARD_CLUSTER_AUDIT must be 0 or 1, got '$AUDIT'" ;; esac
for b in etcd openssl curl ss setsid; do command -v "$b" >/dev/null || die "'$b' not found (apt-get install etcd-server openssl curl iproute2 util-linux)"; done
if [ -e "$STATE/$MARKER" ]; then
    die "a cluster state exists in $STATE; stop it with scripts/kube-cluster-stop.sh first"
fi
[ ! -e "$STATE" ] || [ -z "$(ls -A "$STATE")" ] || die "$STATE exists and is not empty"

KUBE_DIR=${NODEWARD_KUBE_DIR:-$("$HERE/kube-build.sh")}
[ -e "$KUBE_DIR/complete" ] || die "$KUBE_DIR is not a complete kube-build cache"
# shellcheck disable=SC1091
. "$KUBE_DIR/env"
KUBECTL=${NODEWARD_KUBECTL:-$KUBE_DIR/bin/kubectl}

started=$(date +%s%N)
mkdir -p "$STATE"/{pki,pids,logs,etcd}
chmod 700 "$STATE"
touch "$STATE/$MARKER"

fail() {
    log "$*"
    for f in "$STATE"/logs/*.log; do
        [ -e "$f" ] || continue
        echo "--- $f (last 30 lines) ---" >&2
        tail -n 30 "$f" >&2
    done
    NODEWARD_CLUSTER_STATE=$STATE "$HERE/kube-cluster-stop.sh" >&2 || true
    exit 1
}

# --- free loopback ports ------------------------------------------------------------------------
used=$(ss -Htanl | awk '{ print $4 }' | sed 's/.*://' | sort -u)
pick_port() {
    local p
    while :; do
        p=$((20000 + RANDOM % 20000))
        grep -qx "$p" <<<"$used" && continue
        grep -qx "$p" <<<"${picked:-}" && continue
        picked="${picked:-}"$'\n'"$p"
        echo "$p"
        return
    done
}
picked=
ETCD_PORT=$(pick_port); picked+=$'\n'$ETCD_PORT
ETCD_PEER_PORT=$(pick_port); picked+=$'\n'$ETCD_PEER_PORT
API_PORT=$(pick_port)
API_URL=https://127.0.0.1:$API_PORT

# --- certificates ---------------------------------------------------------------------------------
P=$STATE/pki
ossl() { openssl "$@" 2>>"$STATE/logs/openssl.log" >&2; }
ossl req -x509 -newkey rsa:2048 -nodes -keyout "$P/ca.key" -out "$P/ca.crt" -days 2 \
    -subj "/CN=nodeward-test-ca" -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature"
# cert NAME SUBJECT EXTENSIONS
cert() {
    ossl req -newkey rsa:2048 -nodes -keyout "$P/$1.key" -out "$P/$1.csr" -subj "$2"
    printf '%s\n' "$3" >"$P/$1.ext"
    ossl x509 -req -in "$P/$1.csr" -CA "$P/ca.crt" -CAkey "$P/ca.key" -CAcreateserial \
        -days 2 -out "$P/$1.crt" -extfile "$P/$1.ext"
    rm -f "$P/$1.csr"
}
CLIENT='basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth'
cert apiserver "/CN=kube-apiserver" 'basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=IP:127.0.0.1,DNS:localhost,IP:10.0.0.1,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc'
cert admin "/O=system:masters/CN=nodeward-admin" "$CLIENT"
cert controller-manager "/CN=system:kube-controller-manager" "$CLIENT"
cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" "$CLIENT"
ossl genrsa -out "$P/sa.key" 2048
ossl rsa -in "$P/sa.key" -pubout -out "$P/sa.pub"

# kubeconfig NAME USER-YAML: written by hand (no kubectl needed), the CA embedded.
CA_B64=$(base64 -w0 <"$P/ca.crt")
kubeconfig() {
    cat >"$STATE/$1.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: nodeward
  cluster:
    server: $API_URL
    certificate-authority-data: $CA_B64
users:
- name: user
  user:
$2
contexts:
- name: default
  context:
    cluster: nodeward
    user: user
current-context: default
EOF
    chmod 600 "$STATE/$1.kubeconfig"
}
certuser() {
    printf '    client-certificate-data: %s\n    client-key-data: %s' \
        "$(base64 -w0 <"$P/$1.crt")" "$(base64 -w0 <"$P/$1.key")"
}
kubeconfig admin "$(certuser admin)"
kubeconfig controller-manager "$(certuser controller-manager)"
TOKEN_ID=$(openssl rand -hex 3)
TOKEN_SECRET=$(openssl rand -hex 8)
BOOTSTRAP_TOKEN=$TOKEN_ID.$TOKEN_SECRET
kubeconfig bootstrap "    token: $BOOTSTRAP_TOKEN"
ADMIN=$STATE/admin.kubeconfig
k() { "$KUBECTL" --kubeconfig="$ADMIN" --request-timeout=20s "$@"; }

# --- processes ------------------------------------------------------------------------------------
# spawn NAME COMMAND...: in its own session, PID recorded; output to $STATE/logs/NAME.log.
spawn() {
    local name=$1
    shift
    setsid "$@" </dev/null >>"$STATE/logs/$name.log" 2>&1 &
    echo $! >"$STATE/pids/$name"
}
alive() { [ -d "/proc/$(cat "$STATE/pids/$1")" ]; }
# wait_for NAME DESCRIPTION COMMAND...: until COMMAND succeeds, NAME stays alive, TIMEOUT.
wait_for() {
    local name=$1 what=$2 limit=$(($(date +%s) + TIMEOUT))
    shift 2
    until "$@" >/dev/null 2>&1; do
        alive "$name" || fail "$name exited before $what"
        [ "$(date +%s)" -lt "$limit" ] || fail "$what: not within ${TIMEOUT}s"
        sleep 0.2
    done
}

spawn etcd etcd --name=nodeward --data-dir="$STATE/etcd" \
    --listen-client-urls="http://127.0.0.1:$ETCD_PORT" --advertise-client-urls="http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls="http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls="http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster="nodeward=http://127.0.0.1:$ETCD_PEER_PORT" \
    --quota-backend-bytes=536870912 --log-level=warn
wait_for etcd "etcd healthy" curl -fsS "http://127.0.0.1:$ETCD_PORT/health"
t_etcd=$((($(date +%s%N) - started) / 1000000))

apiserver=("$KUBE_DIR/bin/kube-apiserver"
    --etcd-servers="http://127.0.0.1:$ETCD_PORT" --bind-address=127.0.0.1 --advertise-address=127.0.0.1
    --secure-port="$API_PORT" --insecure-port=0
    --tls-cert-file="$P/apiserver.crt" --tls-private-key-file="$P/apiserver.key"
    --client-ca-file="$P/ca.crt" --enable-bootstrap-token-auth=true
    --authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction
    --service-account-key-file="$P/sa.pub" --service-account-signing-key-file="$P/sa.key"
    --service-account-issuer=https://kubernetes.default.svc
    --service-cluster-ip-range=10.0.0.0/24 --endpoint-reconciler-type=none --allow-privileged=true
    --kubelet-client-certificate="$P/apiserver-kubelet-client.crt"
    --kubelet-client-key="$P/apiserver-kubelet-client.key"
    --kubelet-preferred-address-types=InternalIP --profiling=false)
AUDIT_LOG=
if [ "$AUDIT" = 1 ]; then
    # Metadata: who asked what and the answer's code, with the request's receive time; never a
    # body. The stage RequestReceived is left out (every request still has one event when its
    # response starts or completes; a watch has both). The apiserver's own loopback client
    # (its controllers and informers) is not logged: it is not a client of the cluster.
    AUDIT_LOG=$STATE/logs/audit.log
    cat >"$STATE/audit-policy.yaml" <<EOF
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: None
  users: [system:apiserver]
- level: Metadata
EOF
    apiserver+=(--audit-policy-file="$STATE/audit-policy.yaml" --audit-log-path="$AUDIT_LOG"
        --audit-log-format=json --audit-log-mode=blocking --audit-log-maxsize=0)
fi
printf '%s\0' "${apiserver[@]}" >"$STATE/kube-apiserver.cmd"
spawn kube-apiserver "${apiserver[@]}"
wait_for kube-apiserver "kube-apiserver /readyz" k get --raw /readyz
t_api=$((($(date +%s%N) - started) / 1000000))

# --flex-volume-plugin-dir: the controller-manager makes its flexvolume directory at start,
# /usr/libexec/kubernetes/... on the shared host by default (tests/node/root.rs watches it).
spawn kube-controller-manager "$KUBE_DIR/bin/kube-controller-manager" \
    --kubeconfig="$STATE/controller-manager.kubeconfig" --leader-elect=false \
    --flex-volume-plugin-dir="$STATE/flexvolume" \
    --secure-port=0 --port=0 --profiling=false \
    --controllers='*,bootstrapsigner,tokencleaner' \
    --cluster-signing-cert-file="$P/ca.crt" --cluster-signing-key-file="$P/ca.key" \
    --root-ca-file="$P/ca.crt" --service-account-private-key-file="$P/sa.key" \
    --use-service-account-credentials=true

# --- bootstrap token and the RBAC kubeadm sets up for it --------------------------------------------
expires=$(date -u -d '+6 hours' +%Y-%m-%dT%H:%M:%SZ)
cat >"$STATE/bootstrap.yaml" <<EOF
apiVersion: v1
kind: Secret
metadata:
  name: bootstrap-token-$TOKEN_ID
  namespace: kube-system
type: bootstrap.kubernetes.io/token
stringData:
  description: nodeward cluster test
  token-id: "$TOKEN_ID"
  token-secret: "$TOKEN_SECRET"
  expiration: "$expires"
  usage-bootstrap-authentication: "true"
  usage-bootstrap-signing: "true"
  auth-extra-groups: system:bootstrappers:kubeadm:default-node-token
---
# kubeadm:kubelet-bootstrap: bootstrap tokens may create CSRs.
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: kubeadm:kubelet-bootstrap
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: system:node-bootstrapper
subjects:
- apiGroup: rbac.authorization.k8s.io
  kind: Group
  name: system:bootstrappers:kubeadm:default-node-token
---
# kubeadm:node-autoapprove-bootstrap: their node client CSRs are approved.
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: kubeadm:node-autoapprove-bootstrap
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: system:certificates.k8s.io:certificatesigningrequests:nodeclient
subjects:
- apiGroup: rbac.authorization.k8s.io
  kind: Group
  name: system:bootstrappers:kubeadm:default-node-token
---
# kubeadm:node-autoapprove-certificate-rotation: nodes renew their own client certificates.
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: kubeadm:node-autoapprove-certificate-rotation
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: system:certificates.k8s.io:certificatesigningrequests:selfnodeclient
subjects:
- apiGroup: rbac.authorization.k8s.io
  kind: Group
  name: system:nodes
EOF
k apply -f "$STATE/bootstrap.yaml" >>"$STATE/logs/kubectl.log" 2>&1 || fail "kubectl apply of the bootstrap token and RBAC failed: $(tail -n 5 "$STATE/logs/kubectl.log")"
# The controller-manager is up once it has made the default ServiceAccount (pods need it).
wait_for kube-controller-manager "the default ServiceAccount" k -n default get serviceaccount default
t_kcm=$((($(date +%s%N) - started) / 1000000))

cat >"$STATE/cluster.env" <<EOF
API_URL=$API_URL
CA_CERT=$P/ca.crt
CA_KEY=$P/ca.key
KUBELET_CLIENT_CERT=$P/apiserver-kubelet-client.crt
KUBELET_CLIENT_KEY=$P/apiserver-kubelet-client.key
ADMIN_KUBECONFIG=$ADMIN
BOOTSTRAP_KUBECONFIG=$STATE/bootstrap.kubeconfig
BOOTSTRAP_TOKEN=$BOOTSTRAP_TOKEN
KUBECTL=$KUBECTL
KUBE_DIR=$KUBE_DIR
KUBELET=$KUBE_DIR/bin/kubelet
KUBELET_UPGRADE=$KUBE_DIR/bin/kubelet-upgrade
KUBE_VERSION=$KUBE_VERSION
KUBE_UPGRADE_VERSION=$KUBE_UPGRADE_VERSION
PAUSE_IMAGE=$PAUSE_IMAGE
WORKLOAD_IMAGE=$WORKLOAD_IMAGE
PAUSE_IMAGE_TAR=$KUBE_DIR/images/pause.tar
WORKLOAD_IMAGE_TAR=$KUBE_DIR/images/workload.tar
ETCD_URL=http://127.0.0.1:$ETCD_PORT
AUDIT_LOG=$AUDIT_LOG
EOF
log "etcd ${t_etcd} ms, apiserver ready ${t_api} ms, controller-manager ready ${t_kcm} ms; $API_URL; state $STATE"
echo "$STATE/cluster.env"
