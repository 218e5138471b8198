//! Quantities written for people to read.

/// 8 MiB, 340.5 KiB, 12 bytes: for messages people read. A whole number of units is written
/// without a fraction (a limit such as 64 KiB reads as set), any other to one decimal.
pub fn human_bytes(n: u64) -> String {
    const K: u64 = 1024;
    let (unit, name) = match n {
        n if n >= K * K * K => (K * K * K, "GiB"),
        n if n >= K * K => (K * K, "MiB"),
        n if n >= K => (K, "KiB"),
        n => return format!("{n} bytes"),
    };
    if n.is_multiple_of(unit) {
        format!("{} {name}", n / unit)
    } else {
        format!("{:.1} {name}", n as f64 / unit as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::human_bytes;

    #[test]
    fn whole_units_read_as_set_and_others_to_one_decimal() {
        assert_eq!(human_bytes(12), "12 bytes");
        assert_eq!(human_bytes(1025), "1.0 KiB");
        assert_eq!(human_bytes(64 << 10), "64 KiB");
        assert_eq!(human_bytes(8 << 20), "8 MiB");
        assert_eq!(human_bytes((8 << 20) + (1 << 19)), "8.5 MiB");
        assert_eq!(human_bytes(3 << 30), "3 GiB");
    }
}
