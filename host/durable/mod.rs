//! Durable writes: the one way the agent replaces a file, a link or a directory entry so that a
//! crash leaves either the old or the new version, and never garbage that outlives the next run.
//!
//! # Background
//! Every file the agent writes — a phase's `fs.write-file` through [`crate::rootfs`], a
//! downloaded artifact and its cache entry, an extracted archive entry, a node state file, an
//! installed bundle, a compiled component — is replaced the same way: written to a temp file
//! in the target's own directory, given its mode, fsynced, renamed over the target, and then the
//! directory is fsynced ([`write_file`], [`TempFile`]). Links are made under a temp name and
//! renamed over the target the same way ([`replace_symlink`], [`place`]).
//!
//! There used to be five copies of this (and four of the directory fsync, two of the lock),
//! each naming its temp files differently, so nothing could tell a temp file a killed run left
//! from a file someone else put there: a `reset` kept half a tarball in the artifact cache and
//! a temp copy of a node state file (which may hold the bootstrap token). One module means one
//! name scheme, and one name scheme means the leftovers can be found and removed.
//!
//! # The name scheme
//! Every temp entry is named `.nodeward-tmp.<purpose>.<16 hex digits>` ([`temp_name`]), where
//! the purpose says which writer made it (`state`, `write`, `download`, `cache`, `extract`,
//! `link`, `stage`, `compiled`, `history` and `intent` in the bundle store, `audit` for the
//! audit trail's head, `ledger`, `rollout` and `repave` for the daemon's files, `secret` for a
//! file the host renders with a secret in it). Nothing else the agent
//! writes starts with [`TEMP_PREFIX`], so anything that does, in a directory the agent writes,
//! is a leftover of a run that died before its rename.
//!
//! A [`TempFile`] is anonymous while it is being written where the filesystem allows it
//! (`O_TMPFILE`): a run killed mid-write (mid-download) leaves nothing at all, because the
//! kernel frees an unnamed inode with its last descriptor. It gets its scheme name only when it
//! is complete, right before the rename. Where `O_TMPFILE` is not supported it has the scheme
//! name from the start.
//!
//! # What is swept, and when
//! [`sweep`] removes the scheme's entries directly in one directory (never below it, never
//! following a link; a scheme-named directory, which only the bundle store's staging makes, is
//! removed with everything in it, without following links). A [`TempFile`] holds an exclusive
//! `flock` on itself while its writer lives, and the sweep removes a temp file only while it
//! holds that lock itself: a live writer's temp file is never removed, under any lock or none.
//! Links and staging directories carry no such mark, so a directory whose writers make them is
//! swept only under the lock that guards them:
//! - the node lock (`bootstrap`, `upgrade`, `reset`, and `apply`): the node state directory,
//!   the version directories (and their `bin/`, `libexec/`, `libexec/cni/`), the other
//!   directories of the none-mode layout, the artifact cache and the compiled-component cache
//!   (`crate::node::sweep`); `reset` also sweeps the state directory right before removing it;
//! - the bundle store's lock (`phases install`, `rollback`, `rollforward`, `uninstall`): the
//!   store (`crate::bundle::store`), also taken by every run that opens the audit trail when
//!   no store operation holds it;
//! - the downloads directory's lock (`phases install URL`): `<state-dir>/downloads/`, where a
//!   bundle is downloaded before it is read (`crate::bundle::fetch`).
//!
//! The directories of the agent state directory whose writers make only temp files —
//! the directory itself (the daemon's ledger, roll-out record and repave config, which holds
//! the bootstrap token), `audit-heads/`, `compiled/` and `downloads/` ([`STATE_DIRS_OF_FILES`])
//! — are swept without a lock ([`sweep_state_dir`]) by every run that opens the audit trail
//! (so by `reset`), and by the daemon when it starts.
//!
//! # Guarantees
//! - A replaced file is whole: readers see the old contents or the new, never a mix.
//! - After a write returns, the new contents *and* the directory entry survive a power cut.
//! - A writer that fails removes its temp entry; one that is killed leaves at most one
//!   scheme-named entry per file it was replacing, which the next run sweeps.
//!
//! # Caveats
//! - Where `O_TMPFILE` is not supported, a temp file exists under its name for an instant
//!   before its writer locks it; a sweep without the directory's lock that lands in that
//!   instant removes it, and that write fails with an error naming the file (nothing is half
//!   written); running it again succeeds.
//! - Naming an anonymous temp file uses `/proc/self/fd` (or, for a privileged agent,
//!   `AT_EMPTY_PATH`), as `cap-tempfile` does.

use cap_std::fs::Dir;
use std::io::{self, Write};
use std::path::Path;

mod lock;
mod sweep;
mod temp;
#[cfg(test)]
mod tests;

pub use lock::{Lock, LockError};
pub use sweep::{
    STATE_DIRS_OF_FILES, TempDirs, held_by_a_writer, sweep, sweep_path, sweep_state_dir,
};
pub use temp::TempFile;

/// How every temp entry's name starts (see the module doc).
pub const TEMP_PREFIX: &str = ".nodeward-tmp.";

/// A fresh temp name for `purpose`: `.nodeward-tmp.<purpose>.<16 hex digits>`.
pub fn temp_name(purpose: &str) -> String {
    debug_assert!(
        !purpose.is_empty() && !purpose.contains(['/', '.']),
        "purpose {purpose:?}"
    );
    format!("{TEMP_PREFIX}{purpose}.{:016x}", fastrand::u64(..))
}

/// Whether `name` is one of the scheme's temp names.
pub fn is_temp_name(name: &str) -> bool {
    name.starts_with(TEMP_PREFIX)
}

/// Opens the directory at `path` for the writers that are handed a path rather than a
/// directory handle: the agent's own directories (the node state directory, the bundle store,
/// the compiled-component cache), whose paths come from its configuration, never from a phase.
///
/// # Ambient authority
/// Opens `path` in the process's filesystem namespace; callers name only the agent's own
/// directories.
pub fn open_dir(path: &Path) -> io::Result<Dir> {
    Dir::open_ambient_dir(path, cap_std::ambient_authority())
}

/// Makes a directory's entries (a create, rename or unlink in it) durable. The handle may be
/// `O_PATH`, which cannot be fsynced, so the directory is opened again for reading.
pub fn fsync_dir(dir: &Dir) -> io::Result<()> {
    dir.open_with(".", cap_std::fs::OpenOptions::new().read(true))?
        .sync_all()
}

/// Replaces `name` in `dir` with a file holding `contents` with permission bits `mode`:
/// a [`TempFile`] written, given its mode, fsynced, renamed over `name`, and the directory
/// fsynced. `purpose` names the writer in the temp name. Either the old file or the new one is
/// there at every moment; on an error the temp file is removed.
pub fn write_file(
    dir: &Dir,
    name: &str,
    contents: &[u8],
    mode: u32,
    purpose: &'static str,
) -> io::Result<()> {
    let mut tmp = TempFile::new(dir, purpose)?;
    tmp.file.write_all(contents)?;
    tmp.finish(mode)?;
    tmp.persist(name)
}

/// Puts a new entry at `name` in `dir` atomically: `make` creates it under the temp name it is
/// given (a symlink, a hard link), which is then renamed over `name`. A name `make` finds taken
/// is retried with another; on any other error, and when the rename fails, the temp entry is
/// removed. Does not fsync the directory: callers that place several entries fsync it once.
pub fn place(
    dir: &Dir,
    name: &str,
    purpose: &'static str,
    make: impl Fn(&str) -> io::Result<()>,
) -> io::Result<()> {
    let ((), tmp) = create_named(purpose, |candidate| make(candidate))?;
    abort_point(purpose);
    dir.rename(&tmp, dir, name).inspect_err(|_| {
        let _ = dir.remove_file(&tmp);
    })
}

/// Makes `name` in `dir` a symlink to `target`, replacing whatever non-directory is there
/// atomically ([`place`]), then fsyncs the directory.
pub fn replace_symlink(dir: &Dir, target: &str, name: &str) -> io::Result<()> {
    place(dir, name, "link", |tmp| dir.symlink(target, tmp))?;
    fsync_dir(dir)
}

/// Calls `create` with fresh temp names for `purpose` until one is not taken; its result and
/// the name it succeeded with.
fn create_named<T>(
    purpose: &str,
    mut create: impl FnMut(&str) -> io::Result<T>,
) -> io::Result<(T, String)> {
    let mut last = io::Error::other("no temp name tried");
    for _ in 0..16 {
        let name = temp_name(purpose);
        match create(&name) {
            Ok(v) => return Ok((v, name)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => last = e,
            Err(e) => return Err(e),
        }
    }
    Err(last)
}

/// The crash point of the crash-safety tests between a temp entry getting its name and its
/// rename: `<purpose>:after-temp-write` (e.g. `state:after-temp-write`), where a killed run
/// leaves a named temp entry that only the sweep removes. Nothing without the `test-hooks`
/// feature.
fn abort_point(purpose: &str) {
    #[cfg(feature = "test-hooks")]
    crate::test_hooks::abort_at(&format!("{purpose}:after-temp-write"));
    #[cfg(not(feature = "test-hooks"))]
    let _ = purpose;
}
