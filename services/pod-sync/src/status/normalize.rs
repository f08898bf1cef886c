//! Upstream's status manager `normalizeStatus` (pkg/kubelet/status/status_manager.go), the
//! part a user sees: the pod's termination messages share
//! `MaxPodTerminationMessageLogLength` (12 KiB) evenly, each container status's current
//! and last termination message cut to its share (12 KiB over the number of init, regular
//! and ephemeral container statuses), so that one container's long message cannot crowd
//! out the others'.

use k8s_openapi::api::core::v1::{ContainerState, ContainerStatus};

/// Upstream `MaxPodTerminationMessageLogLength`: all of one pod's messages together.
pub const MAX_POD_MESSAGES_BYTES: usize = 12 * 1024;

/// Cuts every termination message of `lists` to its even share of the pod's budget.
pub fn truncate_messages(lists: [&mut [ContainerStatus]; 3]) {
    let count: usize = lists.iter().map(|l| l.len()).sum();
    let share = MAX_POD_MESSAGES_BYTES / count.max(1);
    let cut = |state: &mut Option<ContainerState>| {
        let Some(message) = state
            .as_mut()
            .and_then(|s| s.terminated.as_mut())
            .and_then(|t| t.message.as_mut())
        else {
            return;
        };
        if message.len() > share {
            // Go slices bytes; a message cut inside a character keeps the whole ones.
            let mut end = share;
            while !message.is_char_boundary(end) {
                end -= 1;
            }
            message.truncate(end);
        }
    };
    for list in lists {
        for s in list.iter_mut() {
            cut(&mut s.state);
            cut(&mut s.last_state);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ContainerStateTerminated;

    fn with_last_message(name: String, message: String) -> ContainerStatus {
        ContainerStatus {
            name,
            last_state: Some(ContainerState {
                terminated: Some(ContainerStateTerminated {
                    message: Some(message),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn message_len(s: &ContainerStatus) -> usize {
        s.last_state
            .as_ref()
            .and_then(|l| l.terminated.as_ref())
            .and_then(|t| t.message.as_ref())
            .map_or(0, String::len)
    }

    /// upstream `TestStatusNormalizationEnforcesMaxBytes`, both its versions: 48
    /// containers with messages of 192 to 208 bytes, split 24/24 (init, regular) and
    /// 16/16/16 (init, regular, ephemeral); every message of the init containers stays
    /// between 192 and 256 bytes and together within 12 KiB.
    #[test]
    fn test_status_normalization_enforces_max_bytes() {
        let all: Vec<ContainerStatus> = (0..48)
            .map(|i| with_last_message(format!("container{i}"), "abcdefgh".repeat(24 + i % 3)))
            .collect();
        for split in [[0, 24, 48, 48], [0, 16, 32, 48]] {
            let mut init = all[split[0]..split[1]].to_vec();
            let mut app = all[split[1]..split[2]].to_vec();
            let mut ephemeral = all[split[2]..split[3]].to_vec();
            truncate_messages([&mut init, &mut app, &mut ephemeral]);
            let mut count = 0;
            for s in &init {
                let l = message_len(s);
                assert!((192..=256).contains(&l), "container message had length {l}");
                count += l;
            }
            assert!(
                count <= MAX_POD_MESSAGES_BYTES,
                "message length not truncated"
            );
        }
    }

    /// Four containers with 4 KiB messages each get 3 KiB each (upstream: 12288 / 4), not
    /// the first three everything and the last nothing; a cut inside a character keeps
    /// the whole ones before it.
    #[test]
    fn the_budget_is_shared_evenly_and_cut_on_characters() {
        let mut app: Vec<ContainerStatus> = (0..4)
            .map(|i| with_last_message(format!("c{i}"), "x".repeat(4096)))
            .collect();
        app[0].state = app[0].last_state.clone();
        truncate_messages([&mut [], &mut app, &mut []]);
        assert!(app.iter().all(|s| message_len(s) == 3072));
        let current = app[0].state.as_ref().unwrap().terminated.as_ref().unwrap();
        assert_eq!(current.message.as_ref().unwrap().len(), 3072);

        let mut one = vec![with_last_message("c".into(), "é".repeat(7000))];
        let mut others: Vec<ContainerStatus> = (0..3)
            .map(|i| ContainerStatus {
                name: format!("o{i}"),
                ..Default::default()
            })
            .collect();
        truncate_messages([&mut [], &mut one, &mut others]);
        assert_eq!(message_len(&one[0]), 3072);
        let mut odd = vec![with_last_message(
            "c".into(),
            format!("a{}", "é".repeat(7000)),
        )];
        truncate_messages([&mut [], &mut odd, &mut others]);
        // 3072 falls inside a two-byte character: 3071 bytes are kept.
        assert_eq!(message_len(&odd[0]), 3071);
    }
}
