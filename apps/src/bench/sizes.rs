//! Message sizes (`-S`) and how many iterations each runs (`-I`).

/// `-S all`: powers of two from 1 B to this.
pub const ALL_MAX: u64 = 8 << 20;

/// The largest size `-S` accepts: each side registers buffers of it.
pub const MAX_SIZE: u64 = 1 << 30;

/// Pingpong's sizes without `-S`: 64 B to 1 MiB, powers of two (`all`
/// would spend most of its time on the 2-8 MiB round trips).
pub fn default_pingpong() -> Vec<u64> {
    powers_of_two(64, 1 << 20)
}

/// Streaming's sizes without `-S`: as pingpong's.
pub fn default_streaming() -> Vec<u64> {
    powers_of_two(64, 1 << 20)
}

fn powers_of_two(from: u64, to: u64) -> Vec<u64> {
    std::iter::successors(Some(from), |s| s.checked_mul(2)).take_while(|&s| s <= to).collect()
}

const HELP: &str = "expected a number of bytes with an optional k, m or g suffix (64, 4k, 1m), \
                    a comma-separated list of them (64,4k,1m), or `all` (1 B to 8 MiB in \
                    powers of two)";

/// `-S all` (and `-a`): 1 B to 8 MiB in powers of two.
pub fn all() -> Vec<u64> {
    powers_of_two(1, ALL_MAX)
}

/// Parses `-S`: `all`, or sizes separated by commas, each a number with an
/// optional binary suffix `k`/`K` (KiB), `m`/`M` (MiB) or `g`/`G` (GiB).
pub fn parse(text: &str) -> Result<Vec<u64>, String> {
    let text = text.trim();
    if text.eq_ignore_ascii_case("all") {
        return Ok(all());
    }
    if text.is_empty() {
        return Err(format!("no size given; {HELP}"));
    }
    text.split(',').map(parse_one).collect()
}

fn parse_one(item: &str) -> Result<u64, String> {
    let item = item.trim();
    let (digits, shift) = match item.as_bytes().last() {
        Some(b'k' | b'K') => (&item[..item.len() - 1], 10),
        Some(b'm' | b'M') => (&item[..item.len() - 1], 20),
        Some(b'g' | b'G') => (&item[..item.len() - 1], 30),
        _ => (item, 0),
    };
    let bad = || format!("`{item}` is not a size; {HELP}");
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let n: u64 = digits.parse().map_err(|_| bad())?;
    let size = n
        .checked_mul(1 << shift)
        .filter(|&s| s <= MAX_SIZE)
        .ok_or_else(|| format!("`{item}` is larger than the largest size, {}", human(MAX_SIZE)))?;
    Ok(size)
}

/// What each size runs: `-I` when given, else fewer for larger sizes.
/// Pingpong follows fabtests (`size_to_count`): 10000 round trips below
/// 64 KiB, 1000 below 1 MiB, 100 from 1 MiB. Streaming moves about 1 GiB
/// per size, between 200 and 1,000,000 messages, so that every size lasts
/// several of its 10 ms peak intervals even at 15 GB/s.
pub fn iterations(size: u64, explicit: Option<u64>, streaming: bool) -> u64 {
    if let Some(n) = explicit {
        return n;
    }
    if streaming {
        return ((1 << 30) / size.max(1)).clamp(200, 1_000_000);
    }
    match size {
        s if s >= 1 << 20 => 100,
        s if s >= 1 << 16 => 1000,
        _ => 10_000,
    }
}

/// Binary units, largest first: the shift, `-S`'s suffix, the unit's name.
const UNITS: [(u32, &str, &str); 3] = [(30, "g", "GiB"), (20, "m", "MiB"), (10, "k", "KiB")];

/// `size` in the largest unit that divides it: the count, the suffix and
/// the unit's name.
fn exact_unit(size: u64) -> Option<(u64, &'static str, &'static str)> {
    UNITS
        .iter()
        .find(|(shift, ..)| size >= 1 << shift && size.is_multiple_of(1 << shift))
        .map(|&(shift, suffix, name)| (size >> shift, suffix, name))
}

/// `size` as people write it: 64, 4k, 1m, 1g when exact, else bytes.
pub fn human(size: u64) -> String {
    match exact_unit(size) {
        Some((n, suffix, _)) => format!("{n}{suffix}"),
        None => size.to_string(),
    }
}

/// `size` as a label with its unit: 64 B, 4 KiB, 1 MiB when exact, else
/// bytes (1500 B).
pub fn with_unit(size: u64) -> String {
    match exact_unit(size) {
        Some((n, _, unit)) => format!("{n} {unit}"),
        None => format!("{size} B"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_is_powers_of_two_from_1_byte_to_8_mib() {
        let all = parse("all").unwrap();
        assert_eq!(all.len(), 24);
        assert_eq!(all[0], 1);
        assert_eq!(*all.last().unwrap(), 8 << 20);
        assert!(all.windows(2).all(|w| w[1] == 2 * w[0]));
        assert_eq!(parse("ALL").unwrap(), all);
    }

    #[test]
    fn suffixes_are_binary_and_either_case() {
        assert_eq!(parse("64").unwrap(), [64]);
        assert_eq!(parse("4k").unwrap(), [4096]);
        assert_eq!(parse("4K").unwrap(), [4096]);
        assert_eq!(parse("1m,2M").unwrap(), [1 << 20, 2 << 20]);
        assert_eq!(parse("1g").unwrap(), [1 << 30]);
        assert_eq!(parse(" 64 , 1k ").unwrap(), [64, 1024]);
        assert_eq!(parse("0").unwrap(), [0]);
    }

    #[test]
    fn lists_keep_their_order() {
        assert_eq!(parse("1k,64,1k").unwrap(), [1024, 64, 1024]);
    }

    #[test]
    fn bad_sizes_name_the_item_and_the_accepted_forms() {
        for bad in ["", "x", "12x", "k", "1.5k", "-1", "64,", ",64", "1kk", "1 k"] {
            let err = parse(bad).unwrap_err();
            assert!(err.contains("all"), "{bad}: {err}");
            assert!(err.contains("suffix"), "{bad}: {err}");
        }
        assert!(parse("12x").unwrap_err().contains("`12x`"));
    }

    #[test]
    fn sizes_above_the_limit_are_refused() {
        assert!(parse("2g").unwrap_err().contains("largest size, 1g"));
        assert!(parse("99999999999999999999").is_err());
        assert!(parse("18014398509481984k").unwrap_err().contains("largest"));
    }

    #[test]
    fn defaults_are_64_bytes_to_1_mib() {
        let d = default_pingpong();
        assert_eq!((d[0], *d.last().unwrap(), d.len()), (64, 1 << 20, 15));
        assert_eq!(default_streaming(), d);
    }

    #[test]
    fn iterations_shrink_with_size_unless_given() {
        assert_eq!(iterations(64, None, false), 10_000);
        assert_eq!(iterations(64 << 10, None, false), 1000);
        assert_eq!(iterations(1 << 20, None, false), 100);
        assert_eq!(iterations(8 << 20, Some(7), false), 7);
        assert_eq!(iterations(64, None, true), 1_000_000);
        assert_eq!(iterations(64 << 10, None, true), 16384);
        assert_eq!(iterations(1 << 20, None, true), 1024);
        assert_eq!(iterations(8 << 20, None, true), 200);
        assert_eq!(iterations(0, None, true), 1_000_000);
    }

    #[test]
    fn human_sizes() {
        assert_eq!(human(64), "64");
        assert_eq!(human(4096), "4k");
        assert_eq!(human(3 << 20), "3m");
        assert_eq!(human(1500), "1500");
        assert_eq!(human(0), "0");
    }

    #[test]
    fn sizes_with_units() {
        assert_eq!(with_unit(1), "1 B");
        assert_eq!(with_unit(64), "64 B");
        assert_eq!(with_unit(4096), "4 KiB");
        assert_eq!(with_unit(1 << 20), "1 MiB");
        assert_eq!(with_unit(3 << 30), "3 GiB");
        assert_eq!(with_unit(1500), "1500 B");
        assert_eq!(with_unit(0), "0 B");
    }
}
