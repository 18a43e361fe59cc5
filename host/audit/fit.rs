//! [`line`]: one record as the line the trail writes, at most
//! [`limits::MAX_RECORD_LINE_BYTES`] long.
//!
//! # Background
//! [`super::AuditRecord::new`] bounds a call's strings before JSON escaping; escaping can grow a
//! string six times (a control character becomes `\u0001`), and a call has many strings (32
//! list items). A phase must not be able to write large lines and so flush the trail's
//! retention with few calls, so the line is measured as written, and, while it is too long,
//! its guest-controlled text is bounded harder, stage by stage: arguments to 64 bytes and 8
//! items; then the arguments replaced by their size and sha256; then every free-text field to
//! 16 bytes (each bounded value keeps its length and sha256, so it can still be matched).

use super::entry::{Entry, Event};
use super::limits;
use super::redact::{bound_json, bound_text};
use sha2::{Digest, Sha256};

/// `entry` as its line (without the newline), bounded as the module doc says; the entry is
/// left as written.
pub(super) fn line(entry: &mut Entry) -> serde_json::Result<Vec<u8>> {
    let mut line = serde_json::to_vec(entry)?;
    for stage in 1..=3 {
        if line.len() <= limits::MAX_RECORD_LINE_BYTES {
            break;
        }
        shrink(&mut entry.event, stage)?;
        line = serde_json::to_vec(entry)?;
    }
    Ok(line)
}

fn text(s: &mut String, max: usize) {
    if let std::borrow::Cow::Owned(b) = bound_text(s, max) {
        *s = b;
    }
}

fn shrink(event: &mut Event, stage: u8) -> serde_json::Result<()> {
    let (args_bytes, args_items, free) = match stage {
        1 => (64, 8, 256),
        2 => (0, 0, 64),
        _ => (0, 0, 16),
    };
    match event {
        Event::Call {
            phase,
            bundle,
            args,
            outcome,
            ..
        } => {
            if stage == 1 {
                bound_json(args, args_bytes, args_items);
            } else if args.get("omitted").is_none() {
                let json = serde_json::to_vec(args)?;
                *args = serde_json::json!({
                    "omitted": format!(
                        "{} bytes of arguments, sha256 {}",
                        json.len(),
                        hex::encode(Sha256::digest(&json))
                    )
                });
            }
            text(outcome, free);
            if stage == 3 {
                text(phase, free);
                if let Some(b) = bundle {
                    text(&mut b.name, free);
                }
            }
        }
        Event::PhaseEnd {
            phase,
            error,
            bundle,
            ..
        } => {
            if let Some(e) = error {
                text(e, free);
            }
            if stage == 3 {
                text(phase, free);
                if let Some(b) = bundle {
                    text(&mut b.name, free);
                }
            }
        }
        Event::RunEnd { error: Some(e), .. } => text(e, free),
        Event::RunStart { command, root, .. } => {
            text(command, free);
            text(root, free);
        }
        Event::Repair { detail, .. } => text(detail, free),
        Event::CallOverflow { phase, .. } if stage == 3 => text(phase, free),
        Event::Bundle {
            current: Some(b), ..
        } if stage == 3 => text(&mut b.name, free),
        _ => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::entry::{AGENT_VERSION, Mode, ZERO_HASH, now};

    fn call(args: serde_json::Value, outcome: &str) -> Entry {
        Entry {
            seq: 1,
            time: now(),
            prev: ZERO_HASH.into(),
            run_id: "0123456789abcdef".into(),
            agent: AGENT_VERSION.into(),
            event: Event::Call {
                mode: Mode::Apply,
                phase: "p".into(),
                bundle: None,
                component: None,
                call: "mounts.overlay".into(),
                args,
                outcome: outcome.into(),
                denied: true,
                duration_us: 1,
            },
        }
    }

    #[test]
    fn an_escaped_line_is_cut_to_the_cap_and_a_small_one_kept_whole() {
        // What `AuditRecord::new` keeps of hostile arguments: 32 items of 256 control
        // characters each, and a 1 KiB outcome of them, every one escaped to six bytes.
        let nasty = "\u{1}".repeat(limits::MAX_ARG_BYTES);
        let lower: Vec<String> = (0..limits::MAX_ARG_ITEMS).map(|_| nasty.clone()).collect();
        let mut e = call(
            serde_json::json!({"lower": lower, "upper": nasty}),
            &"\u{2}".repeat(limits::MAX_OUTCOME_BYTES),
        );
        assert!(serde_json::to_vec(&e).expect("json").len() > 40 << 10);
        let l = line(&mut e).expect("line");
        assert!(l.len() <= limits::MAX_RECORD_LINE_BYTES, "{}", l.len());
        let back: Entry = serde_json::from_slice(&l).expect("a record");
        assert_eq!(back, e);

        let mut small = call(serde_json::json!({"target": "run/x"}), "ok:done");
        let before = small.clone();
        let l = line(&mut small).expect("line");
        assert_eq!(small, before);
        assert_eq!(l, serde_json::to_vec(&before).expect("json"));
    }
}
