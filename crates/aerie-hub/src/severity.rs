//! How bad a lint finding is: shared by `inspect` (the checks of any drafter) and `published`
//! (the checks of the published trainers' layouts), neither of which owns the other.

use serde::Serialize;

/// How bad a finding is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// The drafter would not serve as intended.
    Error,
    /// Suspicious; fails the check only in strict mode.
    Warning,
}
