//! The fleet: N real daemon loops (`nodeward::daemon::watch::run`, over the real `KubeApi`)
//! in this one process, each with its own Machine, kubeconfig (its own node identity), ledger
//! and metrics, and a [`StandIn`] node; and what the bench sees of them from the client side:
//! the requests they send, the watches the server answers, the failed attempts they log, and
//! the process's CPU time and memory.
//!
//! # Background
//! The agents share one thread (a current-thread tokio runtime, as each daemon has its own),
//! so the process's CPU time divided by N is what one daemon's loop costs. Each agent runs
//! inside a tracing span `agent{index}`, so [`AgentLayer`] knows whose the rest is: kube's
//! client opens a span `HTTP` per request (its URL; the status recorded when the response
//! starts), and the loop logs one warning per failed attempt ("watch failed; backing off",
//! naming the watch, and "reconcile failed; backing off"). Failed attempts never reach the
//! API server's audit log while it is down. Whether an agent watches again is judged here
//! too, from the watch requests it sent and the failures that followed: the v1.20 server
//! sends a quiet watch's response (and logs its audit event ResponseStarted) only with its
//! first event, so neither the client nor the audit log sees a quiet watch start; the audit
//! log has every watch once it ends.
//!
//! # Caveats
//! The warnings are matched by their text in `host/daemon/watch.rs`: the bench says so when
//! an outage produced none.
//!
//! The loops end as a daemon does under systemd: on SIGTERM, which the bench sends itself.

use crate::standin::{Passes, StandIn};
use nodeward::daemon::ledger::FileLedger;
use nodeward::daemon::metrics::Metrics;
use nodeward::daemon::notify::Notifier;
use nodeward::daemon::watch::{self, Exit, Settings};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime};
use tracing::Instrument as _;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;

/// The Machine (and node) name of agent `i`.
pub fn name(i: usize) -> String {
    format!("fleet-{i:03}")
}

/// Agent `i`'s index from the user name its certificate gives it (`system:node:fleet-007`).
pub fn index_of_user(user: &str) -> Option<usize> {
    user.strip_prefix("system:node:fleet-")?.parse().ok()
}

/// The two resources each agent watches, as the loop's warnings and the URLs name them.
pub const WATCHED: [&str; 2] = ["machines", "machineoperations"];

/// Which of [`WATCHED`] a watch URL or a warning's `watch` field names.
fn resource_of(text: &str) -> usize {
    usize::from(text.contains("machineoperations"))
}

/// Whole seconds since the epoch.
fn epoch_second(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// What the agents did, as their own tracing shows it (see the module docs).
#[derive(Default)]
pub struct Observed {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    /// Per agent: failed watch attempts, failed passes.
    failures: BTreeMap<usize, [u64; 2]>,
    /// Failed attempts (both kinds, all agents) per unix second.
    failures_per_second: BTreeMap<u64, u64>,
    /// The last failed watch attempt of each agent and resource.
    last_watch_failure: BTreeMap<(usize, usize), SystemTime>,
    /// Each watch request sent: agent, resource, when.
    watches_sent: Vec<(usize, usize, SystemTime)>,
    /// Requests sent (all agents) per unix second: watches, others.
    sent_per_second: BTreeMap<u64, [u64; 2]>,
}

impl Observed {
    fn with<T>(&self, f: impl FnOnce(&mut Inner) -> T) -> T {
        f(&mut self.inner.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Every agent's `[failed watch attempts, failed passes]` so far.
    pub fn failures(&self) -> BTreeMap<usize, [u64; 2]> {
        self.with(|i| i.failures.clone())
    }

    /// Failed attempts so far, all agents, per unix second.
    pub fn failures_per_second(&self) -> BTreeMap<u64, u64> {
        self.with(|i| i.failures_per_second.clone())
    }

    /// Requests the agents sent within `[from, to)` (whole seconds): `[watches, others]`.
    pub fn sent(&self, from: SystemTime, to: SystemTime) -> [u64; 2] {
        self.with(|i| {
            i.sent_per_second
                .range(epoch_second(from)..epoch_second(to))
                .fold([0, 0], |acc, (_, c)| [acc[0] + c[0], acc[1] + c[1]])
        })
    }

    /// The watch requests sent within `[from, to)`, per unix second.
    pub fn watches_sent_per_second(&self, from: SystemTime, to: SystemTime) -> BTreeMap<u64, u64> {
        self.with(|i| {
            i.sent_per_second
                .range(epoch_second(from)..epoch_second(to))
                .map(|(s, c)| (*s, c[0]))
                .collect()
        })
    }

    /// When each of `n` agents watched both resources again after `after`, judged at `now`:
    /// for each resource, the first watch request sent after both `after` and that watch's
    /// last failure, once it has gone [`SETTLED`] without failing (a refused connection or a
    /// `410 Gone` fails within milliseconds); the later of the two. `None` for an agent not
    /// yet watching both.
    pub fn watching_since(
        &self,
        n: usize,
        after: SystemTime,
        now: SystemTime,
    ) -> Vec<Option<SystemTime>> {
        self.with(|i| {
            (0..n)
                .map(|agent| {
                    let mut latest = after;
                    for resource in 0..WATCHED.len() {
                        let floor = i
                            .last_watch_failure
                            .get(&(agent, resource))
                            .map_or(after, |f| (*f).max(after));
                        let start = i
                            .watches_sent
                            .iter()
                            .filter(|(a, r, t)| *a == agent && *r == resource && *t >= floor)
                            .map(|(_, _, t)| *t)
                            .min()
                            .filter(|t| now.duration_since(*t).unwrap_or_default() >= SETTLED)?;
                        latest = latest.max(start);
                    }
                    Some(latest)
                })
                .collect()
        })
    }

    fn failed(&self, agent: usize, watch: Option<usize>) {
        let now = SystemTime::now();
        self.with(|i| {
            i.failures.entry(agent).or_default()[usize::from(watch.is_none())] += 1;
            *i.failures_per_second.entry(epoch_second(now)).or_default() += 1;
            if let Some(resource) = watch {
                i.last_watch_failure.insert((agent, resource), now);
            }
        });
    }

    fn record_sent(&self, agent: usize, watch: Option<usize>) {
        let now = SystemTime::now();
        self.with(|i| {
            i.sent_per_second.entry(epoch_second(now)).or_default()
                [usize::from(watch.is_none())] += 1;
            if let Some(resource) = watch {
                i.watches_sent.push((agent, resource, now));
            }
        });
    }
}

/// How long a watch request must go without failing to count as a working watch (the server
/// sends a quiet watch's response headers only with its first event, so the client cannot wait
/// for them).
const SETTLED: Duration = Duration::from_secs(3);

/// The agent index a span `agent{index}` carries.
struct AgentIndex(usize);

/// The fields the layer reads: `index` (agent spans), `http.url` (request spans), and an
/// event's `message` and `watch`.
#[derive(Default)]
struct Fields {
    index: Option<u64>,
    url: Option<String>,
    message: Option<String>,
    watch: Option<String>,
}

impl Visit for Fields {
    fn record_u64(&mut self, field: &Field, value: u64) {
        if field.name() == "index" {
            self.index = Some(value);
        }
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        if let Ok(v) = u64::try_from(value) {
            self.record_u64(field, v);
        }
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.record_debug(field, &value);
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        let text = || format!("{value:?}").trim_matches('"').to_string();
        match field.name() {
            "http.url" => self.url = Some(text()),
            "message" => self.message = Some(text()),
            "watch" => self.watch = Some(text()),
            _ => {}
        }
    }
}

/// Feeds [`Observed`] from the agents' spans and warnings (see the module docs).
pub struct AgentLayer(pub Arc<Observed>);

impl AgentLayer {
    /// Whether the layer needs `metadata`: the agent spans, kube's request spans and the
    /// warnings; everything else stays disabled, so it costs the agents nothing.
    pub fn wants(metadata: &tracing::Metadata<'_>) -> bool {
        (metadata.is_span() && matches!(metadata.name(), "agent" | "HTTP"))
            || (metadata.is_event() && *metadata.level() == tracing::Level::WARN)
    }
}

impl<S> Layer<S> for AgentLayer
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let mut fields = Fields::default();
        attrs.record(&mut fields);
        match attrs.metadata().name() {
            "agent" => {
                if let Some(i) = fields.index {
                    span.extensions_mut().insert(AgentIndex(i as usize));
                }
            }
            "HTTP" => {
                let agent = span
                    .scope()
                    .find_map(|s| s.extensions().get::<AgentIndex>().map(|a| a.0));
                let (Some(agent), Some(url)) = (agent, fields.url) else {
                    return;
                };
                let watch = url.contains("watch=true").then(|| resource_of(&url));
                self.0.record_sent(agent, watch);
            }
            _ => {}
        }
    }

    fn on_event(&self, event: &tracing::Event<'_>, ctx: Context<'_, S>) {
        let mut fields = Fields::default();
        event.record(&mut fields);
        let watch = match fields.message.as_deref() {
            Some("watch failed; backing off") => {
                Some(resource_of(fields.watch.as_deref().unwrap_or("")))
            }
            Some("reconcile failed; backing off") => None,
            _ => return,
        };
        let agent = ctx.event_scope(event).and_then(|scope| {
            scope
                .into_iter()
                .find_map(|span| span.extensions().get::<AgentIndex>().map(|a| a.0))
        });
        if let Some(agent) = agent {
            self.0.failed(agent, watch);
        }
    }
}

/// The running fleet.
pub struct Fleet {
    thread: Option<JoinHandle<Vec<Result<Exit, String>>>>,
    /// Every pass of every agent's stand-in node.
    pub passes: Passes,
}

/// Starts one agent per `(index, kubeconfig)` on one new thread, all at once, each with its
/// own ledger beneath `state`.
pub fn start(agents: Vec<(usize, PathBuf)>, state: PathBuf) -> Fleet {
    let passes = Passes::default();
    let shared = passes.clone();
    let thread = std::thread::Builder::new()
        .name("fleet".into())
        .spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("the agents' runtime");
            let local = tokio::task::LocalSet::new();
            let handles: Vec<_> = agents
                .into_iter()
                .map(|(index, kubeconfig)| {
                    let passes = shared.clone();
                    let ledger_dir = state.join(name(index));
                    local.spawn_local(
                        async move {
                            let settings = Settings {
                                machine: name(index),
                                kubeconfig,
                                resume_journal: false,
                            };
                            let node = StandIn {
                                agent: index,
                                passes,
                            };
                            watch::run(
                                &settings,
                                &node,
                                &FileLedger::new(&ledger_dir),
                                &Notifier::default(),
                                &Metrics::new(),
                            )
                            .await
                            .map_err(|e| e.to_string())
                        }
                        .instrument(tracing::info_span!("agent", index = index as u64)),
                    )
                })
                .collect();
            runtime.block_on(local.run_until(async move {
                let mut exits = Vec::new();
                for h in handles {
                    exits.push(
                        h.await
                            .unwrap_or_else(|e| Err(format!("the agent panicked: {e}"))),
                    );
                }
                exits
            }))
        })
        .expect("the fleet's thread");
    Fleet {
        thread: Some(thread),
        passes,
    }
}

impl Fleet {
    /// Sends this process SIGTERM (every agent's loop handles it as systemd's stop) and waits
    /// at most `timeout` for the loops to end; how each ended, or `None` past the timeout.
    pub fn stop(mut self, timeout: Duration) -> Option<Vec<Result<Exit, String>>> {
        rustix::process::kill_process(rustix::process::getpid(), rustix::process::Signal::TERM)
            .expect("SIGTERM to this process");
        let thread = self.thread.take()?;
        let deadline = std::time::Instant::now() + timeout;
        while !thread.is_finished() {
            if std::time::Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        thread.join().ok()
    }
}

/// This process's CPU time (user + system, all threads) from `/proc/self/stat`, in ms.
pub fn cpu_ms() -> u64 {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("/proc/self/stat");
    // Fields after the command name, which is in parentheses and may hold spaces: state is
    // field 3, utime 14, stime 15 (proc(5)).
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| -> u64 {
        fields
            .get(i)
            .and_then(|f| f.parse().ok())
            .unwrap_or_else(|| panic!("/proc/self/stat field {}: {stat}", i + 3))
    };
    // utime and stime are in USER_HZ, which the kernel fixes at 100 for /proc on every
    // architecture nodeward builds for.
    (ticks(11) + ticks(12)) * 10
}

/// This process's resident memory (`VmRSS` of `/proc/self/status`), in KiB.
pub fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}
