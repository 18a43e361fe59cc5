//! `spec.config.configMapRef`: the node config document a Machine names by ConfigMap, read
//! before each pass.
//!
//! # Background
//! A Machine may hold its node config inline or name a ConfigMap key holding it, so one
//! document can serve many Machines. The modes resolve a spec without talking to the API
//! server ([`crate::daemon::resolve`] is pure), so the pass reads the ConfigMap first and hands
//! the mode the Machine as if its config were inline ([`read`]). A ConfigMap is readable by
//! every node (`deploy/rbac.yaml`), so, as inline, its bootstrap token must be the reference
//! `nodeward-secret:bootstrap-token`: a document holding a real token is refused
//! (`ConfigInvalid`), never used, and never echoed.
//!
//! The daemon does not watch ConfigMaps (nodes may only `get` them): a change to the
//! document is applied at the next pass — any change to the Machine, an operation, or the
//! resync. `docs/daemon.md` recommends a new ConfigMap per change, named by the Machine.
//!
//! # Guarantees
//! - An unreachable API server or revoked credentials fail the pass (the loop backs off or
//!   restarts), as any other request; a missing ConfigMap or key, a refusal (403) or a document
//!   that does not parse is [`Unresolved`], reported as `ConfigUnreadable`/`ConfigInvalid`
//!   with the ConfigMap's namespace, name and key, and nothing on the node changes.
//! - The API server caps a ConfigMap at 1 MiB, which bounds what is parsed here.

use crate::daemon::reconcile::{ApiError, MachineApi};
use crate::daemon::resolve::Unresolved;
use crate::daemon::status::{Outcome, Update};
use nodeward_api::Machine;
use nodeward_api::machine::{ConfigMapKeyRef, ConfigSource};

/// `machine` with the ConfigMap its spec names read into `spec.config.inline`, and why it
/// could not be, if it could not (then `machine` is returned as it was: its mode reports
/// the reference unread, and [`explain`] says why).
pub async fn read(
    api: &impl MachineApi,
    mut machine: Machine,
) -> Result<(Machine, Option<Unresolved>), ApiError> {
    let Some(ConfigSource::ConfigMapRef(r)) = &machine.spec.config else {
        return Ok((machine, None));
    };
    let r = r.clone();
    let at = describe(&r);
    let config_map = match api.config_map(&r.namespace, &r.name).await {
        Ok(found) => found,
        Err(e @ (ApiError::Unreachable(_) | ApiError::Unauthorized(_))) => return Err(e),
        Err(e) => return Ok((machine, Some(Unresolved::Unreadable(format!("{at}: {e}"))))),
    };
    let Some(config_map) = config_map else {
        let why = format!("{at}: no such ConfigMap");
        return Ok((machine, Some(Unresolved::Unreadable(why))));
    };
    let Some(document) = config_map.data.as_ref().and_then(|d| d.get(&r.key)) else {
        let why = format!("{at}: the ConfigMap has no key {:?} in its data", r.key);
        return Ok((machine, Some(Unresolved::Unreadable(why))));
    };
    match crate::config::parse_shared(document, &at) {
        Ok(config) => {
            machine.spec.config = Some(ConfigSource::Inline(Box::new(config)));
            Ok((machine, None))
        }
        Err(e) => Ok((machine, Some(Unresolved::Invalid(e.to_string())))),
    }
}

/// `outcome` with the reason the ConfigMap could not be used in place of the mode's "not
/// read" (the mode saw only the reference); an outcome that says something else (an upgrade
/// running or failed) is kept as it is.
pub fn explain(outcome: Outcome, unread: Option<&Unresolved>) -> Outcome {
    match (unread, &outcome.update) {
        (Some(u), Update::ConfigUnreadable(_)) => Outcome {
            update: match u {
                Unresolved::Unreadable(m) => Update::ConfigUnreadable(m.clone()),
                Unresolved::Invalid(m) => Update::ConfigInvalid(m.clone()),
            },
            repave: None,
            ..outcome
        },
        _ => outcome,
    }
}

/// How errors name the reference: `ConfigMap NAMESPACE/NAME key KEY`.
pub fn describe(r: &ConfigMapKeyRef) -> String {
    format!("ConfigMap {}/{} key {}", r.namespace, r.name, r.key)
}
