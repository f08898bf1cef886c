//! The query of `/containerLogs` decoded into upstream's `v1.PodLogOptions`: values that
//! do not decode give 400 (`Unable to decode query.`), values that decode but are not
//! valid (`ValidatePodLogOptions`) give 422 (`Invalid request.`), as upstream's server.

use k8s_openapi::jiff::{SignedDuration, Timestamp};

/// Which streams to return (`stream`: upstream's PodLogsQuerySplitStreams).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LogStream {
    #[default]
    All,
    Stdout,
    Stderr,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct LogOptions {
    pub follow: bool,
    pub previous: bool,
    pub timestamps: bool,
    pub tail_lines: Option<u64>,
    pub limit_bytes: Option<u64>,
    pub since_seconds: Option<i64>,
    pub since_time: Option<Timestamp>,
    pub stream: LogStream,
}

/// Why a query was refused.
#[derive(Debug, PartialEq, Eq)]
pub enum QueryError {
    /// A value does not decode (400).
    Decode(String),
    /// The options decode but are not valid (422).
    Invalid(String),
}

impl LogOptions {
    /// Decodes the query pairs; the first value of a repeated parameter counts, as with
    /// upstream's parameter codec.
    pub fn from_query(pairs: &[(String, String)]) -> Result<Self, QueryError> {
        let first = |name: &str| {
            pairs
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.as_str())
        };
        let mut tail = first("tailLines");
        // The old `tail` parameter wins, and `tail=all` means no limit.
        if let Some(t) = first("tail") {
            tail = (t != "all").then_some(t);
        }
        let opts = LogOptions {
            follow: first("follow").is_some_and(go_bool),
            previous: first("previous").is_some_and(go_bool),
            timestamps: first("timestamps").is_some_and(go_bool),
            tail_lines: tail
                .map(|v| int("tailLines", v))
                .transpose()?
                .map(|n| {
                    u64::try_from(n)
                        .map_err(|_| invalid("tailLines", "must be greater than or equal to 0"))
                })
                .transpose()?,
            limit_bytes: first("limitBytes")
                .map(|v| int("limitBytes", v))
                .transpose()?
                .map(|n| {
                    u64::try_from(n)
                        .ok()
                        .filter(|n| *n >= 1)
                        .ok_or_else(|| invalid("limitBytes", "must be greater than 0"))
                })
                .transpose()?,
            since_seconds: first("sinceSeconds")
                .map(|v| int("sinceSeconds", v))
                .transpose()?,
            since_time: first("sinceTime")
                .filter(|v| !v.is_empty() && *v != "null")
                .map(|v| {
                    v.parse::<Timestamp>().map_err(|e| {
                        QueryError::Decode(format!("sinceTime {v:?} is not an RFC3339 time: {e}"))
                    })
                })
                .transpose()?,
            stream: match first("stream") {
                None | Some("All") => LogStream::All,
                Some("Stdout") => LogStream::Stdout,
                Some("Stderr") => LogStream::Stderr,
                Some(other) => {
                    return Err(invalid(
                        "stream",
                        &format!("{other:?}: supported values: \"All\", \"Stderr\", \"Stdout\""),
                    ));
                }
            },
        };
        opts.validate()?;
        Ok(opts)
    }

    fn validate(&self) -> Result<(), QueryError> {
        if self.since_seconds.is_some_and(|s| s < 1) {
            return Err(invalid("sinceSeconds", "must be greater than 0"));
        }
        if self.since_seconds.is_some() && self.since_time.is_some() {
            return Err(invalid(
                "sinceSeconds",
                "at most one of `sinceTime` or `sinceSeconds` may be specified",
            ));
        }
        if self.tail_lines.is_some() && self.stream != LogStream::All {
            return Err(invalid(
                "tailLines",
                "`tailLines` and specific `stream` are mutually exclusive for now",
            ));
        }
        Ok(())
    }

    /// The earliest record to show: `sinceSeconds` before `now`, or `sinceTime`.
    pub fn since(&self, now: Timestamp) -> Option<Timestamp> {
        let by_seconds = self
            .since_seconds
            .and_then(|s| now.checked_sub(SignedDuration::from_secs(s)).ok());
        match (by_seconds, self.since_time) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        }
    }
}

/// Upstream's query-parameter bool: absent is false, and so are `0`, `f`, `false`, `n`
/// and `no` (any case); anything else, even an empty value, is true.
fn go_bool(v: &str) -> bool {
    !(v == "0"
        || ["f", "false", "n", "no"]
            .iter()
            .any(|f| v.eq_ignore_ascii_case(f)))
}

fn int(name: &str, v: &str) -> Result<i64, QueryError> {
    v.parse::<i64>()
        .map_err(|_| QueryError::Decode(format!("{name} {v:?} is not an integer")))
}

fn invalid(field: &str, why: &str) -> QueryError {
    QueryError::Invalid(format!("{field}: {why}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(s: &str) -> Result<LogOptions, QueryError> {
        let pairs: Vec<(String, String)> = s
            .split('&')
            .filter(|p| !p.is_empty())
            .map(|p| match p.split_once('=') {
                Some((k, v)) => (k.to_string(), v.to_string()),
                None => (p.to_string(), String::new()),
            })
            .collect();
        LogOptions::from_query(&pairs)
    }

    #[test]
    fn decodes_every_parameter() {
        let o = q("follow=true&previous=1&timestamps=yes&tailLines=5&limitBytes=10&sinceSeconds=3&insecureSkipTLSVerifyBackend=true").unwrap();
        assert!(o.follow && o.previous && o.timestamps);
        assert_eq!(o.tail_lines, Some(5));
        assert_eq!(o.limit_bytes, Some(10));
        assert_eq!(o.since_seconds, Some(3));
        let o = q("sinceTime=2024-05-01T10:00:00Z&stream=Stderr").unwrap();
        assert_eq!(o.since_time, Some("2024-05-01T10:00:00Z".parse().unwrap()));
        assert_eq!(o.stream, LogStream::Stderr);
        assert_eq!(q("").unwrap(), LogOptions::default());
    }

    #[test]
    fn bools_follow_upstream() {
        for f in ["0", "f", "FALSE", "no", "N"] {
            assert!(!q(&format!("follow={f}")).unwrap().follow, "{f}");
        }
        for t in ["1", "true", "x", ""] {
            assert!(q(&format!("follow={t}")).unwrap().follow, "{t}");
        }
        assert!(q("follow").unwrap().follow);
    }

    #[test]
    fn tail_is_the_old_name_of_tail_lines() {
        assert_eq!(q("tail=3").unwrap().tail_lines, Some(3));
        assert_eq!(q("tailLines=3&tail=all").unwrap().tail_lines, None);
    }

    #[test]
    fn undecodable_values_are_decode_errors() {
        for bad in [
            "tailLines=abc",
            "limitBytes=1.5",
            "sinceSeconds=",
            "sinceTime=yesterday",
        ] {
            assert!(matches!(q(bad), Err(QueryError::Decode(_))), "{bad}");
        }
    }

    #[test]
    fn invalid_values_are_validation_errors() {
        for bad in [
            "tailLines=-1",
            "limitBytes=0",
            "sinceSeconds=0",
            "sinceSeconds=5&sinceTime=2024-05-01T10:00:00Z",
            "stream=both",
            "stream=Stdout&tailLines=1",
        ] {
            assert!(matches!(q(bad), Err(QueryError::Invalid(_))), "{bad}");
        }
    }

    #[test]
    fn since_takes_the_later_bound() {
        let now: Timestamp = "2024-05-01T10:00:00Z".parse().unwrap();
        let o = LogOptions {
            since_seconds: Some(60),
            ..Default::default()
        };
        assert_eq!(o.since(now), Some("2024-05-01T09:59:00Z".parse().unwrap()));
        assert_eq!(LogOptions::default().since(now), None);
    }
}
