//! `cargo xtask setup` (to be written).
use anyhow::Result;

/// What `setup` made ready.
pub struct Tools {}

/// Make the machine ready; idempotent.
pub fn setup() -> Result<Tools> {
    Ok(Tools {})
}
