//! [`Report`]: the figures and failed checks the scenarios gather.

/// Figures and failed checks gathered by the scenarios.
#[derive(Default)]
pub(super) struct Report {
    pub(super) figures: Vec<(String, String)>,
    pub(super) failures: Vec<String>,
}

impl Report {
    pub(super) fn figure(&mut self, name: &str, value: impl std::fmt::Display) {
        println!("    {name}: {value}");
        self.figures.push((name.to_string(), value.to_string()));
    }

    pub(super) fn check(&mut self, ok: bool, what: impl FnOnce() -> String) {
        if !ok {
            let w = what();
            println!("    CHECK FAILED: {w}");
            self.failures.push(w);
        }
    }
}
