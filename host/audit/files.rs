//! The trail's files as its writer handles them: reading back the last record (and finding a
//! torn one) and rotating.

use super::chain::ACTIVE;
use super::limits;
use super::trail::{TrailError, io_at};
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt as _;
use std::path::Path;

/// `audit.jsonl` becomes `.1`, `.1` becomes `.2` …; the oldest beyond `rotated_files` is
/// removed (the retention boundary); the directory is fsynced.
pub(super) fn rotate(dir: &Path, rotated_files: usize) -> Result<(), TrailError> {
    let name = |n: usize| dir.join(format!("{ACTIVE}.{n}"));
    let oldest = name(rotated_files);
    match std::fs::remove_file(&oldest) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(io_at(&oldest)(e)),
        _ => {}
    }
    for n in (1..rotated_files).rev() {
        match std::fs::rename(name(n), name(n + 1)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(io_at(&name(n))(e)),
            _ => {}
        }
    }
    let active = dir.join(ACTIVE);
    if rotated_files == 0 {
        std::fs::remove_file(&active).map_err(io_at(&active))?;
    } else {
        std::fs::rename(&active, name(1)).map_err(io_at(&active))?;
    }
    crate::durable::open_dir(dir)
        .and_then(|d| crate::durable::fsync_dir(&d))
        .map_err(io_at(dir))
}

/// The last complete line of `file` (`len` bytes) and, when the file does not end in a
/// newline, how many bytes follow that line (a torn record).
pub(super) fn last_line(
    file: &File,
    len: u64,
    path: &Path,
) -> Result<(Option<Vec<u8>>, Option<u64>), TrailError> {
    if len == 0 {
        return Ok((None, None));
    }
    let window = len.min(limits::MAX_LINE_BYTES as u64 * 2);
    let mut buf = vec![0u8; usize::try_from(window).unwrap_or(usize::MAX)];
    file.read_exact_at(&mut buf, len - window)
        .map_err(io_at(path))?;
    let complete = match buf.iter().rposition(|b| *b == b'\n') {
        Some(i) => i,
        None if window == len => return Ok((None, Some(len))),
        None => {
            return Err(TrailError::Tail {
                path: path.to_path_buf(),
                detail: format!("its last {window} bytes hold no line end"),
            });
        }
    };
    let torn = (complete + 1 < buf.len()).then(|| (buf.len() - complete - 1) as u64);
    let body = &buf[..complete];
    let start = body.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
    if start == 0 && window < len {
        return Err(TrailError::Tail {
            path: path.to_path_buf(),
            detail: format!("longer than {} bytes", limits::MAX_LINE_BYTES),
        });
    }
    Ok((Some(body[start..].to_vec()), torn))
}
