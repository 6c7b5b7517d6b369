//! Byte counts and bandwidths as people read them, for logs, error messages and `ferry plan`:
//! sizes in binary units (KiB, MiB, GiB), link speeds in decimal ones (GB/s), as they are
//! quoted. A leaf module, so that errors, the planner and the renderer can all use it without
//! importing each other.

/// Formats a byte count with binary units and one decimal: `512 B`, `3.0 KiB`, `45.2 MiB`,
/// `6.0 GiB`, `1.5 TiB`.
pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

/// Formats a bandwidth in bytes/s with decimal units: `16 GB/s`, `12.5 GB/s`, `800 MB/s`.
pub fn format_bandwidth(bytes_per_s: u64) -> String {
    let (value, unit) = if bytes_per_s >= 1_000_000_000 {
        (bytes_per_s as f64 / 1e9, "GB/s")
    } else {
        (bytes_per_s as f64 / 1e6, "MB/s")
    };
    if (value - value.round()).abs() < 1e-9 {
        format!("{value:.0} {unit}")
    } else {
        format!("{value:.1} {unit}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1024 * 1024;

    #[test]
    fn formats_binary_sizes() {
        let cases = [
            (0, "0 B"),
            (1023, "1023 B"),
            (1024, "1.0 KiB"),
            (1536, "1.5 KiB"),
            (45 * MIB + MIB / 5, "45.2 MiB"),
            (6 * 1024 * MIB, "6.0 GiB"),
            (3 * 1024 * 1024 * MIB / 2, "1.5 TiB"),
        ];
        for (bytes, text) in cases {
            assert_eq!(format_bytes(bytes), text, "{bytes}");
        }
        assert_eq!(format_bandwidth(16_000_000_000), "16 GB/s");
        assert_eq!(format_bandwidth(12_500_000_000), "12.5 GB/s");
        assert_eq!(format_bandwidth(800_000_000), "800 MB/s");
    }
}
