//! Core lists in DPDK's `-l` syntax: `0-3,5` names cores 0, 1, 2, 3 and 5.
//!
//! Items are single core ids or inclusive ranges `first-last`, separated by commas. Spaces
//! around items are allowed; anything else that is not a number is an error that names the
//! offending text. The parsed list is sorted and de-duplicated, so `3,1-2,2` is `1-3`.
//!
//! [`LcoreMap`] adds DPDK's `--lcores` form, `lcores@cpu`: `0-1@0,2-3@1` runs lcores 0 and 1
//! on CPU 0 and lcores 2 and 3 on CPU 1.

use std::fmt;
use std::str::FromStr;

/// Identifier of a logical core: the operating system's CPU number, as in DPDK's `-l`.
pub type LcoreId = usize;

/// Largest core id a list may name: the kernel's affinity mask as glibc's `cpu_set_t` holds
/// it (CPU_SETSIZE = 1024 bits).
pub const MAX_LCORE_ID: LcoreId = 1023;

/// Why a core list string was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CoreListError {
    /// The string had no item at all.
    #[error("the core list is empty; write cores like `0-3,5`")]
    Empty,
    /// The list ends with a comma, as in `0-3,`.
    #[error("the core list `{list}` ends with a comma")]
    TrailingComma {
        /// The whole list as given.
        list: String,
    },
    /// An item between commas is empty, as in `0,,2` or `,1` (`position` counts from 0).
    #[error("item {position} of the core list `{list}` is empty")]
    EmptyItem {
        /// Index of the empty item among the comma-separated items.
        position: usize,
        /// The whole list as given.
        list: String,
    },
    /// A core id is not a decimal number.
    #[error("`{text}` is not a core number")]
    BadNumber {
        /// The text that should have been a number.
        text: String,
    },
    /// An item with a dash is not `first-last`, as in `1-`, `-2` or `1-2-3`.
    #[error("`{item}` is not a core range; write ranges as `first-last`, like `0-3`")]
    BadRange {
        /// The item as given.
        item: String,
    },
    /// A range whose first core is above its last, as in `5-3`.
    #[error("the range `{first}-{last}` is reversed; did you mean `{last}-{first}`?")]
    ReversedRange {
        /// First core of the range as written.
        first: LcoreId,
        /// Last core of the range as written.
        last: LcoreId,
    },
    /// An `lcores@cpu` item with nothing on one side of the `@`, or more than one `@`.
    #[error("`{item}` is not an lcore mapping; write `lcores@cpu`, like `2-3@1`")]
    BadMapping {
        /// The item as given.
        item: String,
    },
    /// An lcore named by two items of a map, as in `0@0,0@1`.
    #[error("lcore {lcore} is mapped twice in `{list}`")]
    DuplicateLcore {
        /// The lcore named twice.
        lcore: LcoreId,
        /// The whole map as given.
        list: String,
    },
    /// A core id above [`MAX_LCORE_ID`].
    #[error("core `{core}` is out of range: core ids go from 0 to {max}")]
    OutOfRange {
        /// The core id as written (it may not fit any integer).
        core: String,
        /// The largest accepted core id.
        max: LcoreId,
    },
}

/// A sorted, de-duplicated, non-empty set of core ids.
///
/// Parse one with [`str::parse`] (it implements [`FromStr`], so argument parsers take it
/// directly); [`Display`](fmt::Display) writes it back in the compact DPDK form.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CoreList {
    cores: Vec<LcoreId>,
}

impl CoreList {
    /// Builds a list from any core ids (sorted and de-duplicated here).
    pub fn from_cores(cores: impl IntoIterator<Item = LcoreId>) -> Result<Self, CoreListError> {
        let mut cores: Vec<LcoreId> = cores.into_iter().collect();
        if let Some(&core) = cores.iter().find(|&&core| core > MAX_LCORE_ID) {
            return Err(CoreListError::OutOfRange { core: core.to_string(), max: MAX_LCORE_ID });
        }
        cores.sort_unstable();
        cores.dedup();
        if cores.is_empty() {
            return Err(CoreListError::Empty);
        }
        Ok(Self { cores })
    }

    /// The default main lcore: the first (lowest) core of the list, as DPDK chooses it when
    /// `--main-lcore` is not given.
    pub fn main_lcore(&self) -> LcoreId {
        self.cores[0]
    }

    /// Whether `core` is in the list.
    pub fn contains(&self, core: LcoreId) -> bool {
        self.cores.binary_search(&core).is_ok()
    }

    /// Position of `core` in the list (DPDK's lcore index), if it is there.
    pub fn index_of(&self, core: LcoreId) -> Option<usize> {
        self.cores.binary_search(&core).ok()
    }

    /// Number of cores in the list (at least one).
    pub fn len(&self) -> usize {
        self.cores.len()
    }

    /// Always false: a list holds at least one core. Present for API symmetry with `len`.
    pub fn is_empty(&self) -> bool {
        self.cores.is_empty()
    }

    /// The cores, ascending.
    pub fn as_slice(&self) -> &[LcoreId] {
        &self.cores
    }

    /// The cores, ascending.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = LcoreId> + '_ {
        self.cores.iter().copied()
    }
}

impl<'a> IntoIterator for &'a CoreList {
    type Item = LcoreId;
    type IntoIter = std::iter::Copied<std::slice::Iter<'a, LcoreId>>;

    fn into_iter(self) -> Self::IntoIter {
        self.cores.iter().copied()
    }
}

impl FromStr for CoreList {
    type Err = CoreListError;

    fn from_str(list: &str) -> Result<Self, Self::Err> {
        if list.trim().is_empty() {
            return Err(CoreListError::Empty);
        }
        let items: Vec<&str> = list.split(',').collect();
        let mut cores = Vec::new();
        for (position, item) in items.iter().enumerate() {
            let item = item.trim();
            if item.is_empty() {
                // A trailing comma is the common slip; name it so.
                return Err(if position + 1 == items.len() {
                    CoreListError::TrailingComma { list: list.into() }
                } else {
                    CoreListError::EmptyItem { position, list: list.into() }
                });
            }
            match item.split_once('-') {
                None => cores.push(parse_core(item)?),
                Some((first, last)) => {
                    let (first, last) = (first.trim(), last.trim());
                    if first.is_empty() || last.is_empty() || last.contains('-') {
                        return Err(CoreListError::BadRange { item: item.into() });
                    }
                    let (first, last) = (parse_core(first)?, parse_core(last)?);
                    if first > last {
                        return Err(CoreListError::ReversedRange { first, last });
                    }
                    cores.extend(first..=last);
                }
            }
        }
        Self::from_cores(cores)
    }
}

fn parse_core(text: &str) -> Result<LcoreId, CoreListError> {
    // Only plain decimal digits: `+1` and the like are not core numbers.
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(CoreListError::BadNumber { text: text.into() });
    }
    match text.parse::<LcoreId>() {
        Ok(core) if core <= MAX_LCORE_ID => Ok(core),
        // All digits, so the only failure left is a number too large for any integer.
        _ => Err(CoreListError::OutOfRange { core: text.into(), max: MAX_LCORE_ID }),
    }
}

impl fmt::Display for CoreList {
    /// Writes runs of consecutive cores as ranges: `0-3,5`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut rest = self.cores.as_slice();
        let mut first_item = true;
        while let Some(&start) = rest.first() {
            let run = rest
                .iter()
                .enumerate()
                .take_while(|&(offset, &core)| core == start + offset)
                .count();
            let end = rest[run - 1];
            if !first_item {
                f.write_str(",")?;
            }
            first_item = false;
            if run == 1 {
                write!(f, "{start}")?;
            } else {
                write!(f, "{start}-{end}")?;
            }
            rest = &rest[run..];
        }
        Ok(())
    }
}

/// Lcores and the CPU each one runs on: DPDK's `--lcores`. An item `lcores@cpu` puts every
/// lcore of `lcores` (one id or a range) on `cpu`; an item without `@` runs each lcore on the
/// CPU of its own number, so every plain core list is also a map. Several lcores may share a
/// CPU: functional runs on a machine with fewer cores than lcores (a busy-polling lcore then
/// takes its CPU from the others, so such runs are not for timing; an idle strategy that
/// yields keeps them moving).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LcoreMap {
    lcores: CoreList,
    /// The CPU of each lcore, by its index in `lcores`.
    cpus: Vec<LcoreId>,
}

impl LcoreMap {
    /// Each lcore of `lcores` on the CPU of its own number (DPDK's `-l`).
    pub fn identity(lcores: CoreList) -> Self {
        let cpus = lcores.as_slice().to_vec();
        Self { lcores, cpus }
    }

    /// The lcores, ascending.
    pub fn lcores(&self) -> &CoreList {
        &self.lcores
    }

    /// The CPU `lcore` runs on, if it is in the map.
    pub fn cpu_of(&self, lcore: LcoreId) -> Option<LcoreId> {
        self.lcores.index_of(lcore).map(|i| self.cpus[i])
    }

    /// The CPUs the lcores run on, each once.
    pub fn cpus(&self) -> CoreList {
        CoreList::from_cores(self.cpus.iter().copied()).expect("a map has at least one lcore")
    }

    /// The part of the map for `lcores`; `None` if one of them is not in it.
    pub fn restricted_to(&self, lcores: &CoreList) -> Option<LcoreMap> {
        let cpus = lcores.iter().map(|l| self.cpu_of(l)).collect::<Option<Vec<_>>>()?;
        Some(Self { lcores: lcores.clone(), cpus })
    }
}

impl From<CoreList> for LcoreMap {
    fn from(lcores: CoreList) -> Self {
        Self::identity(lcores)
    }
}

impl FromStr for LcoreMap {
    type Err = CoreListError;

    fn from_str(list: &str) -> Result<Self, Self::Err> {
        if !list.contains('@') {
            return list.parse::<CoreList>().map(Self::identity);
        }
        let mut pairs: Vec<(LcoreId, LcoreId)> = Vec::new();
        for item in list.split(',') {
            let item = item.trim();
            let (lcores, cpu) = match item.split_once('@') {
                None => (item, None),
                Some((lcores, cpu)) => {
                    let (lcores, cpu) = (lcores.trim(), cpu.trim());
                    if lcores.is_empty() || cpu.is_empty() || cpu.contains('@') {
                        return Err(CoreListError::BadMapping { item: item.into() });
                    }
                    (lcores, Some(parse_core(cpu)?))
                }
            };
            // One item of a core list: a core or a range (a stray comma shows as empty).
            let lcores = lcores.parse::<CoreList>().map_err(|e| match e {
                CoreListError::Empty => {
                    CoreListError::EmptyItem { position: pairs.len(), list: list.into() }
                }
                e => e,
            })?;
            pairs.extend(lcores.iter().map(|l| (l, cpu.unwrap_or(l))));
        }
        pairs.sort_unstable();
        if let Some(w) = pairs.windows(2).find(|w| w[0].0 == w[1].0) {
            return Err(CoreListError::DuplicateLcore { lcore: w[0].0, list: list.into() });
        }
        let lcores = CoreList::from_cores(pairs.iter().map(|p| p.0))?;
        Ok(Self { lcores, cpus: pairs.into_iter().map(|p| p.1).collect() })
    }
}

impl fmt::Display for LcoreMap {
    /// The plain core list when every lcore runs on its own number, else `lcores@cpu` items,
    /// each a run of consecutive lcores on one CPU: `0-511@0,512-1023@1`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.lcores.as_slice() == self.cpus.as_slice() {
            return self.lcores.fmt(f);
        }
        let lcores = self.lcores.as_slice();
        let mut at = 0;
        while at < lcores.len() {
            let (start, cpu) = (lcores[at], self.cpus[at]);
            let run = (at..lcores.len())
                .take_while(|&i| lcores[i] == start + (i - at) && self.cpus[i] == cpu)
                .count();
            if at > 0 {
                f.write_str(",")?;
            }
            match run {
                1 => write!(f, "{start}@{cpu}")?,
                _ => write!(f, "{start}-{}@{cpu}", start + run - 1)?,
            }
            at += run;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn parse(list: &str) -> Result<Vec<LcoreId>, CoreListError> {
        list.parse::<CoreList>().map(|l| l.as_slice().to_vec())
    }

    #[test]
    fn single_core_and_ranges() {
        assert_eq!(parse("0"), Ok(vec![0]));
        assert_eq!(parse("0-3,5"), Ok(vec![0, 1, 2, 3, 5]));
        assert_eq!(parse("7-7"), Ok(vec![7]));
        assert_eq!(parse(" 1 , 3 - 4 "), Ok(vec![1, 3, 4]));
        assert_eq!(parse("1023"), Ok(vec![MAX_LCORE_ID]));
    }

    #[test]
    fn unsorted_and_overlapping_items_are_sorted_and_deduplicated() {
        assert_eq!(parse("5,0-3,2,3-6"), Ok(vec![0, 1, 2, 3, 4, 5, 6]));
        assert_eq!(parse("3,1-2,2"), Ok(vec![1, 2, 3]));
    }

    #[test]
    fn main_lcore_is_the_lowest_core() {
        let list: CoreList = "4,2-3".parse().unwrap();
        assert_eq!(list.main_lcore(), 2);
        assert_eq!(list.index_of(4), Some(2));
        assert!(!list.contains(5));
    }

    #[test]
    fn empty_list() {
        assert_eq!(parse(""), Err(CoreListError::Empty));
        assert_eq!(parse("   "), Err(CoreListError::Empty));
        assert_eq!(CoreList::from_cores([]), Err(CoreListError::Empty));
    }

    #[test]
    fn trailing_comma() {
        assert_eq!(parse("0-3,"), Err(CoreListError::TrailingComma { list: "0-3,".into() }));
    }

    #[test]
    fn empty_item() {
        assert_eq!(
            parse("0,,2"),
            Err(CoreListError::EmptyItem { position: 1, list: "0,,2".into() })
        );
        assert!(matches!(parse(",1"), Err(CoreListError::EmptyItem { position: 0, .. })));
    }

    #[test]
    fn bad_number() {
        for (list, text) in [("x", "x"), ("0,a", "a"), ("1-b", "b"), ("+1", "+1"), ("0x2", "0x2")] {
            assert_eq!(parse(list), Err(CoreListError::BadNumber { text: text.into() }), "{list}");
        }
    }

    #[test]
    fn bad_range() {
        for item in ["1-", "-2", "1-2-3", "-"] {
            assert_eq!(parse(item), Err(CoreListError::BadRange { item: item.into() }), "{item}");
        }
    }

    #[test]
    fn reversed_range() {
        let err = parse("5-3").unwrap_err();
        assert_eq!(err, CoreListError::ReversedRange { first: 5, last: 3 });
        assert!(err.to_string().contains("3-5"), "{err}");
    }

    #[test]
    fn out_of_range() {
        assert_eq!(
            parse("1024"),
            Err(CoreListError::OutOfRange { core: "1024".into(), max: MAX_LCORE_ID })
        );
        assert!(matches!(
            parse("0-99999999999999999999999"),
            Err(CoreListError::OutOfRange { .. })
        ));
        assert!(matches!(CoreList::from_cores([1, 5000]), Err(CoreListError::OutOfRange { .. })));
    }

    #[test]
    fn display_uses_ranges_for_runs() {
        let list = CoreList::from_cores([5, 0, 1, 2, 3, 7, 8, 10]).unwrap();
        assert_eq!(list.to_string(), "0-3,5,7-8,10");
    }

    proptest! {
        #[test]
        fn display_then_parse_gives_the_same_set(
            // The dense strategy makes runs, so ranges get written and read back too.
            cores in prop_oneof![
                proptest::collection::btree_set(0..=MAX_LCORE_ID, 1..64),
                proptest::collection::btree_set(0..48usize, 1..40),
            ]
        ) {
            let list = CoreList::from_cores(cores.iter().copied()).unwrap();
            let parsed: CoreList = list.to_string().parse().unwrap();
            let expected: Vec<LcoreId> = cores.into_iter().collect();
            prop_assert_eq!(parsed.as_slice(), expected.as_slice());
        }

        #[test]
        fn parsing_arbitrary_text_never_panics(text in "[0-9, \\-a]{0,16}") {
            let _ = text.parse::<CoreList>();
        }
    }

    fn map(list: &str) -> Result<Vec<(LcoreId, LcoreId)>, CoreListError> {
        let m = list.parse::<LcoreMap>()?;
        Ok(m.lcores().iter().map(|l| (l, m.cpu_of(l).unwrap())).collect())
    }

    #[test]
    fn lcore_maps_put_lcores_on_cpus() {
        assert_eq!(map("0-1@0,2-3@1"), Ok(vec![(0, 0), (1, 0), (2, 1), (3, 1)]));
        assert_eq!(map("5, 2@0"), Ok(vec![(2, 0), (5, 5)]));
        // A plain core list is the identity map.
        assert_eq!(map("0-2"), Ok(vec![(0, 0), (1, 1), (2, 2)]));
        let m: LcoreMap = "0-1@0,2-3@1".parse().unwrap();
        assert_eq!(m.cpus().as_slice(), &[0, 1]);
        assert_eq!(m.cpu_of(4), None);
        let part = m.restricted_to(&"1,3".parse().unwrap()).unwrap();
        assert_eq!(part.to_string(), "1@0,3@1");
        assert_eq!(m.restricted_to(&"4".parse().unwrap()), None);
    }

    #[test]
    fn lcore_maps_refuse_what_they_cannot_place() {
        let bad = |item: &str| Err(CoreListError::BadMapping { item: item.into() });
        assert_eq!(map("0@"), bad("0@"));
        assert_eq!(map("@1"), bad("@1"));
        assert_eq!(map("0@1@2"), bad("0@1@2"));
        assert_eq!(
            map("0-1@0,1@1"),
            Err(CoreListError::DuplicateLcore { lcore: 1, list: "0-1@0,1@1".into() })
        );
        assert_eq!(map("0@x"), Err(CoreListError::BadNumber { text: "x".into() }));
        assert_eq!(
            map("0@0,,1@1"),
            Err(CoreListError::EmptyItem { position: 1, list: "0@0,,1@1".into() })
        );
        assert!(matches!(map("3-1@0"), Err(CoreListError::ReversedRange { first: 3, last: 1 })));
    }

    #[test]
    fn lcore_maps_print_as_they_parse() {
        for text in ["0-3", "0@0,1@1,2@0,3@1", "1@5", "0-511@0,512-1023@1", "0-1@0,2@1,3-4@0"] {
            let m: LcoreMap = text.parse().unwrap();
            assert_eq!(m.to_string(), text);
            assert_eq!(m.to_string().parse::<LcoreMap>().unwrap(), m);
        }
        // A run of lcores on one CPU is one item, however it was written.
        let m: LcoreMap = "0@1,1@1,2@1,3@2".parse().unwrap();
        assert_eq!(m.to_string(), "0-2@1,3@2");
    }
}
