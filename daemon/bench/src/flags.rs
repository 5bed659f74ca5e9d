//! Parsers for numeric command-line flags: a value out of range, negative ones included,
//! gets one message naming the range, whether written `--flag -1` or `--flag=-1` (the
//! flags using them also set `allow_negative_numbers`, else clap reads `-1` as a flag).

fn number(s: &str) -> Result<f64, String> {
    s.trim().parse::<f64>().ok().filter(|x| x.is_finite()).ok_or_else(|| "must be a number".to_owned())
}

fn whole(s: &str, min: u64) -> Result<u64, String> {
    let says = || {
        if min == 0 {
            "must be a whole number, 0 or more".to_owned()
        } else {
            format!("must be a whole number, {min} or more")
        }
    };
    s.trim().parse::<u64>().ok().filter(|&n| n >= min).ok_or_else(says)
}

/// A number greater than 0 (durations, hours).
pub fn above_zero(s: &str) -> Result<f64, String> {
    let x = number(s)?;
    if x > 0.0 {
        Ok(x)
    } else {
        Err("must be a number greater than 0".to_owned())
    }
}

/// A number, 0 or more.
pub fn at_least_zero(s: &str) -> Result<f64, String> {
    let x = number(s)?;
    if x >= 0.0 {
        Ok(x)
    } else {
        Err("must be a number, 0 or more".to_owned())
    }
}

/// A number, 1 or more (ratios).
pub fn at_least_one(s: &str) -> Result<f64, String> {
    let x = number(s)?;
    if x >= 1.0 {
        Ok(x)
    } else {
        Err("must be a number, 1 or more".to_owned())
    }
}

/// A whole number, 0 or more.
pub fn count(s: &str) -> Result<u64, String> {
    whole(s, 0)
}

/// A whole number, 1 or more.
pub fn positive_count(s: &str) -> Result<u64, String> {
    whole(s, 1)
}

/// A whole number, 0 or more, that fits 32 bits.
pub fn count32(s: &str) -> Result<u32, String> {
    whole(s, 0).and_then(|n| u32::try_from(n).map_err(|_| format!("must be at most {}", u32::MAX)))
}

/// A whole number, 1 or more, that fits 32 bits.
pub fn positive_count32(s: &str) -> Result<u32, String> {
    whole(s, 1).and_then(|n| u32::try_from(n).map_err(|_| format!("must be at most {}", u32::MAX)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_of_range_values_name_the_range() {
        assert_eq!(above_zero("17.5"), Ok(17.5));
        for bad in ["0", "-1", "-0.5"] {
            assert_eq!(above_zero(bad), Err("must be a number greater than 0".to_owned()), "{bad}");
        }
        assert_eq!(above_zero("x"), Err("must be a number".to_owned()));
        assert_eq!(above_zero("inf"), Err("must be a number".to_owned()));
        assert_eq!(at_least_zero("0"), Ok(0.0));
        assert!(at_least_zero("-1").is_err());
        assert_eq!(at_least_one("1"), Ok(1.0));
        assert_eq!(at_least_one("0.5"), Err("must be a number, 1 or more".to_owned()));
        assert_eq!(count("0"), Ok(0));
        assert_eq!(count("-1"), Err("must be a whole number, 0 or more".to_owned()));
        assert_eq!(positive_count("0"), Err("must be a whole number, 1 or more".to_owned()));
        assert_eq!(positive_count32("-3"), Err("must be a whole number, 1 or more".to_owned()));
        assert!(count32("4294967296").is_err());
    }
}
