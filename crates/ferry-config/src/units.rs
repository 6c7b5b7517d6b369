//! Human-friendly units: sizes (`512MiB`, `6GiB`, `6GB`, `1048576`), shares of free device memory
//! (`90%`), durations (`30s`, `5m`, `1h`, `250ms`) and bandwidths (`16GB/s`, `800MiB/s`).

/// Parses a byte size. Decimal units (`KB`, `MB`, `GB`, `TB`) are powers of 1000, binary ones
/// (`KiB`, `MiB`, `GiB`, `TiB`) powers of 1024; `B` or no unit means bytes. Case-insensitive units,
/// optional space, fractional values allowed (`1.5GiB`).
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let (number, unit) = split_number(text)?;
    let multiplier: f64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kb" => 1e3,
        "m" | "mb" => 1e6,
        "g" | "gb" => 1e9,
        "t" | "tb" => 1e12,
        "kib" => 1024.0,
        "mib" => 1024.0 * 1024.0,
        "gib" => 1024.0 * 1024.0 * 1024.0,
        "tib" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        other => {
            return Err(format!(
                "unknown size unit `{other}` in `{text}` (use B, KB, MB, GB, KiB, MiB, GiB...)"
            ))
        }
    };
    if multiplier == 1.0 && number.fract() != 0.0 {
        return Err(format!(
            "`{text}` is not a whole number of bytes (a share of free memory is written like `90%`)"
        ));
    }
    let bytes = number * multiplier;
    if bytes > u64::MAX as f64 {
        return Err(format!("`{text}` is too large"));
    }
    Ok(bytes.round() as u64)
}

/// Parses a percentage in (0, 100], e.g. `90%`, into a fraction in (0, 1].
pub fn parse_percent(text: &str) -> Result<f64, String> {
    let body = text
        .trim()
        .strip_suffix('%')
        .ok_or_else(|| format!("`{text}` is not a percentage"))?;
    let value: f64 = body
        .trim()
        .parse()
        .map_err(|_| format!("`{text}` is not a percentage"))?;
    if !(value > 0.0 && value <= 100.0) {
        return Err(format!("`{text}` must be between 0% (exclusive) and 100%"));
    }
    Ok(value / 100.0)
}

/// Parses a duration: a number with `ms`, `s`, `m` or `h` (a bare number is seconds).
pub fn parse_duration(text: &str) -> Result<std::time::Duration, String> {
    let (number, unit) = split_number(text)?;
    let seconds = match unit.to_ascii_lowercase().as_str() {
        "ms" => number / 1000.0,
        "" | "s" => number,
        "m" | "min" => number * 60.0,
        "h" => number * 3600.0,
        other => {
            return Err(format!(
                "unknown duration unit `{other}` in `{text}` (use ms, s, m or h)"
            ))
        }
    };
    Ok(std::time::Duration::from_secs_f64(seconds))
}

/// Parses a bandwidth in bytes per second: a size followed by `/s`, e.g. `16GB/s`.
pub fn parse_bandwidth(text: &str) -> Result<u64, String> {
    let size = text
        .trim()
        .strip_suffix("/s")
        .ok_or_else(|| format!("`{text}` is not a bandwidth (write it like `16GB/s`)"))?;
    let bytes = parse_bytes(size)?;
    if bytes == 0 {
        return Err(format!("bandwidth `{text}` must be positive"));
    }
    Ok(bytes)
}

/// Splits `"1.5 GiB"` into `(1.5, "GiB")`, rejecting negative, empty or non-finite numbers.
fn split_number(text: &str) -> Result<(f64, &str), String> {
    let trimmed = text.trim();
    let end = trimmed
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(end);
    let value: f64 = number
        .parse()
        .map_err(|_| format!("`{text}` does not start with a number"))?;
    if !value.is_finite() {
        return Err(format!("`{text}` is not a finite number"));
    }
    Ok((value, unit.trim()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn sizes_accept_decimal_and_binary_units() {
        let cases = [
            ("512MiB", 512 * 1024 * 1024),
            ("6GiB", 6 * 1024 * 1024 * 1024),
            ("6GB", 6_000_000_000),
            ("6 gb", 6_000_000_000),
            ("1048576", 1_048_576),
            ("1.5KiB", 1536),
            ("16MiB", 16 * 1024 * 1024),
        ];
        for (text, bytes) in cases {
            assert_eq!(parse_bytes(text), Ok(bytes), "{text}");
        }
    }

    #[test]
    fn sizes_reject_garbage() {
        for text in ["", "GiB", "-5GB", "5 parsecs", "1e3", "0.9", "1.5B"] {
            assert!(parse_bytes(text).is_err(), "{text} should be rejected");
        }
    }

    #[test]
    fn percentages_are_fractions() {
        assert_eq!(parse_percent("90%"), Ok(0.9));
        assert_eq!(parse_percent("100%"), Ok(1.0));
        assert!(parse_percent("0%").is_err());
        assert!(parse_percent("150%").is_err());
        assert!(parse_percent("90").is_err());
    }

    #[test]
    fn durations_and_bandwidths() {
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("2"), Ok(Duration::from_secs(2)));
        assert!(parse_duration("5 weeks").is_err());
        assert_eq!(parse_bandwidth("16GB/s"), Ok(16_000_000_000));
        assert_eq!(parse_bandwidth("8GiB/s"), Ok(8 * 1024 * 1024 * 1024));
        assert!(parse_bandwidth("16GB").is_err());
        assert!(parse_bandwidth("0GB/s").is_err());
    }
}
