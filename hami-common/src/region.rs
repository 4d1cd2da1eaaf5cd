//! Region file operations (to be written: see issue 3).
