//! The bound on every human-readable message the daemon writes to a status.
//!
//! # Background
//! A message often carries an error's text, and an error's text can carry what a remote party
//! sent (an HTTP body, a phase's report). Written to a status unbounded, it would grow the
//! object in etcd (1.5 MiB per object) and every watch event of every node. So a message is
//! capped at [`MAX_MESSAGE_BYTES`] when it is built, and the schema refuses a longer one
//! (`maxLength`), so a writer that forgets the cap is refused by the API server instead of
//! bloating the object.
//!
//! # Guarantees
//! - [`cap_message`] returns at most [`MAX_MESSAGE_BYTES`] bytes of valid UTF-8, cut on a
//!   character boundary; a cut message ends with [`TRUNCATION_MARKER`], so a reader can tell.
//! - A message within the bound is returned unchanged.

/// The most bytes a status message may have (1 KiB). The schema's `maxLength` counts
/// characters, which are never fewer than bytes, so a capped message always passes it.
pub const MAX_MESSAGE_BYTES: usize = 1024;

/// What ends a message that was cut.
pub const TRUNCATION_MARKER: &str = "…";

/// `message`, cut to at most [`MAX_MESSAGE_BYTES`] bytes on a character boundary and then
/// ending with [`TRUNCATION_MARKER`]; unchanged when it fits.
pub fn cap_message(message: &str) -> String {
    if message.len() <= MAX_MESSAGE_BYTES {
        return message.to_string();
    }
    let end = message.floor_char_boundary(MAX_MESSAGE_BYTES - TRUNCATION_MARKER.len());
    let mut out = String::with_capacity(end + TRUNCATION_MARKER.len());
    out.push_str(&message[..end]);
    out.push_str(TRUNCATION_MARKER);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_message_is_unchanged() {
        assert_eq!(cap_message(""), "");
        assert_eq!(cap_message("kubelet restarted"), "kubelet restarted");
        let exact = "x".repeat(MAX_MESSAGE_BYTES);
        assert_eq!(cap_message(&exact), exact);
    }

    #[test]
    fn long_message_is_cut_with_a_marker() {
        let long = "y".repeat(MAX_MESSAGE_BYTES + 1);
        let capped = cap_message(&long);
        assert!(capped.len() <= MAX_MESSAGE_BYTES, "{}", capped.len());
        assert!(capped.ends_with(TRUNCATION_MARKER));
        let kept = capped.strip_suffix(TRUNCATION_MARKER).expect("marker");
        assert_eq!(
            kept,
            "y".repeat(MAX_MESSAGE_BYTES - TRUNCATION_MARKER.len())
        );
    }

    #[test]
    fn cut_falls_on_a_character_boundary() {
        // Four-byte characters: no multiple of four lands exactly on the cut point, so the
        // cut must step back to the previous whole character.
        for prefix in 0..4 {
            let long = format!("{}{}", "a".repeat(prefix), "🦀".repeat(MAX_MESSAGE_BYTES));
            let capped = cap_message(&long);
            assert!(capped.len() <= MAX_MESSAGE_BYTES, "{}", capped.len());
            assert!(capped.len() > MAX_MESSAGE_BYTES - TRUNCATION_MARKER.len() - 4);
            let kept = capped.strip_suffix(TRUNCATION_MARKER).expect("marker");
            assert!(long.starts_with(kept));
            assert!(kept.ends_with('🦀'));
        }
    }
}
