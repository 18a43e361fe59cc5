//! The fleet's requests as the API server saw them: its audit log
//! (`NODEWARD_CLUSTER_AUDIT=1` of `scripts/kube-cluster-start.sh`: Metadata level, one JSON
//! event per line, the stage RequestReceived left out).
//!
//! # Background
//! A request has one event when its response starts (watches) and one when it completes; both
//! carry its `auditID`, the time the server received it and, once known, the response code.
//! [`read`] folds them into one [`Request`] each. The user name says which agent asked
//! (`system:node:fleet-NNN`, its certificate's subject); other users (the bench's admin, the
//! controller-manager) are left out.
//!
//! # Caveats
//! The v1.20 server logs a watch's ResponseStarted only with its first event, so a quiet
//! watch appears once it ends (its timeout, or the client gone): read the log after the
//! agents have stopped to have every watch. A watch that fails at once (a `410 Gone` for a
//! `resourceVersion` older than the restarted server's cache, sent as an error event) still
//! answers `200`; [`Request::lasted`] tells it apart.

use serde_json::Value;
use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, SystemTime};

/// One request of one agent.
#[derive(Clone, Debug)]
pub struct Request {
    /// Which agent asked.
    pub agent: usize,
    /// `get`, `list`, `watch`, `update`, …
    pub verb: String,
    /// `machines`, `machines/status`, `machineoperations`, …
    pub resource: String,
    /// When the server received it.
    pub received: SystemTime,
    /// The response's code, once the response started.
    pub code: Option<u16>,
    /// When its response completed (a watch: when it ended), if it has.
    pub completed: Option<SystemTime>,
}

impl Request {
    /// How long it took (a watch: how long it stayed open), once it completed.
    pub fn lasted(&self) -> Option<Duration> {
        self.completed?.duration_since(self.received).ok()
    }
}

fn time(v: &Value) -> Option<SystemTime> {
    humantime::parse_rfc3339_weak(v.as_str()?).ok()
}

/// Every request of the fleet's agents in the audit log at `path`, in the order received.
/// Lines that do not parse (the last one, while the server writes it) are skipped.
pub fn read(path: &Path) -> Vec<Request> {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("the audit log {}: {e}", path.display()));
    let mut requests: Vec<Request> = Vec::new();
    let mut by_id: HashMap<String, usize> = HashMap::new();
    for line in text.lines() {
        let Ok(event) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        let Some(agent) = event["user"]["username"]
            .as_str()
            .and_then(crate::agents::index_of_user)
        else {
            continue;
        };
        let (Some(id), Some(received)) = (
            event["auditID"].as_str(),
            time(&event["requestReceivedTimestamp"]),
        ) else {
            continue;
        };
        let code = event["responseStatus"]["code"]
            .as_u64()
            .and_then(|c| u16::try_from(c).ok());
        let completed = (event["stage"] == "ResponseComplete")
            .then(|| time(&event["stageTimestamp"]))
            .flatten();
        match by_id.get(id) {
            Some(&i) => {
                let r = &mut requests[i];
                r.code = r.code.or(code);
                r.completed = r.completed.or(completed);
            }
            None => {
                let object = &event["objectRef"];
                let mut resource = object["resource"].as_str().unwrap_or("").to_string();
                if let Some(sub) = object["subresource"].as_str() {
                    resource = format!("{resource}/{sub}");
                }
                by_id.insert(id.to_string(), requests.len());
                requests.push(Request {
                    agent,
                    verb: event["verb"].as_str().unwrap_or("").to_string(),
                    resource,
                    received,
                    code,
                    completed,
                });
            }
        }
    }
    requests.sort_by_key(|r| r.received);
    requests
}

/// The requests received within `[from, to)`.
pub fn within(requests: &[Request], from: SystemTime, to: SystemTime) -> Vec<&Request> {
    requests
        .iter()
        .filter(|r| r.received >= from && r.received < to)
        .collect()
}
