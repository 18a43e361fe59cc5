//! `Port-<n>`: the kubelet's ports are free. Read from the kernel's socket tables
//! (`proc/net/tcp`, `proc/net/tcp6`) rather than by binding, so the check has no side effect
//! and cannot steal a port for an instant from the program that is about to take it.

use super::{Check, Context, Outcome};
use nodeward_node_config::NodeConfig;
use nodeward_node_config::layout::KUBELET_HEALTHZ_PORT;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The kubelet's serving port when `kubelet.config` does not set `port`.
const KUBELET_PORT: u16 = 10250;

/// A port from `kubelet.config`: the field's value, the default when unset, `None` when it is
/// set to something that is no port (the kubelet refuses that config itself) or to 0 (off).
fn port(config: &NodeConfig, field: &str, default: u16) -> Option<u16> {
    match config.kubelet.config.get(field) {
        None => Some(default),
        Some(v) => v
            .as_u64()
            .and_then(|p| u16::try_from(p).ok())
            .filter(|p| *p != 0),
    }
}

pub(super) fn checks(config: &NodeConfig) -> Vec<Check> {
    let mut ports = vec![port(config, "port", KUBELET_PORT)];
    ports.push(port(config, "healthzPort", KUBELET_HEALTHZ_PORT));
    let mut ports: Vec<u16> = ports.into_iter().flatten().collect();
    ports.dedup();
    ports
        .into_iter()
        .map(|p| Check::new(format!("Port-{p}"), move |ctx| free(ctx, p)))
        .collect()
}

/// A listening socket of a `proc/net/tcp{,6}` line on `port`: its address.
fn listening_on(line: &str, port: u16) -> Option<IpAddr> {
    let mut fields = line.split_whitespace();
    let local = fields.nth(1)?;
    let state = fields.nth(1)?;
    // 0A: TCP_LISTEN.
    if state != "0A" {
        return None;
    }
    let (addr, p) = local.split_once(':')?;
    if u16::from_str_radix(p, 16).ok()? != port {
        return None;
    }
    // The kernel prints each 32-bit word of the address in the host's byte order.
    let words: Option<Vec<[u8; 4]>> = (0..addr.len() / 8)
        .map(|i| {
            let w = u32::from_str_radix(addr.get(i * 8..i * 8 + 8)?, 16).ok()?;
            Some(w.to_ne_bytes())
        })
        .collect();
    let bytes: Vec<u8> = words?.concat();
    match bytes.len() {
        4 => Some(IpAddr::V4(Ipv4Addr::new(
            bytes[0], bytes[1], bytes[2], bytes[3],
        ))),
        16 => {
            let b: [u8; 16] = bytes.try_into().ok()?;
            Some(IpAddr::V6(Ipv6Addr::from(b)))
        }
        _ => None,
    }
}

fn free(ctx: &Context<'_>, port: u16) -> Outcome {
    let host = ctx.host();
    let mut read = Vec::new();
    let mut held = Vec::new();
    for file in ["tcp", "tcp6"] {
        match host.proc_net(file) {
            Ok((path, Some(text))) => {
                held.extend(
                    text.lines()
                        .skip(1)
                        .filter_map(|l| listening_on(l, port))
                        .map(|a| format!("{a} ({path})")),
                );
                read.push(path);
            }
            Ok((_, None)) => {}
            Err(e) => return Outcome::fail(e),
        }
    }
    if read.is_empty() {
        return Outcome::skip("proc/net/tcp and proc/net/tcp6 not found beneath the root");
    }
    if held.is_empty() {
        return Outcome::pass(format!("port {port} is free ({})", read.join(", ")));
    }
    if ctx.own_node {
        return Outcome::pass(format!(
            "port {port} is in use ({}): a nodeward node is installed here, so by its kubelet",
            held.join(", ")
        ));
    }
    Outcome::fail(format!(
        "port {port} is in use, listening on {}: the kubelet needs it; stop what holds it (`ss -ltnp 'sport = :{port}'` shows which program)",
        held.join(", ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listening_sockets_are_read_from_the_kernels_table() {
        // A line of proc/net/tcp on a little-endian host: 127.0.0.1:10250, LISTEN.
        let v4 = "   0: 0100007F:280A 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 12345 1 0000000000000000 100 0 0 10 0";
        if cfg!(target_endian = "little") {
            assert_eq!(
                listening_on(v4, 10250),
                Some(IpAddr::V4(Ipv4Addr::LOCALHOST))
            );
        }
        assert_eq!(listening_on(v4, 10248), None);
        let established = v4.replace(" 0A ", " 01 ");
        assert_eq!(listening_on(&established, 10250), None);
        let v6 = "   1: 00000000000000000000000000000000:280A 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0 100 0 0 10 0";
        assert_eq!(
            listening_on(v6, 10250),
            Some(IpAddr::V6(Ipv6Addr::UNSPECIFIED))
        );
    }
}
