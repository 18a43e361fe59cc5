//! The trail's files as its writer handles them: where the log starts ([`first_seq`]) and
//! rotation ([`rotate`]), which moves the head's floor when it drops the oldest file.
//!
//! # Expected flow of a rotation
//! 1. The active file is fsynced (its last record is the head's from now on).
//! 2. When the oldest slot is taken, the floor it will move to (the first `seq` of the file
//!    that becomes the oldest) is written into the head as `pendingFloor`.
//! 3. `audit.jsonl.N` is removed, `.k` renamed to `.k+1`, `audit.jsonl` to `.1`, and the
//!    directory fsynced.
//! 4. The head is written with the new floor.
//!
//! A crash between 2 and 4 leaves a log that starts at the old floor or the pending one; both
//! verify.

use super::chain::{ACTIVE, file_names};
use super::dir::{FileMode, TrailDir};
use super::head::Head;
use super::lines::first_line;
use super::trail::{TrailError, io_at};
use std::fs::File;
use std::io;

/// The `seq` of the first record of the file `name` in `dir`; `None` when it holds none.
pub(super) fn seq_at_start(dir: &TrailDir, name: &str) -> Result<Option<u64>, TrailError> {
    let path = dir.join(name);
    let file = match dir.file(name, FileMode::Read) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_at(&path)(e)),
    };
    let Some(line) = first_line(&file, &path)? else {
        return Ok(None);
    };
    seq_of(&line).map(Some).ok_or_else(|| TrailError::Tail {
        path,
        detail: "its first line has no seq".into(),
    })
}

/// The `seq` of a record's line.
pub(super) fn seq_of(line: &[u8]) -> Option<u64> {
    serde_json::from_slice::<serde_json::Value>(line)
        .ok()?
        .get("seq")?
        .as_u64()
}

/// The first `seq` the log in `dir` holds (its oldest file's first record); `None` when empty.
pub(super) fn first_seq(dir: &TrailDir) -> Result<Option<u64>, TrailError> {
    for name in file_names(dir).map_err(io_at(dir.path()))? {
        if let Some(seq) = seq_at_start(dir, &name)? {
            return Ok(Some(seq));
        }
    }
    Ok(None)
}

/// Rotates the files (see the module doc): `active` is the active file, `head` the head as it
/// stands (naming the active file's last record) and `head_path` where it is kept. At least one
/// rotated file is kept, so the head's record always is.
pub(super) fn rotate(
    dir: &TrailDir,
    rotated_files: usize,
    active: &File,
    mut head: Head,
    head_path: &std::path::Path,
) -> Result<(), TrailError> {
    let n = rotated_files.max(1);
    let name = |k: usize| format!("{ACTIVE}.{k}");
    active.sync_all().map_err(io_at(&dir.join(ACTIVE)))?;
    let drops = dir.file(&name(n), FileMode::Read).is_ok();
    if drops {
        let next = if n == 1 {
            ACTIVE.to_string()
        } else {
            name(n - 1)
        };
        if let Some(floor) = seq_at_start(dir, &next)? {
            head.pending_floor = Some(floor);
            head.write(head_path)?;
        }
    }
    if dir.remove(&name(n)).map_err(io_at(&dir.join(&name(n))))? {
        tracing::info!(
            target: "nodeward::audit",
            "{}: dropped the oldest audit file (retention)",
            dir.join(&name(n)).display()
        );
    }
    for k in (1..n).rev() {
        match dir.rename(&name(k), &name(k + 1)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => {
                return Err(io_at(&dir.join(&name(k)))(e));
            }
            _ => {}
        }
    }
    dir.rename(ACTIVE, &name(1))
        .map_err(io_at(&dir.join(ACTIVE)))?;
    dir.fsync().map_err(io_at(dir.path()))?;
    if let Some(floor) = head.pending_floor.take() {
        head.floor = floor;
        head.write(head_path)?;
    }
    Ok(())
}
