//! hami-preload: see issue 3.
