//! upstream: pkg/api/v1/pod/util_test.go TestContainerHasRestartablePolicy (12 cases, the
//! table of `ContainerShouldRestart`) and TestFindMatchingContainerRestartRule (5), under
//! upstream's names. (Its TestIsContainerRestartable is not ported: upstream uses that
//! function only for a run-once pod's cgroup, which this node does not keep.)

use super::*;
use k8s_openapi::api::core::v1::ContainerRestartRuleOnExitCodes;

fn rule(operator: &str, values: &[i32]) -> ContainerRestartRule {
    ContainerRestartRule {
        action: RESTART.into(),
        exit_codes: Some(ContainerRestartRuleOnExitCodes {
            operator: operator.into(),
            values: Some(values.to_vec()),
        }),
    }
}

fn container(policy: Option<&str>, rules: Vec<ContainerRestartRule>) -> Container {
    Container {
        restart_policy: policy.map(String::from),
        restart_policy_rules: (!rules.is_empty()).then_some(rules),
        ..Default::default()
    }
}

fn pod(policy: Option<&str>) -> PodSpec {
    PodSpec {
        restart_policy: policy.map(String::from),
        ..Default::default()
    }
}

#[test]
fn test_container_has_restartable_policy() {
    let cases = [
        (
            "Rule: 'In' operator matches with 'Restart' action",
            container(Some("Never"), vec![rule("In", &[42, 50, 60])]),
            pod(None),
            42,
            true,
        ),
        (
            "Rule: 'NotIn' operator matches with 'Restart' action",
            container(Some("Never"), vec![rule("NotIn", &[0, 1, 2])]),
            pod(None),
            99,
            true,
        ),
        (
            "Rule: 'In' operator does not match, should fall back to container policy",
            container(Some("Never"), vec![rule("In", &[10, 20])]),
            pod(None),
            30,
            false,
        ),
        (
            "Rule: 'NotIn' operator does not match, should fall back to container policy",
            container(Some("Never"), vec![rule("NotIn", &[10, 20])]),
            pod(None),
            10,
            false,
        ),
        (
            "Container Policy: 'Always'",
            container(Some("Always"), vec![]),
            pod(Some("Never")),
            0,
            true,
        ),
        (
            "Container Policy: 'OnFailure' with exit code 0",
            container(Some("OnFailure"), vec![]),
            pod(Some("Never")),
            0,
            false,
        ),
        (
            "Container Policy: 'OnFailure' with non-zero exit code",
            container(Some("OnFailure"), vec![]),
            pod(Some("Never")),
            1,
            true,
        ),
        (
            "Container Policy: 'Never' should return false",
            container(Some("Never"), vec![]),
            pod(Some("Always")),
            1,
            false,
        ),
        (
            "Pod Policy: Fallback to pod 'Always'",
            container(None, vec![]),
            pod(Some("Always")),
            0,
            true,
        ),
        (
            "Pod Policy: Fallback to pod 'OnFailure' with non-zero exit code",
            container(None, vec![]),
            pod(Some("OnFailure")),
            1,
            true,
        ),
        (
            "Pod Policy: Fallback to pod 'Never'",
            container(None, vec![]),
            pod(Some("Never")),
            1,
            false,
        ),
        (
            "Pod Policy: Fallback with no policies specified should return true",
            container(None, vec![]),
            pod(None),
            0,
            true,
        ),
    ];
    for (name, c, spec, code, want) in cases {
        assert_eq!(container_should_restart(&c, &spec, code), want, "{name}");
    }
}

#[test]
fn test_find_matching_container_restart_rule() {
    let rule_in = rule("In", &[42, 50, 60]);
    let rule_not_in = rule("NotIn", &[0, 1, 2]);
    let rule_in_42 = rule("In", &[42]);
    let cases = [
        (
            "a rule with op In matches",
            container(None, vec![rule_in.clone()]),
            42,
            Some(&rule_in),
        ),
        (
            "a rule with op NotIn matches",
            container(None, vec![rule_not_in.clone()]),
            99,
            Some(&rule_not_in),
        ),
        (
            "matches the first rule if two rules both matched",
            container(None, vec![rule_in.clone(), rule_in_42]),
            42,
            Some(&rule_in),
        ),
        (
            "no rules matched",
            container(None, vec![rule_in.clone()]),
            100,
            None,
        ),
        ("no rules defined", container(None, vec![]), 0, None),
    ];
    for (name, c, code, want) in cases {
        assert_eq!(matching_rule(&c, code), want, "{name}");
    }
}
