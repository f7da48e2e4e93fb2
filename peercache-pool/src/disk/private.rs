//! Keeping the disk tier private to the user the node runs as: folders `0700`, segment files
//! `0600`, and no folder someone else controls.
//!
//! Pages on disk are KV cache contents (model activations of users' prompts), so the tier
//! refuses a folder owned by another user or writable by others — such a folder could be
//! pre-filled with forged segments that the node would index and re-publish to the cluster —
//! and a parent folder that another user could rename it out of (writable by others without
//! the sticky bit, or owned by another user than this one or root).

use std::fs::{self, DirBuilder, OpenOptions};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// Mode of the folders the tier creates.
pub(crate) const FOLDER_MODE: u32 = 0o700;
/// Mode of the segment files the tier creates.
pub(crate) const FILE_MODE: u32 = 0o600;

/// Why a disk tier folder is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UnsafeFolder {
    /// Another user owns it.
    #[error("owned by uid {owner}, not by this process's uid {me}")]
    ForeignOwner {
        /// The folder's owner.
        owner: u32,
        /// This process's effective uid.
        me: u32,
    },
    /// Group or other users may write into it.
    #[error("writable by group or others (mode {mode:o})")]
    Writable {
        /// The folder's permission bits.
        mode: u32,
    },
    /// Its parent lets another user replace it (writable by others without the sticky bit, or
    /// owned by another user than this one or root).
    #[error("its parent folder {parent} lets other users replace it (mode {mode:o}, uid {owner})")]
    ReplaceableParent {
        /// The parent folder.
        parent: String,
        /// Its permission bits.
        mode: u32,
        /// Its owner.
        owner: u32,
    },
    /// It is not a folder.
    #[error("not a folder")]
    NotAFolder,
}

fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// Creates `dir` (and missing parents) with mode `0700`, then checks that it and its parent
/// are safe; an existing folder of ours with looser read bits is tightened to `0700`.
pub(crate) fn prepare_folder(dir: &Path) -> Result<Result<(), UnsafeFolder>, std::io::Error> {
    DirBuilder::new()
        .recursive(true)
        .mode(FOLDER_MODE)
        .create(dir)?;
    let meta = fs::symlink_metadata(dir)?;
    if let Err(why) = check(&meta, euid()) {
        return Ok(Err(why));
    }
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        let pm = fs::metadata(parent)?;
        let (mode, owner) = (pm.mode() & 0o7777, pm.uid());
        let others_write = mode & 0o022 != 0 && mode & 0o1000 == 0;
        if others_write || (owner != euid() && owner != 0) {
            return Ok(Err(UnsafeFolder::ReplaceableParent {
                parent: parent.display().to_string(),
                mode,
                owner,
            }));
        }
    }
    if meta.mode() & 0o777 != FOLDER_MODE {
        fs::set_permissions(dir, fs::Permissions::from_mode(FOLDER_MODE))?;
    }
    Ok(Ok(()))
}

/// The rule for the tier's own folder: a real folder (not a link), ours, not writable by others.
fn check(meta: &fs::Metadata, me: u32) -> Result<(), UnsafeFolder> {
    if !meta.is_dir() {
        return Err(UnsafeFolder::NotAFolder);
    }
    if meta.uid() != me {
        return Err(UnsafeFolder::ForeignOwner {
            owner: meta.uid(),
            me,
        });
    }
    let mode = meta.mode() & 0o7777;
    if mode & 0o022 != 0 {
        return Err(UnsafeFolder::Writable { mode });
    }
    Ok(())
}

/// Options for a new segment file: created `0600`.
pub(crate) fn segment_options() -> OpenOptions {
    let mut o = OpenOptions::new();
    o.mode(FILE_MODE);
    o
}

/// Tightens a segment file left by an older version to `0600`.
pub(crate) fn tighten_file(path: &Path) -> std::io::Result<()> {
    let m = fs::metadata(path)?;
    if m.mode() & 0o077 != 0 {
        fs::set_permissions(path, fs::Permissions::from_mode(FILE_MODE))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::chown;

    #[test]
    fn created_folders_are_private_and_loose_ones_of_ours_are_tightened() {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("a/b");
        prepare_folder(&dir).unwrap().unwrap();
        assert_eq!(fs::metadata(&dir).unwrap().mode() & 0o777, 0o700);
        assert_eq!(
            fs::metadata(t.path().join("a")).unwrap().mode() & 0o777,
            0o700
        );
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
        prepare_folder(&dir).unwrap().unwrap();
        assert_eq!(fs::metadata(&dir).unwrap().mode() & 0o777, 0o700);
    }

    #[test]
    fn a_folder_writable_by_others_or_owned_by_another_user_is_refused() {
        let t = tempfile::tempdir().unwrap();
        let open = t.path().join("open");
        fs::create_dir(&open).unwrap();
        fs::set_permissions(&open, fs::Permissions::from_mode(0o777)).unwrap();
        assert!(matches!(
            prepare_folder(&open).unwrap(),
            Err(UnsafeFolder::Writable { mode: 0o777 })
        ));
        // A folder inside a parent anyone may rename things in (no sticky bit).
        let inner = open.join("node");
        assert!(matches!(
            prepare_folder(&inner).unwrap(),
            Err(UnsafeFolder::ReplaceableParent { .. })
        ));
        if euid() == 0 {
            let theirs = t.path().join("theirs");
            fs::create_dir(&theirs).unwrap();
            chown(&theirs, Some(4242), Some(4242)).unwrap();
            assert!(matches!(
                prepare_folder(&theirs).unwrap(),
                Err(UnsafeFolder::ForeignOwner { owner: 4242, .. })
            ));
        }
    }
}
