//! A set of logical CPU ids in upstream's text form (`k8s.io/utils/cpuset`): sorted,
//! contiguous runs written `a-b`, runs joined by commas, the empty set as "".

use std::collections::BTreeSet;
use std::fmt;

#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct CpuSet(BTreeSet<u32>);

impl CpuSet {
    pub fn new() -> Self {
        Self::default()
    }

    /// upstream's `cpuset.Parse`: "" is empty; each comma-separated element is `n` or
    /// `a-b` with a ≤ b; anything else is an error in upstream's words.
    pub fn parse(s: &str) -> Result<Self, String> {
        let mut set = BTreeSet::new();
        if s.is_empty() {
            return Ok(Self(set));
        }
        // Go's strconv.Atoi, its words.
        let number = |t: &str| {
            t.parse::<u32>().map_err(|e| {
                let why = match e.kind() {
                    std::num::IntErrorKind::PosOverflow => "value out of range",
                    _ => "invalid syntax",
                };
                format!("strconv.Atoi: parsing {t:?}: {why}")
            })
        };
        for element in s.split(',') {
            match element.split_once('-') {
                None => {
                    set.insert(number(element)?);
                }
                Some((a, b)) => {
                    let (a, b) = (number(a)?, number(b)?);
                    if a > b {
                        return Err(format!("invalid range {element:?} ({a} > {b})"));
                    }
                    set.extend(a..=b);
                }
            }
        }
        Ok(Self(set))
    }

    pub fn size(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn contains(&self, cpu: u32) -> bool {
        self.0.contains(&cpu)
    }

    pub fn is_subset_of(&self, other: &CpuSet) -> bool {
        self.0.is_subset(&other.0)
    }

    pub fn union(&self, other: &CpuSet) -> CpuSet {
        Self(self.0.union(&other.0).copied().collect())
    }

    pub fn difference(&self, other: &CpuSet) -> CpuSet {
        Self(self.0.difference(&other.0).copied().collect())
    }

    pub fn intersection(&self, other: &CpuSet) -> CpuSet {
        Self(self.0.intersection(&other.0).copied().collect())
    }

    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.0.iter().copied()
    }
}

impl FromIterator<u32> for CpuSet {
    fn from_iter<I: IntoIterator<Item = u32>>(iter: I) -> Self {
        Self(iter.into_iter().collect())
    }
}

impl fmt::Display for CpuSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut runs: Vec<(u32, u32)> = Vec::new();
        for cpu in self.iter() {
            match runs.last_mut() {
                Some((_, end)) if *end + 1 == cpu => *end = cpu,
                _ => runs.push((cpu, cpu)),
            }
        }
        let text: Vec<String> = runs
            .iter()
            .map(|(a, b)| {
                if a == b {
                    a.to_string()
                } else {
                    format!("{a}-{b}")
                }
            })
            .collect();
        f.write_str(&text.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // k8s.io/utils/cpuset's TestParse and TestString rows.
    #[test]
    fn upstream_parse_and_string_rows() {
        for (text, cpus) in [
            ("", vec![]),
            ("5", vec![5]),
            ("1,2,3,4,5", vec![1, 2, 3, 4, 5]),
            ("1-2,3-5", vec![1, 2, 3, 4, 5]),
            ("5,4,3,2,1", vec![1, 2, 3, 4, 5]),
            ("3-6,1-5", vec![1, 2, 3, 4, 5, 6]),
            ("3-3,5-5", vec![3, 5]),
        ] {
            let set = CpuSet::parse(text).unwrap();
            assert_eq!(set, cpus.iter().copied().collect::<CpuSet>(), "{text:?}");
        }
        for (cpus, text) in [
            (vec![], ""),
            (vec![5], "5"),
            (vec![1, 2, 3, 4, 5], "1-5"),
            (vec![1, 2, 3, 5, 6, 8], "1-3,5-6,8"),
        ] {
            assert_eq!(cpus.into_iter().collect::<CpuSet>().to_string(), text);
        }
        for bad in [
            "nonnumeric",
            "non-numeric",
            "no,numbers",
            "0-a",
            "a-0",
            ",",
            "0-",
            "3-1",
            "0-3-5",
            "-1",
            " 1",
            "1,",
        ] {
            assert!(CpuSet::parse(bad).is_err(), "{bad:?} parsed");
        }
        assert_eq!(
            CpuSet::parse("1.3").unwrap_err(),
            "strconv.Atoi: parsing \"1.3\": invalid syntax"
        );
        assert_eq!(
            CpuSet::parse("3-1").unwrap_err(),
            "invalid range \"3-1\" (3 > 1)"
        );
        assert_eq!(CpuSet::parse("+1").unwrap().to_string(), "1");
    }
}
