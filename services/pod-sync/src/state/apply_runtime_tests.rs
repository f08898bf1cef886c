use super::*;

fn status(ts: i64, containers: usize) -> RuntimePodStatus {
    RuntimePodStatus {
        uid: "u".into(),
        timestamp_unix_nanos: ts,
        containers: vec![Default::default(); containers],
        ..Default::default()
    }
}

#[test]
fn an_older_status_never_overwrites_a_newer_one() {
    let mut st = State::default();
    assert!(st.apply_runtime("u", status(20, 2)));
    assert!(!st.apply_runtime("u", status(10, 1)), "older: dropped");
    assert_eq!(st.runtime["u"].containers.len(), 2);
    assert!(!st.apply_runtime("u", status(10, 0)), "an older 'gone' too");
    assert!(st.runtime.contains_key("u"));
    assert!(st.apply_runtime("u", status(20, 3)), "as new: taken");
    assert!(st.apply_runtime("u", status(0, 1)), "no timestamp: taken");
    assert!(st.apply_runtime("u", status(30, 0)));
    assert!(!st.runtime.contains_key("u"));
}
