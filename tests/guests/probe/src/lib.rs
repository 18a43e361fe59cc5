//! Test guest: imports every capability (world `probe`) and makes exactly the calls its input
//! lists, returning each call's result as JSON in the report summary. The grant, confinement
//! and plan tests drive the real boundary through it; the benchmark uses `fs.read-file-repeat`
//! and the bounds tests `repeat` (any call, many times, with a padded argument).
//!
//! Input: `[{"op": "fs.write-file", "path": "etc/x", "contents": "hi", "mode": 420}, ...]`.
//! Output summary: `[{"ok": <value>} | {"err": {"kind": "denied", "message": "..."}}, ...]`.

// The test world lives in the test package (tests/wit), which uses the shipped interfaces.
wit_bindgen::generate!({
    world: "nodeward:test/probe",
    path: ["../../../wit", "../../wit"],
    // The interfaces come from the shipped package `nodeward:host`: generate them here too.
    generate_all,
});

use nodeward::host::types::{Error, Outcome};
use nodeward::host::{cgroups, download, fs, kernel, log, mounts, network, systemd};
use serde_json::{Value, json};

struct Probe;

fn s<'a>(call: &'a Value, key: &str) -> &'a str {
    call.get(key).and_then(Value::as_str).unwrap_or_default()
}

fn n(call: &Value, key: &str) -> u64 {
    call.get(key).and_then(Value::as_u64).unwrap_or_default()
}

fn outcome(o: Outcome) -> Value {
    json!(match o {
        Outcome::Created => "created",
        Outcome::Changed => "changed",
        Outcome::Unchanged => "unchanged",
        Outcome::Removed => "removed",
    })
}

fn error(e: Error) -> Value {
    let (kind, message) = match e {
        Error::Denied(m) => ("denied", m),
        Error::InvalidArgument(m) => ("invalid-argument", m),
        Error::NotFound(m) => ("not-found", m),
        Error::Escape(m) => ("escape", m),
        Error::Io(m) => ("io", m),
        Error::Failed(m) => ("failed", m),
        Error::Timeout(m) => ("timeout", m),
        Error::Unavailable(m) => ("unavailable", m),
    };
    json!({ "err": { "kind": kind, "message": message } })
}

fn res<T>(r: Result<T, Error>, f: impl FnOnce(T) -> Value) -> Value {
    match r {
        Ok(v) => json!({ "ok": f(v) }),
        Err(e) => error(e),
    }
}

fn kind(k: fs::FileKind) -> &'static str {
    match k {
        fs::FileKind::File => "file",
        fs::FileKind::Directory => "directory",
        fs::FileKind::Symlink => "symlink",
        fs::FileKind::Other => "other",
    }
}

fn call(c: &Value) -> Value {
    let unit = s(c, "unit");
    match s(c, "op") {
        "fs.read-file" => res(fs::read_file(s(c, "path")), |b| {
            json!(String::from_utf8_lossy(&b))
        }),
        "fs.read-file-repeat" => {
            let path = s(c, "path");
            let mut total = 0u64;
            for _ in 0..n(c, "n") {
                match fs::read_file(path) {
                    Ok(b) => total += b.len() as u64,
                    Err(e) => return error(e),
                }
            }
            json!({ "ok": total })
        }
        "fs.write-file" => res(
            fs::write_file(
                s(c, "path"),
                s(c, "contents").as_bytes(),
                n(c, "mode") as u32,
            ),
            outcome,
        ),
        "fs.create-dir" => res(fs::create_dir(s(c, "path"), n(c, "mode") as u32), outcome),
        "fs.remove" => res(fs::remove(s(c, "path")), outcome),
        "fs.remove-all" => res(fs::remove_all(s(c, "path")), outcome),
        "fs.list-dir" => res(fs::list_dir(s(c, "path")), |entries| {
            json!(
                entries
                    .iter()
                    .map(|e| json!({ "name": e.name, "kind": kind(e.kind) }))
                    .collect::<Vec<_>>()
            )
        }),
        "fs.stat" => res(fs::stat(s(c, "path")), |st| match st {
            Some(st) => json!({ "kind": kind(st.kind), "mode": st.mode, "size": st.size }),
            None => Value::Null,
        }),
        "fs.symlink" => res(fs::symlink(s(c, "target"), s(c, "path")), outcome),
        "kernel.load-module" => res(kernel::load_module(s(c, "name")), outcome),
        "kernel.set-sysctl" => res(kernel::set_sysctl(s(c, "key"), s(c, "value")), outcome),
        "kernel.get-sysctl" => res(kernel::get_sysctl(s(c, "key")), |v| json!(v)),
        "kernel.swap-off" => res(kernel::swap_off(), outcome),
        "systemd.write-unit" => res(systemd::write_unit(unit, s(c, "contents")), outcome),
        "systemd.write-drop-in" => res(
            systemd::write_drop_in(unit, s(c, "name"), s(c, "contents")),
            outcome,
        ),
        "systemd.remove-unit" => res(systemd::remove_unit(unit), outcome),
        "systemd.daemon-reload" => res(systemd::daemon_reload(), |()| Value::Null),
        "systemd.enable" => res(systemd::enable(unit), outcome),
        "systemd.disable" => res(systemd::disable(unit), outcome),
        "systemd.start" => res(systemd::start(unit), outcome),
        "systemd.stop" => res(systemd::stop(unit), outcome),
        "systemd.restart" => res(systemd::restart(unit), outcome),
        "systemd.reset-failed" => res(systemd::reset_failed(unit), |()| Value::Null),
        "systemd.mask" => res(systemd::mask(unit), outcome),
        "systemd.unmask" => res(systemd::unmask(unit), outcome),
        "systemd.status" => res(systemd::status(unit), |st| {
            json!({ "load-state": st.load_state, "active-state": st.active_state,
                    "sub-state": st.sub_state, "main-pid": st.main_pid })
        }),
        "mounts.bind" => res(
            mounts::bind(
                s(c, "source"),
                s(c, "target"),
                c["read-only"].as_bool().unwrap_or(false),
            ),
            outcome,
        ),
        "mounts.tmpfs" => res(mounts::tmpfs(s(c, "target"), n(c, "size-bytes")), outcome),
        "mounts.overlay" => {
            let lower: Vec<String> = c["lower"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|v| v.as_str().map(String::from))
                        .collect()
                })
                .unwrap_or_default();
            res(
                mounts::overlay(&lower, s(c, "upper"), s(c, "work"), s(c, "target")),
                outcome,
            )
        }
        "mounts.unmount" => res(
            mounts::unmount(s(c, "target"), c["lazy"].as_bool().unwrap_or(false)),
            outcome,
        ),
        "mounts.is-mounted" => res(mounts::is_mounted(s(c, "target")), |b| json!(b)),
        "download.fetch" => res(
            download::fetch(
                s(c, "url"),
                s(c, "sha256"),
                s(c, "dest"),
                n(c, "mode") as u32,
            ),
            outcome,
        ),
        "download.fetch-and-extract" => res(
            download::fetch_and_extract(
                s(c, "url"),
                s(c, "sha256"),
                s(c, "dest-dir"),
                n(c, "strip-components") as u32,
            ),
            outcome,
        ),
        "network.delete-bridge" => res(network::delete_bridge(s(c, "name")), outcome),
        "cgroups.remove-empty" => res(
            cgroups::remove_empty(s(c, "path")),
            |r| json!({ "removed": r.removed, "kept": r.kept }),
        ),

        "download.fetch-all" => {
            // `requests`: each a `download.fetch` or `download.fetch-and-extract` call object.
            let requests: Vec<download::FetchRequest> = c["requests"]
                .as_array()
                .map(|rs| {
                    rs.iter()
                        .map(|r| match s(r, "op") {
                            "download.fetch-and-extract" => {
                                download::FetchRequest::Archive(download::ArchiveFetch {
                                    url: s(r, "url").into(),
                                    sha256: s(r, "sha256").into(),
                                    dest_dir: s(r, "dest-dir").into(),
                                    strip_components: n(r, "strip-components") as u32,
                                })
                            }
                            _ => download::FetchRequest::File(download::FileFetch {
                                url: s(r, "url").into(),
                                sha256: s(r, "sha256").into(),
                                dest: s(r, "dest").into(),
                                mode: n(r, "mode") as u32,
                            }),
                        })
                        .collect()
                })
                .unwrap_or_default();
            // `repeat-requests`: N, the requests cycled to N entries (a batch far over the
            // limit). With `alias-url`: L as well, every URL is one L-byte string named N times,
            // as a hostile guest may lower a list (its strings may point anywhere in its memory,
            // the same bytes too): lifted, that is L × N bytes in the host.
            let repeat = c.get("repeat-requests").and_then(|v| v.as_u64());
            let alias = c.get("alias-url").and_then(|v| v.as_u64());
            let requests = match (repeat, alias) {
                (Some(count), Some(len)) => return aliased_fetch_all(count, len, &requests),
                (Some(count), None) => requests
                    .iter()
                    .cycle()
                    .take(count as usize)
                    .cloned()
                    .collect(),
                _ => requests,
            };
            res(download::fetch_all(&requests), |results| {
                json!(
                    results
                        .into_iter()
                        .map(|r| res(r, outcome))
                        .collect::<Vec<_>>()
                )
            })
        }
        "log" => {
            log::log(log::Level::Info, s(c, "message"));
            json!({ "ok": null })
        }
        "repeat" => repeat(c),
        other => json!({ "err": { "kind": "probe", "message": format!("unknown op {other}") } }),
    }
}

/// `fetch-all` with `count` file requests whose URLs are all one `len`-byte buffer (the other
/// strings as the first of `template`'s): what no safe guest lowers, and a hostile one can.
#[allow(unsafe_code)]
fn aliased_fetch_all(count: u64, len: u64, template: &[download::FetchRequest]) -> Value {
    let Some(download::FetchRequest::File(first)) = template.first() else {
        return json!({ "err": { "kind": "probe", "message": "alias-url needs a fetch first" } });
    };
    let mut buffer = std::mem::ManuallyDrop::new("x".repeat(len as usize));
    let (ptr, length, capacity) = (buffer.as_mut_ptr(), buffer.len(), buffer.capacity());
    let requests: Vec<download::FetchRequest> = (0..count)
        .map(|_| {
            download::FetchRequest::File(download::FileFetch {
                // SAFETY: none of these strings is ever dropped or written (the list is
                // leaked below); each only lends the one buffer's bytes to the lowering.
                url: unsafe { String::from_raw_parts(ptr, length, capacity) },
                sha256: first.sha256.clone(),
                dest: first.dest.clone(),
                mode: first.mode,
            })
        })
        .collect();
    let requests = std::mem::ManuallyDrop::new(requests);
    res(download::fetch_all(&requests), |results| {
        json!(
            results
                .into_iter()
                .map(|r| res(r, outcome))
                .collect::<Vec<_>>()
        )
    })
}

/// `{"op": "repeat", "n": N, "call": {...}, "pad": {"key": "path", "len": L}}`: makes the
/// inner call `n` times, after padding its string `key` with `x` to `len` bytes (so a test
/// can pass megabyte arguments without megabyte inputs). Returns the count of each result
/// kind: `{"ok": {"ok": 999, "denied": 1}}`. The host-side bounds tests drive it.
fn repeat(c: &Value) -> Value {
    let mut inner = c.get("call").cloned().unwrap_or(Value::Null);
    if let Some(pad) = c.get("pad") {
        let key = s(pad, "key");
        let len = n(pad, "len") as usize;
        // Built in place: the guest holds the padded value once.
        let mut text = String::with_capacity(len);
        text.push_str(s(&inner, key));
        while text.len() < len {
            text.push('x');
        }
        inner[key] = Value::String(text);
    }
    let mut counts = serde_json::Map::new();
    for _ in 0..n(c, "n") {
        let result = call(&inner);
        let kind = match result.pointer("/err/kind").and_then(Value::as_str) {
            Some(k) => k.to_string(),
            None => "ok".to_string(),
        };
        let slot = counts.entry(kind).or_insert(json!(0));
        *slot = json!(slot.as_u64().unwrap_or_default() + 1);
    }
    json!({ "ok": counts })
}

impl exports::nodeward::host::phase::Guest for Probe {
    fn run(input: String) -> Result<exports::nodeward::host::phase::Report, String> {
        let calls: Vec<Value> = serde_json::from_str(&input)
            .map_err(|e| format!("probe input is not a call list: {e}"))?;
        let results: Vec<Value> = calls.iter().map(call).collect();
        Ok(exports::nodeward::host::phase::Report {
            summary: Value::Array(results).to_string(),
            changed: Vec::new(),
        })
    }
}

export!(Probe);
