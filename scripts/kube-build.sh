#!/usr/bin/env bash
# Builds the real Kubernetes parts the cluster tests need, from Debian bookworm's own `kubernetes`
# source package (v1.20.2, the last Debian source that ships vendor/), into a cache keyed by the
# source package version. A second run with a complete cache does nothing.
#
# Recipe measured on this kind of machine: research/real-cluster-on-one-vm.md.
#   bin/kube-apiserver, bin/kube-controller-manager, bin/kubelet   stamped v<upstream version>
#   bin/kubelet-upgrade                                             stamped $NODEWARD_KUBE_UPGRADE_VERSION
#   bin/kubectl                                                     from the same tree: Debian's own
#                     kubernetes-client binary crashes in `kubectl config set-credentials` (the
#                     reflect2 1.0.1 bug on Go >= 1.18 fixed below), so it is built here too
#   images/pause.tar     docker-archive, localhost/pause:local    (static build/pause/linux/pause.c)
#   images/workload.tar  docker-archive, localhost/workload:local (static C: prints a line, sleeps)
#   env                  shell assignments: KUBE_VERSION, KUBE_UPGRADE_VERSION, the image names
#
# Environment:
#   NODEWARD_KUBE_CACHE            cache root (default /var/cache/nodeward-kube)
#   NODEWARD_KUBE_UPGRADE_VERSION  gitVersion of the second kubelet (default v1.20.3-nodeward)
# Prints the cache directory (<root>/<source version>) as its only line on stdout; logs go to
# stderr. Needs root for apt-get (only when something is missing). Concurrent runs serialize on
# a lock in the cache root. A failed build keeps its work directory, so the next run resumes with
# a warm Go build cache; a successful one removes it (≈ 1.6 GB).
set -euo pipefail

ROOT=${NODEWARD_KUBE_CACHE:-/var/cache/nodeward-kube}
UPGRADE_VERSION=${NODEWARD_KUBE_UPGRADE_VERSION:-v1.20.3-nodeward}
SUITE=bookworm
SRC_LIST=/etc/apt/sources.list.d/nodeward-deb-src-bookworm.sources

log() { echo "kube-build: $*" >&2; }
die() { log "$*"; exit 1; }
case $ROOT in /?*) ;; *) die "NODEWARD_KUBE_CACHE must be an absolute path, got '$ROOT'" ;; esac

mkdir -p "$ROOT"
exec 9>"$ROOT/.lock"
flock 9

# --- the source package version (the cache key) ------------------------------------------------
srcversion() {
    apt-cache showsrc kubernetes 2>/dev/null | awk '
        /^Package:/ { p = $2 } /^Version:/ && p == "kubernetes" { print $2 }' |
        sort -V | grep -E '^1\.20\.' | tail -n 1
}
VERSION=$(srcversion || true)
if [ -z "$VERSION" ]; then
    [ "$(id -u)" = 0 ] || die "no deb-src for kubernetes is configured and not root to add one"
    # A deb-src line for bookworm, same mirror as the binary one (none is configured: showsrc
    # found nothing).
    if [ ! -e "$SRC_LIST" ]; then
        log "adding $SRC_LIST"
        cat >"$SRC_LIST" <<EOF
# Added by nodeward scripts/kube-build.sh: the kubernetes v1.20.2 sources (with vendor/).
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: $SUITE
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
    fi
    log "apt-get update"
    apt-get update -qq >&2
    VERSION=$(srcversion || true)
    [ -n "$VERSION" ] || die "apt-cache showsrc kubernetes finds no 1.20 version after adding $SRC_LIST"
fi
# The upstream version: 1.20.5+really1.20.2-1.1+deb12u1 is really 1.20.2.
UPSTREAM=${VERSION#*:}
UPSTREAM=${UPSTREAM%-*}
case $UPSTREAM in *+really*) UPSTREAM=${UPSTREAM##*+really} ;; esac
UPSTREAM=${UPSTREAM%%[+~]*}
OUT=$ROOT/$VERSION
# The cache layout version: a cache made by an older layout is rebuilt.
LAYOUT=2
if [ "$(cat "$OUT/complete" 2>/dev/null)" = "layout $LAYOUT" ]; then
    log "cached: $OUT"
    echo "$OUT"
    exit 0
fi
started=$(date +%s)

# --- build dependencies --------------------------------------------------------------------------
need=()
# Build deps, plus what the cluster scripts run (etcd, containerd, runc, CNI plugins, kubectl,
# openssl), so one apt-get run prepares a fresh machine. kubectl is built from the tree too (not
# Debian's kubernetes-client: it crashes, see above, and would clash with the Google Cloud SDK's
# /usr/bin/kubectl on machines that have it).
for p in golang-1.19-go rsync jq golang-github-modern-go-reflect2-dev dpkg-dev make gcc libc6-dev \
    etcd-server containerd runc containernetworking-plugins openssl iproute2; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
    [ "$(id -u)" = 0 ] || die "missing packages ${need[*]} and not root"
    log "apt-get install ${need[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >&2
fi
export PATH=/usr/lib/go-1.19/bin:$PATH
go version >&2

WORK=$ROOT/$VERSION.build

# --- sources -------------------------------------------------------------------------------------
GOPATH=$WORK/gopath
TREE=$GOPATH/src/k8s.io/kubernetes
mkdir -p "$WORK/dl"
if [ ! -e "$TREE/.nodeward-prepared" ]; then
    rm -rf "$TREE" "$WORK/src"
    (cd "$WORK/dl" && ls kubernetes_*.dsc >/dev/null 2>&1 || apt-get source --download-only -qq "kubernetes=$VERSION" >&2)
    dsc=$(ls "$WORK/dl"/kubernetes_*.dsc | head -n 1)
    log "unpacking $(basename "$dsc") (debian/patches applied by dpkg-source)"
    dpkg-source --no-check -x "$dsc" "$WORK/src" >&2
    [ -d "$WORK/src/vendor" ] || die "the $VERSION source has no vendor/ directory"
    # Debian's reflect2 1.0.2 replaces the vendored 1.0.1, which breaks on Go >= 1.18.
    r2=/usr/share/gocode/src/github.com/modern-go/reflect2
    [ -d "$r2" ] || die "$r2 missing (golang-github-modern-go-reflect2-dev)"
    rm -rf "$WORK/src/vendor/github.com/modern-go/reflect2"
    mkdir -p "$WORK/src/vendor/github.com/modern-go/reflect2"
    cp -a "$r2"/. "$WORK/src/vendor/github.com/modern-go/reflect2/"
    find "$WORK/src/vendor/github.com/modern-go/reflect2" -name '*_test.go' -delete
    mkdir -p "$(dirname "$TREE")"
    mv "$WORK/src" "$TREE"
    touch "$TREE/.nodeward-prepared"
fi

export GOPATH GO111MODULE=off CGO_ENABLED=0 GOFLAGS= GOCACHE=$WORK/gocache
cd "$TREE"
if [ ! -e .nodeward-generated ]; then
    log "make generated_files (≈ 1 min)"
    t=$(date +%s)
    make generated_files >&2
    touch .nodeward-generated
    log "generated files in $(($(date +%s) - t)) s"
fi

# The version variables hack/lib/version.sh sets (GOPATH mode: vendored packages are
# k8s.io/kubernetes/vendor/<path>).
ldflags() {
    local v=$1 major minor f out=""
    major=${v#v}; major=${major%%.*}
    minor=${v#v*.}; minor=${minor%%.*}
    for pkg in k8s.io/kubernetes/vendor/k8s.io/client-go/pkg/version \
        k8s.io/kubernetes/vendor/k8s.io/component-base/version; do
        for f in "gitVersion=$v" "gitMajor=$major" "gitMinor=$minor" "gitTreeState=clean" \
            "gitCommit=debian-$VERSION" "buildDate=1970-01-01T00:00:00Z"; do
            out="$out -X $pkg.$f"
        done
    done
    echo "-s -w$out"
}
for pkg in vendor/k8s.io/client-go/pkg/version vendor/k8s.io/component-base/version; do
    grep -q 'gitVersion' "$pkg/base.go" || die "$pkg/base.go has no gitVersion variable"
done

mkdir -p "$WORK/bin"
t=$(date +%s)
log "go build kube-apiserver kube-controller-manager kubelet kubectl (several minutes on 2 cores)"
go build -trimpath -o "$WORK/bin/" -ldflags "$(ldflags "v$UPSTREAM")" \
    ./cmd/kube-apiserver ./cmd/kube-controller-manager ./cmd/kubelet ./cmd/kubectl >&2
log "built in $(($(date +%s) - t)) s"
t=$(date +%s)
go build -trimpath -o "$WORK/bin/kubelet-upgrade" -ldflags "$(ldflags "$UPGRADE_VERSION")" ./cmd/kubelet >&2
log "kubelet $UPGRADE_VERSION built in $(($(date +%s) - t)) s"
"$WORK/bin/kubelet" --version >&2
"$WORK/bin/kubelet-upgrade" --version >&2

# --- images: static binaries as docker-archive tarballs ------------------------------------------
cat >"$WORK/workload.c" <<'EOF'
/* nodeward test workload: prints a line, then sleeps until SIGTERM/SIGINT (exits at once). */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
static void bye(int sig) { (void)sig; _exit(0); }
int main(int argc, char **argv) {
    signal(SIGTERM, bye);
    signal(SIGINT, bye);
    printf("nodeward-workload: hello from %s\n", argc > 1 ? argv[1] : "a pod");
    fflush(stdout);
    for (;;) pause();
}
EOF
mkdir -p "$WORK/img"
gcc -static -O2 -DVERSION="v$UPSTREAM-nodeward" -o "$WORK/img/pause" build/pause/linux/pause.c >&2
gcc -static -O2 -o "$WORK/img/workload" "$WORK/workload.c" >&2
strip "$WORK/img/pause" "$WORK/img/workload"

# docker-archive: manifest.json, config <sha>.json, one layer <sha>/layer.tar with the binary.
pack() { # name binary-path ref entrypoint-args... -> $WORK/images/<name>.tar
    local name=$1 bin=$2 ref=$3
    shift 3
    local d=$WORK/pack-$name layer diffid cfg cfgsha entry
    rm -rf "$d"
    mkdir -p "$d/rootfs" "$d/archive"
    install -m 0755 "$bin" "$d/rootfs/$(basename "$bin")"
    tar -C "$d/rootfs" --numeric-owner --owner=0 --group=0 --mtime=@0 --sort=name -cf "$d/layer.tar" .
    diffid=$(sha256sum "$d/layer.tar" | cut -d' ' -f1)
    mkdir -p "$d/archive/$diffid"
    mv "$d/layer.tar" "$d/archive/$diffid/layer.tar"
    entry=$(printf '%s\n' "$@" | jq -R . | jq -s -c .)
    cfg=$(jq -n -c --argjson entry "$entry" --arg diff "sha256:$diffid" '{
        architecture: "amd64", os: "linux", created: "1970-01-01T00:00:00Z",
        config: {Entrypoint: $entry, WorkingDir: "/", Env: ["PATH=/"]},
        rootfs: {type: "layers", diff_ids: [$diff]},
        history: [{created: "1970-01-01T00:00:00Z", created_by: "nodeward scripts/kube-build.sh"}]}')
    cfgsha=$(printf '%s' "$cfg" | sha256sum | cut -d' ' -f1)
    printf '%s' "$cfg" >"$d/archive/$cfgsha.json"
    jq -n -c --arg c "$cfgsha.json" --arg r "$ref" --arg l "$diffid/layer.tar" \
        '[{Config: $c, RepoTags: [$r], Layers: [$l]}]' >"$d/archive/manifest.json"
    mkdir -p "$WORK/images"
    tar -C "$d/archive" --numeric-owner --owner=0 --group=0 --mtime=@0 --sort=name -cf "$WORK/images/$name.tar" .
    rm -rf "$d"
}
pack pause "$WORK/img/pause" localhost/pause:local /pause
pack workload "$WORK/img/workload" localhost/workload:local /workload

# --- publish atomically ----------------------------------------------------------------------------
tmp=$ROOT/.$VERSION.tmp
rm -rf "$tmp"
mkdir -p "$tmp/bin" "$tmp/images"
cp "$WORK/bin/kube-apiserver" "$WORK/bin/kube-controller-manager" "$WORK/bin/kubelet" \
    "$WORK/bin/kubelet-upgrade" "$WORK/bin/kubectl" "$tmp/bin/"
cp "$WORK/images/pause.tar" "$WORK/images/workload.tar" "$tmp/images/"
cat >"$tmp/env" <<EOF
KUBE_SOURCE_VERSION=$VERSION
KUBE_VERSION=v$UPSTREAM
KUBE_UPGRADE_VERSION=$UPGRADE_VERSION
PAUSE_IMAGE=localhost/pause:local
WORKLOAD_IMAGE=localhost/workload:local
EOF
echo "layout $LAYOUT" >"$tmp/complete"
rm -rf "$OUT"
mv "$tmp" "$OUT"
cd /
rm -rf "$WORK"
log "done in $(($(date +%s) - started)) s: $OUT"
echo "$OUT"
