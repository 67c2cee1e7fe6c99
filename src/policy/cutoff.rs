//! Cutoffs: local wall-clock departure times in an IANA time zone, and the
//! pure function that finds the next one after an instant, DST included.

use std::fmt;

/// A key's departure times (`cutoffs`) in its `timezone`.
#[derive(Clone)]
pub struct Cutoffs {
    zone: String,
}

impl Cutoffs {
    /// The time zone's IANA name.
    pub fn zone(&self) -> &str {
        &self.zone
    }

    /// The first cutoff strictly after `after_ms` (ms since the Unix epoch).
    pub fn next_after(&self, after_ms: u64) -> u64 {
        unimplemented!("{after_ms}")
    }
}

impl PartialEq for Cutoffs {
    fn eq(&self, other: &Cutoffs) -> bool {
        self.zone == other.zone
    }
}

impl Eq for Cutoffs {}

impl fmt::Debug for Cutoffs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cutoffs").field("zone", &self.zone).finish()
    }
}
