use super::*;
use nodeagent_proto::api::RuntimeContainer;

#[test]
fn entries_of_containers_the_runtime_no_longer_has_are_pruned() {
    let mut st = State::default();
    st.termination_messages.insert("gone".into(), "bye".into());
    st.termination_messages.insert("live".into(), "hi".into());
    st.liveness_failed.insert("gone".into());
    st.prune_containers();
    assert_eq!(st.termination_messages.len(), 2, "no runtime view yet");
    st.pleg_synced = true;
    st.runtime.insert(
        "u1".into(),
        RuntimePodStatus {
            containers: vec![RuntimeContainer {
                id: "live".into(),
                ..Default::default()
            }],
            ..Default::default()
        },
    );
    st.prune_containers();
    assert_eq!(
        st.termination_messages.keys().collect::<Vec<_>>(),
        vec!["live"]
    );
    assert!(st.liveness_failed.is_empty());
}
