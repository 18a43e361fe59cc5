#!/usr/bin/env bash
# Installs what building and testing nodeward needs on a fresh Debian machine: a C toolchain
# (wasmtime builds a little C), systemd and D-Bus for the test harness, and rustup. The
# toolchain itself (Rust 1.95 and the wasm32-wasip2 target) comes from rust-toolchain.toml the
# first time cargo runs. Idempotent.
set -euo pipefail

need_apt=()
command -v cc >/dev/null 2>&1 || need_apt+=(build-essential)
command -v curl >/dev/null 2>&1 || need_apt+=(curl ca-certificates)
command -v pkg-config >/dev/null 2>&1 || need_apt+=(pkg-config)
# The test harness boots a real systemd (PID 1 in its own namespaces) with a D-Bus bus.
[ -x /lib/systemd/systemd ] || need_apt+=(systemd)
command -v dbus-daemon >/dev/null 2>&1 || need_apt+=(dbus)
command -v unshare >/dev/null 2>&1 || need_apt+=(util-linux)
command -v pgrep >/dev/null 2>&1 || need_apt+=(procps)
# The none-mode fixture packs Debian's CNI plugins into the upstream tarball layout
# and Debian's containerd and runc binaries into the upstream tarball layouts (tests/node/artifacts.rs),
# so every test run needs them, not only the cluster one.
[ -d /usr/lib/cni ] || need_apt+=(containernetworking-plugins)
[ -x /usr/bin/containerd ] || need_apt+=(containerd)
# The stub API server's TLS certificates are made by the openssl CLI (tests/node/api_server.rs).
command -v openssl >/dev/null 2>&1 || need_apt+=(openssl)
[ -x /usr/sbin/runc ] || [ -x /usr/bin/runc ] || need_apt+=(runc)
if [ ${#need_apt[@]} -gt 0 ]; then
    sudo_cmd=""
    [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
    $sudo_cmd apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${need_apt[@]}"
fi

# The OCI bundle tests (tests/bundles/oci.rs) run their own registry on 127.0.0.1: Debian's
# docker-registry. Its package would start and enable a service listening on :5000 on every
# address; installed with a policy that starts nothing (unless the host has its own policy),
# and its unit disabled: nothing here runs it but the tests.
if [ ! -x /usr/bin/docker-registry ]; then
    sudo_cmd=""
    [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
    own_policy=""
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\nexit 101\n' | $sudo_cmd tee /usr/sbin/policy-rc.d >/dev/null
        $sudo_cmd chmod 755 /usr/sbin/policy-rc.d
        own_policy=1
        # Never left behind, even when the install fails: it would stop every later service start.
        trap '$sudo_cmd rm -f /usr/sbin/policy-rc.d' EXIT
    fi
    $sudo_cmd apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends docker-registry
    if [ -n "$own_policy" ]; then
        $sudo_cmd rm -f /usr/sbin/policy-rc.d
        trap - EXIT
    fi
fi
unit_link=/etc/systemd/system/multi-user.target.wants/docker-registry.service
if [ -L "$unit_link" ]; then
    sudo_cmd=""
    [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
    $sudo_cmd systemctl disable --quiet docker-registry.service 2>/dev/null || $sudo_cmd rm -f "$unit_link"
fi

if ! command -v cargo >/dev/null 2>&1 && [ ! -x "$HOME/.cargo/bin/cargo" ]; then
    curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal --default-toolchain none
fi
export PATH="$HOME/.cargo/bin:$PATH"
cd "$(dirname "$0")/.."
# Installs the pinned toolchain, its components and the wasm32-wasip2 target.
rustup show active-toolchain >/dev/null
rustup target add wasm32-wasip2 >/dev/null
