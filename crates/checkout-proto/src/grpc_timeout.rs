//! The `grpc-timeout` header as the gRPC over HTTP/2 spec defines it: at most 8 ASCII digits
//! followed by one unit (`H`, `M`, `S`, `m`, `u`, `n`).

use std::time::Duration;

/// The largest value the spec allows: 8 digits.
const MAX_VALUE: u64 = 99_999_999;

/// Why a `grpc-timeout` value was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GrpcTimeoutError {
    /// The header was present but empty.
    #[error("empty value")]
    Empty,
    /// The value has no digits before the unit.
    #[error("no digits before the unit")]
    NoDigits,
    /// More than 8 digits.
    #[error("more than 8 digits")]
    TooManyDigits,
    /// A character other than an ASCII digit before the unit (signs included).
    #[error("not a non-negative integer")]
    NotDigits,
    /// The last character is not one of `H M S m u n`.
    #[error("unknown unit {0:?} (expected one of H M S m u n)")]
    BadUnit(char),
}

/// Parses a `grpc-timeout` value.
pub fn parse(value: &str) -> Result<Duration, GrpcTimeoutError> {
    let unit = value.chars().last().ok_or(GrpcTimeoutError::Empty)?;
    let digits = &value[..value.len() - unit.len_utf8()];
    let per_unit: fn(u64) -> Duration = match unit {
        'H' => |v| Duration::from_secs(v * 3600),
        'M' => |v| Duration::from_secs(v * 60),
        'S' => Duration::from_secs,
        'm' => Duration::from_millis,
        'u' => Duration::from_micros,
        'n' => Duration::from_nanos,
        other => return Err(GrpcTimeoutError::BadUnit(other)),
    };
    if digits.is_empty() {
        return Err(GrpcTimeoutError::NoDigits);
    }
    if !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(GrpcTimeoutError::NotDigits);
    }
    if digits.len() > 8 {
        return Err(GrpcTimeoutError::TooManyDigits);
    }
    // At most 8 digits, so the value fits and `v * 3600` cannot overflow.
    let value: u64 = digits.parse().map_err(|_| GrpcTimeoutError::NotDigits)?;
    Ok(per_unit(value))
}

/// Formats a duration in the finest unit whose value fits in 8 digits, rounding DOWN so the
/// receiver never gets more time than we meant to give.
pub fn format(duration: Duration) -> String {
    let nanos = duration.as_nanos();
    let units: [(u128, char); 6] = [
        (1, 'n'),
        (1_000, 'u'),
        (1_000_000, 'm'),
        (1_000_000_000, 'S'),
        (60_000_000_000, 'M'),
        (3_600_000_000_000, 'H'),
    ];
    for (per, unit) in units {
        let value = nanos / per;
        if value <= u128::from(MAX_VALUE) {
            return format!("{value}{unit}");
        }
    }
    format!("{MAX_VALUE}H")
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_every_unit() {
        assert_eq!(parse("2H"), Ok(Duration::from_secs(7200)));
        assert_eq!(parse("3M"), Ok(Duration::from_secs(180)));
        assert_eq!(parse("4S"), Ok(Duration::from_secs(4)));
        assert_eq!(parse("80m"), Ok(Duration::from_millis(80)));
        assert_eq!(parse("5u"), Ok(Duration::from_micros(5)));
        assert_eq!(parse("6n"), Ok(Duration::from_nanos(6)));
        assert_eq!(parse("00000001S"), Ok(Duration::from_secs(1)));
    }

    #[test]
    fn rejects_malformed_values() {
        assert_eq!(parse(""), Err(GrpcTimeoutError::Empty));
        assert_eq!(parse("m"), Err(GrpcTimeoutError::NoDigits));
        assert_eq!(parse("100"), Err(GrpcTimeoutError::BadUnit('0')));
        assert_eq!(parse("100s"), Err(GrpcTimeoutError::BadUnit('s')));
        assert_eq!(parse("100ms"), Err(GrpcTimeoutError::BadUnit('s')));
        assert_eq!(parse("-5m"), Err(GrpcTimeoutError::NotDigits));
        assert_eq!(parse("+5m"), Err(GrpcTimeoutError::NotDigits));
        assert_eq!(parse(" 5m"), Err(GrpcTimeoutError::NotDigits));
        assert_eq!(parse("123456789m"), Err(GrpcTimeoutError::TooManyDigits));
        assert_eq!(parse("1.5S"), Err(GrpcTimeoutError::NotDigits));
        assert_eq!(parse("5µ"), Err(GrpcTimeoutError::BadUnit('µ')));
    }

    #[test]
    fn formats_in_the_finest_unit_that_fits() {
        assert_eq!(format(Duration::from_millis(80)), "80000000n");
        assert_eq!(format(Duration::from_millis(2400)), "2400000u");
        assert_eq!(format(Duration::from_secs(3600 * 24)), "86400000m");
        assert_eq!(format(Duration::ZERO), "0n");
        assert_eq!(format(Duration::MAX), "99999999H");
    }

    proptest! {
        #[test]
        fn any_eight_digit_value_with_a_valid_unit_parses(v in 0u64..=MAX_VALUE, unit in prop::sample::select(vec!['H', 'M', 'S', 'm', 'u', 'n'])) {
            let parsed = parse(&format!("{v}{unit}")).expect("valid value");
            let expected = match unit {
                'H' => Duration::from_secs(v * 3600),
                'M' => Duration::from_secs(v * 60),
                'S' => Duration::from_secs(v),
                'm' => Duration::from_millis(v),
                'u' => Duration::from_micros(v),
                _ => Duration::from_nanos(v),
            };
            prop_assert_eq!(parsed, expected);
        }

        #[test]
        fn nine_or_more_digits_are_rejected(v in 100_000_000u64..=u64::MAX, unit in prop::sample::select(vec!['H', 'M', 'S', 'm', 'u', 'n'])) {
            prop_assert_eq!(parse(&format!("{v}{unit}")), Err(GrpcTimeoutError::TooManyDigits));
        }

        #[test]
        fn bad_units_are_rejected(v in 0u64..=MAX_VALUE, unit in any::<char>().prop_filter("not a unit", |c| !"HMSmun".contains(*c))) {
            let value = format!("{v}{unit}");
            prop_assert!(parse(&value).is_err());
        }

        #[test]
        fn negative_values_are_rejected(v in 1i64..=99_999_999, unit in prop::sample::select(vec!['H', 'M', 'S', 'm', 'u', 'n'])) {
            prop_assert_eq!(parse(&format!("-{v}{unit}")), Err(GrpcTimeoutError::NotDigits));
        }

        #[test]
        fn anything_accepted_is_short_and_ends_in_a_unit(s in ".{0,12}") {
            if parse(&s).is_ok() {
                prop_assert!(s.len() <= 9);
                prop_assert!(s.ends_with(['H', 'M', 'S', 'm', 'u', 'n']));
                prop_assert!(s[..s.len() - 1].bytes().all(|b| b.is_ascii_digit()));
            }
        }

        #[test]
        fn format_round_trips_without_ever_granting_more(nanos in any::<u64>()) {
            let d = Duration::from_nanos(nanos);
            let back = parse(&format(d)).expect("format emits valid values");
            prop_assert!(back <= d);
            // Rounding down loses less than one unit of the chosen precision: < 1 part in 10^5.
            prop_assert!(d - back <= d / 100_000 + Duration::from_nanos(1));
        }

        #[test]
        fn whole_milliseconds_round_trip_exactly(ms in 0u64..=MAX_VALUE) {
            let d = Duration::from_millis(ms);
            prop_assert_eq!(parse(&format(d)), Ok(d));
        }
    }
}
