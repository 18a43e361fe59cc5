//! Files the host itself writes with a secret in them (the bootstrap kubeconfig): written as
//! every file is, recorded without anything derived from their contents.
//!
//! # Background
//! A change list is printed, kept in the audit trail and compared by tests; for a phase's
//! write it carries the file's sha256 and size, and a diff for readable text. For a file that
//! holds a secret the digest is an offline test of a guess (the rest of the file is known from
//! the node config), so the host's own secret files are listed by path, mode and whether
//! they are created or replaced ([`ChangeKind::SecretFile`]) and nothing else.
//!
//! # Guarantees
//! - The same path discipline as [`RootFs::write_file`]: the parent must be a directory as
//!   the run sees it, and no component is followed through a link.
//! - Never changed in place: a file that differs in contents or mode gets a new file renamed
//!   over it ([`durable::write_file`], temp purpose [`TEMP_PURPOSE`]), so a second name linked
//!   to the old file keeps the old bytes and mode; an identical file is `unchanged` and no
//!   change is recorded (a re-run is idempotent).
//! - Plan mode changes nothing on the host: the contents go to the overlay only.

use super::{EntryKind, EntryStat, RootFs, in_the_way, io_error};
use crate::durable;
use crate::hostpath::HostPath;
use crate::plan::{ChangeKind, FileAction, octal};
use crate::wit::{Error, Outcome};

/// The purpose in the temp names of secret files (`.nodeward-tmp.secret.…`), and so the test
/// hook `secret:after-temp-write`.
const TEMP_PURPOSE: &str = "secret";

impl RootFs {
    /// Replaces the file at `path` with `contents` and `mode` for the host (`by` names the
    /// writer in the change list, as a phase's name does), recording a
    /// [`ChangeKind::SecretFile`]: see the module doc. A directory, link or other entry in the
    /// way is an `io` error naming it; a missing parent is `not-found`.
    pub fn write_secret_file(
        &self,
        by: &str,
        path: &HostPath,
        contents: &[u8],
        mode: u32,
    ) -> Result<Outcome, Error> {
        self.require_parent_dir(path)?;
        let action = match self.lstat(path)? {
            None => FileAction::Create,
            Some(EntryStat {
                kind: EntryKind::File,
                mode: old_mode,
                size,
                links,
            }) => {
                // A file of another size differs without being read; one with another name (a
                // hard link) is not read at all but replaced (`RootFs::read` refuses it).
                if links == 1
                    && old_mode == mode
                    && size == contents.len() as u64
                    && self.read(path)? == contents
                {
                    return Ok(Outcome::Unchanged);
                }
                FileAction::Replace
            }
            Some(st) => return Err(in_the_way(path, st.kind)),
        };
        if self.plan_mode() {
            self.plan_file(path, contents, mode)?;
        } else {
            let dir = self.parent_dir(path)?;
            durable::write_file(&dir, path.file_name(), contents, mode, TEMP_PURPOSE)
                .map_err(|e| io_error(path, e))?;
        }
        self.changed(
            by,
            ChangeKind::SecretFile {
                path: path.to_string(),
                mode: octal(mode),
                action,
            },
        );
        Ok(match action {
            FileAction::Create => Outcome::Created,
            FileAction::Replace => Outcome::Changed,
        })
    }
}
