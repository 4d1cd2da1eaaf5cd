//! A file's version ([`FileStamp`]): what tells that a library file was rewritten in place.

use std::path::Path;
/// What identifies one version of a file: device, inode, size and modification time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct FileStamp {
    id: (u64, u64),
    len: u64,
    mtime: (i64, i64),
}

impl FileStamp {
    /// The stamp of the file `path` names now (symlinks followed); `None` if it cannot be
    /// read.
    pub(super) fn of(path: &Path) -> Option<FileStamp> {
        std::fs::metadata(path).ok().map(|m| FileStamp::from(&m))
    }
}

impl From<&std::fs::Metadata> for FileStamp {
    fn from(m: &std::fs::Metadata) -> FileStamp {
        use std::os::unix::fs::MetadataExt;
        FileStamp {
            id: (m.dev(), m.ino()),
            len: m.len(),
            mtime: (m.mtime(), m.mtime_nsec()),
        }
    }
}
