//! Calendar dates from the system clock, in UTC, without a date crate: chat templates'
//! `strftime_now` (its first user, hence its place in the template module) and the provenance of
//! measured costs (`aerie_eval::cost::today`) both need only the proleptic Gregorian civil date
//! of a Unix time (Howard Hinnant's `civil_from_days`/`days_from_civil`).

use std::time::{SystemTime, UNIX_EPOCH};

/// Seconds since 1970-01-01 00:00 UTC now (0 if the clock is before the epoch).
pub fn unix_now() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64)
}

/// Today's UTC date as `YYYY-MM-DD`, for provenance fields.
pub fn today() -> String {
    let (y, m, d) = civil_from_days(unix_now().div_euclid(86_400));
    format!("{y:04}-{m:02}-{d:02}")
}

/// Days since 1970-01-01 → (year, month, day), proleptic Gregorian.
pub fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// (year, month, day), proleptic Gregorian → days since 1970-01-01.
pub fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_dates_both_ways() {
        for (days, ymd) in [(0, (1970, 1, 1)), (11_016, (2000, 2, 29)), (20_788, (2026, 12, 1)), (-1, (1969, 12, 31))] {
            assert_eq!(civil_from_days(days), ymd);
            assert_eq!(days_from_civil(ymd.0, ymd.1, ymd.2), days);
        }
        let t = today();
        assert_eq!(t.len(), 10);
        assert_eq!(&t[4..5], "-");
    }
}
