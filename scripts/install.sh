#!/bin/sh
# Installs nodeward on a host and makes it a Kubernetes node (first boot: cloud-init's runcmd,
# an Ignition/Butane unit, or by hand; docs/first-boot.md):
#   1. the binary, from a file (--binary) or a URL pinned by its sha256 (--url, --sha256),
#      checked to run here, to /usr/local/bin/nodeward;
#   2. the node config (--config), checked by that binary, to /etc/nodeward/node.yaml (0600);
#   3. the daemon's unit, as the binary prints it (`nodeward unit`), to
#      /etc/systemd/system/nodeward.service, enabled;
#   4. `nodeward bootstrap` with that config; then the daemon is started (--no-start: not).
# Every file is replaced atomically and only when it differs, so a second run changes nothing
# and a run cut short is finished by the next (bootstrap resumes at its checkpoint). Nothing is
# installed when the binary or the config fails its check.
#
# --root DIR installs beneath DIR instead of / (an image being built, the tests): units are
# enabled with `systemctl --root`, and the daemon is not started (no systemd runs that root);
# bootstrap still runs with `--root DIR` unless --no-bootstrap.
set -eu

usage() {
    cat <<'EOF'
usage: install.sh (--binary FILE | --url URL --sha256 HEX) [--config FILE]
                  [--root DIR] [--no-bootstrap] [--no-start]
  --binary FILE   the nodeward binary to install (--sha256 optional: checked when given)
  --url URL       download the binary (http or https); --sha256 is then required
  --sha256 HEX    the binary's sha256 (64 hex digits)
  --config FILE   the node config (required unless DIR/etc/nodeward/node.yaml exists)
  --root DIR      install beneath DIR (default /)
  --no-bootstrap  install only; do not run `nodeward bootstrap`
  --no-start      do not start the daemon (it is still enabled)
EOF
}

die() {
    echo "install.sh: $*" >&2
    exit 1
}

root=/ binary= url= sha256= config= bootstrap=1 start=1
while [ $# -gt 0 ]; do
    case $1 in
    --root | --binary | --url | --sha256 | --config)
        [ $# -ge 2 ] || die "$1 needs a value"
        case $1 in
        --root) root=$2 ;;
        --binary) binary=$2 ;;
        --url) url=$2 ;;
        --sha256) sha256=$2 ;;
        --config) config=$2 ;;
        esac
        shift 2
        ;;
    --no-bootstrap) bootstrap=0 && shift ;;
    --no-start) start=0 && shift ;;
    -h | --help) usage && exit 0 ;;
    *) usage >&2 && die "unknown argument: $1" ;;
    esac
done

if [ -n "$binary" ] && [ -n "$url" ]; then die "--binary and --url exclude each other"; fi
if [ -z "$binary" ] && [ -z "$url" ]; then die "--binary FILE or --url URL is required"; fi
if [ -n "$url" ] && [ -z "$sha256" ]; then die "--url $url needs --sha256 (the binary is pinned)"; fi
if [ -n "$sha256" ]; then
    case $sha256 in
    *[!0-9a-f]*) die "--sha256 $sha256: not 64 lower-case hex digits" ;;
    esac
    [ ${#sha256} -eq 64 ] || die "--sha256 $sha256: not 64 lower-case hex digits"
fi
[ -d "$root" ] || die "--root $root: not a directory"
root=$(cd "$root" && pwd -P)
prefix=${root%/}

dest_bin=$prefix/usr/local/bin/nodeward
dest_config=$prefix/etc/nodeward/node.yaml
dest_unit=$prefix/etc/systemd/system/nodeward.service
if [ -z "$config" ]; then
    [ -f "$dest_config" ] || die "--config FILE is required ($dest_config does not exist yet)"
    config=$dest_config
fi
[ -f "$config" ] || die "--config $config: no such file"

work=$(mktemp -d "${TMPDIR:-/tmp}/nodeward-install.XXXXXX")
trap 'rm -rf "$work"' EXIT INT TERM

# 1. The binary, checked before anything is installed.
if [ -n "$url" ]; then
    echo "install.sh: downloading $url"
    curl --fail --silent --show-error --location --proto '=http,https' --retry 3 \
        --connect-timeout 20 --max-time 600 -o "$work/nodeward" "$url" ||
        die "downloading the binary from $url failed"
else
    [ -f "$binary" ] || die "--binary $binary: no such file"
    cp "$binary" "$work/nodeward"
fi
if [ -n "$sha256" ]; then
    got=$(sha256sum "$work/nodeward" | cut -d' ' -f1)
    [ "$got" = "$sha256" ] || die "the binary from ${url:-$binary} has sha256 $got, not the pinned $sha256"
fi
chmod 0755 "$work/nodeward"
"$work/nodeward" version >/dev/null 2>"$work/version.err" ||
    die "the binary from ${url:-$binary} does not run here: $(head -c 500 "$work/version.err")"

# 2. The config, checked by that binary (its parser names the file and the field at fault).
"$work/nodeward" config validate "$config" >/dev/null || die "the config $config is not valid (above)"
"$work/nodeward" unit >"$work/nodeward.service"

# place SRC DEST MODE: DEST atomically replaced by SRC (a temporary beside it, then a rename)
# unless it already has those bytes; says what it did.
place() {
    if [ -f "$2" ] && cmp -s "$1" "$2"; then
        chmod "$3" "$2"
        echo "install.sh: $2 unchanged"
        return
    fi
    mkdir -p "$(dirname "$2")"
    tmp="$(dirname "$2")/.$(basename "$2").install-$$"
    cp "$1" "$tmp"
    chmod "$3" "$tmp"
    mv -f "$tmp" "$2"
    changed=1
    echo "install.sh: installed $2"
}
changed=0

place "$work/nodeward" "$dest_bin" 0755
if [ "$config" != "$dest_config" ]; then
    place "$config" "$dest_config" 0600
fi
place "$work/nodeward.service" "$dest_unit" 0644

# 3. The unit, enabled (started after the bootstrap: the daemon keeps a node, it does not make
#    one; started before, it would wait for the bootstrap anyway).
if [ "$root" = / ]; then
    systemctl daemon-reload
    systemctl enable nodeward.service
else
    systemctl --root="$root" enable nodeward.service
fi

# 4. The node.
if [ "$bootstrap" = 1 ]; then
    echo "install.sh: nodeward bootstrap --config $dest_config"
    "$dest_bin" bootstrap --root "$root" --config "$dest_config"
fi
if [ "$start" = 1 ] && [ "$root" = / ]; then
    # A new binary, unit or config reaches a running daemon by a restart; else start is a
    # no-op for a running one.
    if [ "$changed" = 1 ]; then verb=restart; else verb=start; fi
    systemctl "$verb" nodeward.service
    echo "install.sh: nodeward.service ${verb}ed (journalctl -u nodeward)"
elif [ "$start" = 1 ]; then
    echo "install.sh: --root $root: nodeward.service enabled there, not started"
fi
