//! Times and durations as people and agents write them: RFC 3339 or relative (`+5m`), and `90s`,
//! `5m`, `2h`, `1d`, `250ms`. Bounded to ten years (further is a typo, and every layer's clock
//! arithmetic stays far from overflow).

use chrono::{DateTime, Utc};

/// The farthest any time or duration may reach: ten years.
pub const MAX_FLAG_DURATION: std::time::Duration = crate::operation::MAX_HORIZON;

/// An absolute RFC 3339 time, or a relative one: `+90s`, `+5m`, `+2h`, `+1d`. At most ten years ahead.
pub fn parse_time(s: &str) -> Result<DateTime<Utc>, String> {
    parse_time_at(s, Utc::now())
}

/// As [`parse_time`], relative to `now` (the database's clock, where a decision is recorded).
pub fn parse_time_at(s: &str, now: DateTime<Utc>) -> Result<DateTime<Utc>, String> {
    // What an error repeats of the input: a caller's megabytes are not echoed back (several times).
    let shown = crate::ids::shown(s);
    let latest = now + chrono::Duration::from_std(MAX_FLAG_DURATION).expect("ten years fit");
    let t = if let Some(rel) = s.strip_prefix('+') {
        let d = parse_duration(rel)?;
        now + chrono::Duration::from_std(d).map_err(|_| format!("{shown:?} is too far ahead"))?
    } else {
        DateTime::parse_from_rfc3339(s)
            .map(|t| t.with_timezone(&Utc))
            .map_err(|e| {
                format!(
                    "{shown:?} is not RFC 3339 (2026-01-31T12:00:00Z) or relative (+90s, +5m, +2h): {e}"
                )
            })?
    };
    if t > latest {
        return Err(format!(
            "{shown:?} is more than ten years ahead (latest {latest})"
        ));
    }
    // A leap second (`:60`) names no instant a clock here keeps: PostgreSQL would store the next
    // minute's `:00` for it, a time the caller did not write.
    if chrono::Timelike::nanosecond(&t) >= 1_000_000_000 {
        return Err(format!(
            "{shown:?} names a leap second (:60): write :59 or the next minute's :00"
        ));
    }
    Ok(t)
}

/// The nearest a time a person sets (a token's expiry, a deadline a decision moves) may be: a
/// minute. Nearer is a typo (`+30ms` meant `+30m`) that makes a token dead on arrival, or a
/// deadline that has passed before the decision's effect could be seen.
pub const NEAREST_FUTURE: std::time::Duration = std::time::Duration::from_secs(60);

/// As [`parse_time_at`], at least [`NEAREST_FUTURE`] after `now`.
pub fn parse_future_at(s: &str, now: DateTime<Utc>) -> Result<DateTime<Utc>, String> {
    let t = parse_time_at(s, now)?;
    let nearest = now + chrono::Duration::from_std(NEAREST_FUTURE).expect("a minute fits");
    if t < nearest {
        return Err(format!(
            "{t} is less than a minute from now ({now}): a time that near is taken for a typo \
             (+30ms for +30m); give one at least a minute ahead"
        ));
    }
    Ok(t)
}

/// `90s`, `5m`, `2h`, `1d`, `250ms`; at most ten years. A number needs its unit (`0` alone is
/// zero): a bare `30` meant as minutes or days, read as seconds, made a token that died at once or
/// a deadline that passed before anyone looked.
pub fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    let s = s.trim();
    if s == "0" {
        return Ok(std::time::Duration::ZERO);
    }
    // What an error repeats of the input: a caller's megabytes are not echoed back (five times).
    let shown = crate::ids::shown(s);
    let Some((num, unit)) = s.find(|c: char| !c.is_ascii_digit()).map(|i| s.split_at(i)) else {
        return Err(if s.len() > 20 {
            format!(
                "{shown:?} is no duration: a number of at most 20 digits and its unit (90s, 5m, 2h, 1d, 250ms)"
            )
        } else {
            format!("{s:?} has no unit: write {s}s, {s}m, {s}h or {s}d (or ms)")
        });
    };
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{shown:?} is not a duration like 90s, 5m, 2h"))?;
    let millis_per = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => {
            return Err(format!(
                "{shown:?}: unknown unit {:?} (use ms, s, m, h, d)",
                crate::ids::shown(unit)
            ));
        }
    };
    let d = n
        .checked_mul(millis_per)
        .map(std::time::Duration::from_millis)
        .filter(|d| *d <= MAX_FLAG_DURATION)
        .ok_or_else(|| format!("{shown:?} is longer than ten years"))?;
    Ok(d)
}

/// A duration within `[min, max]`, with a message that names the field and the range.
pub fn parse_duration_within(
    field: &str,
    s: &str,
    min: std::time::Duration,
    max: std::time::Duration,
) -> Result<std::time::Duration, String> {
    let d = parse_duration(s).map_err(|e| format!("{field}: {e}"))?;
    if d < min || d > max {
        return Err(format!(
            "{field}: {} is outside {} to {}",
            crate::ids::shown(s.trim()),
            show_duration(min),
            show_duration(max)
        ));
    }
    Ok(d)
}

/// A duration in the largest unit that divides it (`90s`, `5m`, `1d`).
pub fn show_duration(d: std::time::Duration) -> String {
    let ms = d.as_millis();
    match ms {
        0 => "0s".into(),
        m if m % 86_400_000 == 0 => format!("{}d", m / 86_400_000),
        m if m % 3_600_000 == 0 => format!("{}h", m / 3_600_000),
        m if m % 60_000 == 0 => format!("{}m", m / 60_000),
        m if m % 1_000 == 0 => format!("{}s", m / 1_000),
        m => format!("{m}ms"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_leap_second_is_refused() {
        let e = parse_time_at("2031-01-01T00:00:60Z", Utc::now()).unwrap_err();
        assert!(e.contains("leap second"), "{e}");
        assert!(parse_time_at("2031-01-01T00:00:59Z", Utc::now()).is_ok());
    }

    #[test]
    fn a_time_a_person_sets_is_at_least_a_minute_ahead() {
        let now = Utc::now();
        for near in ["+30ms", "+59s", "+0s"] {
            let e = parse_future_at(near, now).unwrap_err();
            assert!(e.contains("less than a minute"), "{near}: {e}");
        }
        let past = (now - chrono::Duration::hours(1)).to_rfc3339();
        assert!(parse_future_at(&past, now).is_err());
        assert_eq!(
            parse_future_at("+60s", now).unwrap(),
            now + chrono::Duration::seconds(60)
        );
        assert!(parse_future_at("+30m", now).is_ok());
    }

    #[test]
    fn durations_and_times_parse() {
        assert_eq!(parse_duration("90s").unwrap().as_secs(), 90);
        assert_eq!(parse_duration("5m").unwrap().as_secs(), 300);
        assert_eq!(parse_duration("250ms").unwrap().as_millis(), 250);
        // A number needs its unit: `30` meant as minutes or days, read as seconds, made a token
        // that died at once or a deadline that passed before anyone looked. `0` is zero.
        for bare in ["7", "30", "+30"] {
            let e = parse_duration(bare.trim_start_matches('+')).unwrap_err();
            assert!(e.contains("no unit"), "{bare}: {e}");
        }
        assert!(parse_time("+30").unwrap_err().contains("no unit"));
        assert_eq!(parse_duration("0").unwrap(), std::time::Duration::ZERO);
        assert!(parse_duration("5 parsecs").is_err());
        // Overflow and absurd lengths are errors, never a wrapped or clamped value.
        assert!(parse_duration("213503982334602d").is_err());
        assert!(parse_duration("100000000d").is_err());
        assert!(parse_duration("99999999999999999999999s").is_err());
        assert!(parse_duration("3650d").is_ok());
        assert!(parse_time("+100000000d").is_err());
        assert!(parse_time("275817-01-01T00:00:00Z").is_err());
        let lease = |s: &str| {
            parse_duration_within(
                "--lease",
                s,
                std::time::Duration::from_secs(1),
                std::time::Duration::from_secs(3600),
            )
        };
        assert!(lease("30s").is_ok());
        let e = lease("2h").unwrap_err();
        assert!(e.contains("1s to 1h"), "{e}");
        assert!(parse_time("+1h").unwrap() > Utc::now());
        assert!(parse_time("2026-01-31T12:00:00Z").is_ok());
        assert!(parse_time("tomorrow").is_err());
    }
}
