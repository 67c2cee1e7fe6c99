//! Cutoffs: local wall-clock departure times in an IANA time zone, and the
//! pure function that finds the next one after an instant, DST included.
//!
//! Time zones come from `jiff`: the system's `/usr/share/zoneinfo` when it
//! has one, else the copy of the time-zone database built into the binary,
//! so a bare machine knows every zone too. A local time that a spring-forward
//! skips fires at the transition instant (the first instant after it); a
//! local time that a fall-back repeats fires once, at its earlier instant.

use std::fmt;

use jiff::Timestamp;
use jiff::civil::{DateTime, Time};
use jiff::tz::{AmbiguousOffset, TimeZone};

/// A key's departure times (`cutoffs`) in its `timezone`.
#[derive(Clone)]
pub struct Cutoffs {
    /// The time zone's IANA name, as written in the config.
    zone: String,
    /// The zone's rules.
    tz: TimeZone,
    /// The local times of day, sorted, without duplicates.
    times: Vec<Time>,
}

impl Cutoffs {
    /// The cutoffs at `times` ("HH:MM" or "HH:MM:SS", local wall-clock
    /// times) in the IANA time zone `timezone`. The error says which time is
    /// wrong, or that the zone is unknown.
    pub fn new(times: &[String], timezone: &str) -> Result<Cutoffs, String> {
        let times = times
            .iter()
            .map(|t| Cutoffs::parse_time(t))
            .collect::<Result<Vec<Time>, String>>()?;
        if times.is_empty() {
            return Err("needs at least one time of day".to_owned());
        }
        let tz = Cutoffs::parse_zone(timezone)?;
        Ok(Cutoffs::from_parts(times, timezone, tz))
    }

    /// The cutoffs at parsed `times` in `tz`, named `zone`. With no times
    /// there is no cutoff: [`Cutoffs::next_after`] gives `u64::MAX`.
    pub fn from_parts(mut times: Vec<Time>, zone: &str, tz: TimeZone) -> Cutoffs {
        times.sort_unstable();
        times.dedup();
        Cutoffs {
            zone: zone.to_owned(),
            tz,
            times,
        }
    }

    /// A local time of day written "HH:MM" or "HH:MM:SS" (24-hour clock, two
    /// digits each).
    pub fn parse_time(text: &str) -> Result<Time, String> {
        let wrong = || {
            format!("{text:?} is not a time of day: write HH:MM or HH:MM:SS (00:00 to 23:59:59)")
        };
        let parts: Vec<&str> = text.split(':').collect();
        if !(2..=3).contains(&parts.len()) {
            return Err(wrong());
        }
        let mut fields = [0i8; 3];
        for (field, part) in fields.iter_mut().zip(&parts) {
            if part.len() != 2 || !part.bytes().all(|b| b.is_ascii_digit()) {
                return Err(wrong());
            }
            *field = part.parse().map_err(|_| wrong())?;
        }
        let [hour, minute, second] = fields;
        if hour > 23 || minute > 59 || second > 59 {
            return Err(wrong());
        }
        Time::new(hour, minute, second, 0).map_err(|_| wrong())
    }

    /// The rules of the IANA time zone `name` (such as "Europe/Berlin" or "UTC").
    pub fn parse_zone(name: &str) -> Result<TimeZone, String> {
        TimeZone::get(name).map_err(|_| {
            format!("{name:?} is not a known IANA time zone (such as \"Europe/Berlin\" or \"UTC\")")
        })
    }

    /// The time zone's IANA name.
    pub fn zone(&self) -> &str {
        &self.zone
    }

    /// The local times of day, sorted, without duplicates.
    pub fn times(&self) -> &[Time] {
        &self.times
    }

    /// The first cutoff strictly after `after_ms` (ms since the Unix epoch).
    /// With no times, or past the end of `jiff`'s range (the year 9999),
    /// there is none, and the answer is `u64::MAX`.
    pub fn next_after(&self, after_ms: u64) -> u64 {
        let Some(after) = i64::try_from(after_ms)
            .ok()
            .and_then(|ms| Timestamp::from_millisecond(ms).ok())
        else {
            return u64::MAX;
        };
        if self.times.is_empty() {
            return u64::MAX;
        }
        // Start a day early: a cutoff of the previous local date can still be
        // ahead when the zone's offset just grew. Every day has each time
        // (in a gap, at its transition), so a cutoff is at most a day and a
        // transition away; a few days more cover zones that skipped a date.
        let mut day = after.to_zoned(self.tz.clone()).date().yesterday().ok();
        for _ in 0..6 {
            let Some(date) = day else { break };
            let next = self
                .times
                .iter()
                .filter_map(|&time| self.instant(date.to_datetime(time)))
                .filter(|&ms| ms > after_ms)
                .min();
            if let Some(ms) = next {
                return ms;
            }
            day = date.tomorrow().ok();
        }
        u64::MAX
    }

    /// The instant (ms since the epoch) the local `dt` fires at: its only
    /// instant, the transition instant when it falls in a gap, the earlier
    /// instant when it happens twice; `None` before the epoch or out of range.
    fn instant(&self, dt: DateTime) -> Option<u64> {
        let at = match self.tz.to_ambiguous_timestamp(dt).offset() {
            AmbiguousOffset::Unambiguous { offset } => offset.to_timestamp(dt).ok()?,
            AmbiguousOffset::Fold { before, .. } => before.to_timestamp(dt).ok()?,
            AmbiguousOffset::Gap { before, .. } => {
                // Read with the offset before the gap, `dt` lands after the
                // transition; the transition just before that is the gap's.
                let past = before.to_timestamp(dt).ok()?;
                self.tz
                    .preceding(past)
                    .next()
                    .map_or(past, |transition| transition.timestamp())
            }
        };
        u64::try_from(at.as_millisecond()).ok()
    }
}

impl PartialEq for Cutoffs {
    /// Equal when the zone names and the times are.
    fn eq(&self, other: &Cutoffs) -> bool {
        self.zone == other.zone && self.times == other.times
    }
}

impl Eq for Cutoffs {}

impl fmt::Debug for Cutoffs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let times: Vec<String> = self.times.iter().map(ToString::to_string).collect();
        f.debug_struct("Cutoffs")
            .field("zone", &self.zone)
            .field("times", &times)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ms since the epoch of an RFC 3339 instant, such as "2026-03-29T01:00:00Z".
    fn ms(instant: &str) -> u64 {
        let at: Timestamp = instant.parse().expect("an RFC 3339 instant");
        u64::try_from(at.as_millisecond()).expect("after the epoch")
    }

    fn cutoffs(times: &[&str], zone: &str) -> Cutoffs {
        let times: Vec<String> = times.iter().map(|t| (*t).to_owned()).collect();
        Cutoffs::new(&times, zone).expect("valid cutoffs")
    }

    /// Checks each `(after, want)` pair: the next cutoff after `after` is `want`.
    fn assert_next(c: &Cutoffs, cases: &[(&str, &str)]) {
        for &(after, want) in cases {
            assert_eq!(
                c.next_after(ms(after)),
                ms(want),
                "{c:?} after {after}: want {want}"
            );
        }
    }

    /// One daily cutoff in UTC: later today, or tomorrow once it has passed
    /// (strictly after: the cutoff instant itself gives the next day's).
    #[test]
    fn one_cutoff_across_midnight() {
        let c = cutoffs(&["17:45"], "UTC");
        assert_eq!(c.zone(), "UTC");
        assert_next(
            &c,
            &[
                ("2026-05-10T08:00:00Z", "2026-05-10T17:45:00Z"),
                ("2026-05-10T17:44:59.999Z", "2026-05-10T17:45:00Z"),
                ("2026-05-10T17:45:00Z", "2026-05-11T17:45:00Z"),
                ("2026-05-10T23:59:59Z", "2026-05-11T17:45:00Z"),
                ("2026-12-31T18:00:00Z", "2027-01-01T17:45:00Z"),
                ("1970-01-01T00:00:00Z", "1970-01-01T17:45:00Z"),
            ],
        );
    }

    /// Several cutoffs a day, given out of order and with a duplicate, with
    /// seconds: each fires once, in time order, then the next day's first.
    #[test]
    fn several_cutoffs_with_seconds() {
        let c = cutoffs(&["17:45:30", "06:00", "11:30", "06:00:00"], "UTC");
        assert_eq!(c.times().len(), 3);
        assert_next(
            &c,
            &[
                ("2026-05-10T00:00:00Z", "2026-05-10T06:00:00Z"),
                ("2026-05-10T06:00:00Z", "2026-05-10T11:30:00Z"),
                ("2026-05-10T11:30:00Z", "2026-05-10T17:45:30Z"),
                ("2026-05-10T17:45:29.999Z", "2026-05-10T17:45:30Z"),
                ("2026-05-10T17:45:30Z", "2026-05-11T06:00:00Z"),
            ],
        );
    }

    /// In Europe/Berlin (+01:00 in winter, +02:00 in summer) a local cutoff
    /// is that many hours earlier in UTC, and the local date decides "today".
    #[test]
    fn non_utc_zone() {
        let c = cutoffs(&["00:30", "11:30"], "Europe/Berlin");
        assert_eq!(c.zone(), "Europe/Berlin");
        assert_next(
            &c,
            &[
                // Summer: 11:30 CEST = 09:30 UTC.
                ("2026-07-01T08:00:00Z", "2026-07-01T09:30:00Z"),
                // 23:00 UTC on July 1 is already July 2 01:00 in Berlin.
                ("2026-07-01T22:00:00Z", "2026-07-01T22:30:00Z"),
                ("2026-07-01T23:00:00Z", "2026-07-02T09:30:00Z"),
                // Winter: 11:30 CET = 10:30 UTC.
                ("2026-01-15T10:00:00Z", "2026-01-15T10:30:00Z"),
                ("2026-01-15T10:30:00Z", "2026-01-15T23:30:00Z"),
            ],
        );
    }

    /// Spring forward in Berlin (2026-03-29, 02:00 CET -> 03:00 CEST at
    /// 01:00 UTC): 02:30 does not exist and fires at the transition instant;
    /// 02:00 and 02:59:59 land there too and fire once with it.
    #[test]
    fn spring_forward_gap_fires_at_transition() {
        let c = cutoffs(&["02:30"], "Europe/Berlin");
        assert_next(
            &c,
            &[
                ("2026-03-28T12:00:00Z", "2026-03-29T01:00:00Z"),
                ("2026-03-29T00:59:59.999Z", "2026-03-29T01:00:00Z"),
                // After it, the next is 02:30 CEST on March 30 = 00:30 UTC.
                ("2026-03-29T01:00:00Z", "2026-03-30T00:30:00Z"),
                // The day before: 02:30 CET = 01:30 UTC.
                ("2026-03-27T12:00:00Z", "2026-03-28T01:30:00Z"),
            ],
        );
        let c = cutoffs(&["02:00", "02:30", "02:59:59", "03:30"], "Europe/Berlin");
        assert_next(
            &c,
            &[
                ("2026-03-29T00:30:00Z", "2026-03-29T01:00:00Z"),
                // The three gap times were one cutoff; 03:30 CEST is next.
                ("2026-03-29T01:00:00Z", "2026-03-29T01:30:00Z"),
            ],
        );
    }

    /// Fall back in Berlin (2026-10-25, 03:00 CEST -> 02:00 CET at 01:00
    /// UTC): 02:30 happens at 00:30 and 01:30 UTC and fires once, at 00:30.
    #[test]
    fn fall_back_fold_fires_once() {
        let c = cutoffs(&["02:30"], "Europe/Berlin");
        assert_next(
            &c,
            &[
                ("2026-10-24T12:00:00Z", "2026-10-25T00:30:00Z"),
                // Not again at 01:30 UTC: the next is 02:30 CET the next day.
                ("2026-10-25T00:30:00Z", "2026-10-26T01:30:00Z"),
                ("2026-10-25T01:00:00Z", "2026-10-26T01:30:00Z"),
            ],
        );
        let c = cutoffs(&["02:30", "02:45", "09:00"], "Europe/Berlin");
        assert_next(
            &c,
            &[
                ("2026-10-25T00:30:00Z", "2026-10-25T00:45:00Z"),
                // 09:00 CET = 08:00 UTC, after the fold.
                ("2026-10-25T00:45:00Z", "2026-10-25T08:00:00Z"),
            ],
        );
    }

    /// America/New_York (-05:00 / -04:00): the gap of 2026-03-08 (02:00 EST
    /// -> 03:00 EDT at 07:00 UTC) and the fold of 2026-11-01 (02:00 EDT ->
    /// 01:00 EST at 06:00 UTC), and a local evening that is tomorrow in UTC.
    #[test]
    fn new_york_gap_and_fold() {
        let c = cutoffs(&["02:15", "22:00"], "America/New_York");
        assert_next(
            &c,
            &[
                // Winter: 22:00 EST = 03:00 UTC the next day.
                ("2026-03-06T12:00:00Z", "2026-03-07T03:00:00Z"),
                ("2026-03-07T03:00:00Z", "2026-03-07T07:15:00Z"),
                // 02:15 on March 8 does not exist: the transition at 07:00 UTC.
                ("2026-03-08T03:00:00Z", "2026-03-08T07:00:00Z"),
                // Summer: 22:00 EDT = 02:00 UTC the next day.
                ("2026-03-08T07:00:00Z", "2026-03-09T02:00:00Z"),
            ],
        );
        let c = cutoffs(&["01:30"], "America/New_York");
        assert_next(
            &c,
            &[
                // 01:30 EDT = 05:30 UTC; 01:30 EST (06:30 UTC) does not fire.
                ("2026-11-01T00:00:00Z", "2026-11-01T05:30:00Z"),
                ("2026-11-01T05:30:00Z", "2026-11-02T06:30:00Z"),
            ],
        );
    }

    /// The binary carries its own copy of the time-zone database, so a
    /// machine without `/usr/share/zoneinfo` knows the zones too.
    #[test]
    fn bundled_database_has_the_zones() {
        let db = jiff::tz::TimeZoneDatabase::bundled();
        for zone in ["Europe/Berlin", "America/New_York", "Asia/Tokyo", "UTC"] {
            assert!(
                db.get(zone).is_ok(),
                "{zone} is not in the bundled database"
            );
        }
    }

    /// Bad times and unknown zones are refused with a message naming them;
    /// equal cutoffs compare equal whatever order the times came in.
    #[test]
    fn errors_and_equality() {
        for bad in [
            "24:00",
            "7:30",
            "07:60",
            "07:30:60",
            "07",
            "07:30:00:00",
            "ab:cd",
            "",
        ] {
            let err = Cutoffs::new(&[bad.to_owned()], "UTC").unwrap_err();
            assert!(
                err.contains(&format!("{bad:?} is not a time of day")),
                "{err}"
            );
        }
        let err = Cutoffs::new(&["07:30".to_owned()], "Mars/Olympus").unwrap_err();
        assert!(
            err.contains("\"Mars/Olympus\" is not a known IANA time zone"),
            "{err}"
        );
        let err = Cutoffs::new(&[], "UTC").unwrap_err();
        assert!(err.contains("at least one"), "{err}");
        assert_eq!(
            cutoffs(&["11:30", "06:00"], "Europe/Berlin"),
            cutoffs(&["06:00:00", "11:30"], "Europe/Berlin")
        );
        assert_ne!(cutoffs(&["06:00"], "UTC"), cutoffs(&["06:00"], "Etc/UTC"));
        assert_eq!(cutoffs(&["06:00"], "UTC").next_after(u64::MAX), u64::MAX);
    }
}
