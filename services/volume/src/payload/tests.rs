//! One test per upstream rule, with upstream's wording; objects built from JSON as the API
//! server sends them.

use super::downward_api::{field_value, format_map, resource_value};
use super::*;
use k8s_openapi::api::core::v1::ResourceFieldSelector;
use serde_json::{Value, json};

fn from<T: k8s_openapi::serde::de::DeserializeOwned>(v: Value) -> T {
    serde_json::from_value(v).unwrap()
}

fn pod(spec_extra: Value) -> Pod {
    let mut spec = json!({"containers": [{"name": "c", "image": "i"}]});
    spec.as_object_mut()
        .unwrap()
        .extend(spec_extra.as_object().unwrap().clone());
    from(json!({
        "metadata": {
            "name": "web-0", "namespace": "shop", "uid": "0f3c-11",
            "labels": {"app": "web", "tier": "front"},
            "annotations": {"note": "say \"hi\"\nnow", "a.example.com/x": "é\u{a0}\\"}
        },
        "spec": spec
    }))
}

/// One file as `(path, content, mode, uid, gid)`.
type File<'a> = (&'a str, String, u32, Option<u32>, Option<u32>);

/// The payload as a list of [`File`]s, for compact assertions.
fn files(p: &Payload) -> Vec<File<'_>> {
    p.iter()
        .map(|(k, f)| {
            let data = String::from_utf8_lossy(&f.data).into_owned();
            (k.as_str(), data, f.mode, f.uid, f.gid)
        })
        .collect()
}

fn cm() -> ConfigMap {
    from(json!({
        "metadata": {"name": "cfg"},
        "data": {"app.yaml": "a: 1", "log.level": "debug"},
        "binaryData": {"logo.bin": "AAEC"}
    }))
}

fn sec() -> Secret {
    from(json!({
        "metadata": {"name": "creds"},
        "data": {"user": "YWRtaW4=", "pass": "czNjcjN0"},
        "stringData": {"ignored": "write-only"}
    }))
}

fn cm_source(v: Value) -> ConfigMapVolumeSource {
    from(v)
}

#[test]
fn a_config_map_projects_data_and_binary_data_at_0644() {
    let p = config_map(
        &cm_source(json!({"name": "cfg"})),
        Some(&cm()),
        Ownership::default(),
    )
    .unwrap();
    assert_eq!(
        files(&p),
        [
            ("app.yaml", "a: 1".into(), 0o644, None, None),
            ("log.level", "debug".into(), 0o644, None, None),
            ("logo.bin", "\0\u{1}\u{2}".into(), 0o644, None, None),
        ]
    );
}

#[test]
fn items_select_keys_with_their_paths_and_modes() {
    let source = cm_source(json!({
        "name": "cfg", "defaultMode": 0o400,
        "items": [
            {"key": "app.yaml", "path": "conf/app.yaml"},
            {"key": "logo.bin", "path": "img//logo", "mode": 0o755}
        ]
    }));
    let p = config_map(&source, Some(&cm()), Ownership::default()).unwrap();
    assert_eq!(
        files(&p),
        [
            ("conf/app.yaml", "a: 1".into(), 0o400, None, None),
            ("img/logo", "\0\u{1}\u{2}".into(), 0o755, None, None),
        ]
    );
}

#[test]
fn a_missing_key_is_an_error_unless_optional() {
    let source = json!({"name": "cfg", "items": [{"key": "nope", "path": "x"}, {"key": "app.yaml", "path": "y"}]});
    let err = config_map(
        &cm_source(source.clone()),
        Some(&cm()),
        Ownership::default(),
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "configmap references non-existent config key: nope"
    );
    let mut optional = source;
    optional["optional"] = json!(true);
    let p = config_map(&cm_source(optional), Some(&cm()), Ownership::default()).unwrap();
    assert_eq!(p.keys().collect::<Vec<_>>(), ["y"]);
}

#[test]
fn a_missing_object_is_an_error_unless_optional() {
    let err = config_map(
        &cm_source(json!({"name": "cfg"})),
        None,
        Ownership::default(),
    )
    .unwrap_err();
    assert_eq!(err.to_string(), "configmaps \"cfg\" not found");
    let source =
        cm_source(json!({"name": "cfg", "optional": true, "items": [{"key": "k", "path": "p"}]}));
    assert!(
        config_map(&source, None, Ownership::default())
            .unwrap()
            .is_empty()
    );
    let source: SecretVolumeSource = from(json!({"secretName": "creds"}));
    let err = secret(&source, None, Ownership::default()).unwrap_err();
    assert_eq!(err.to_string(), "secrets \"creds\" not found");
}

#[test]
fn a_secret_projects_its_data_only() {
    let source: SecretVolumeSource = from(json!({"secretName": "creds"}));
    let p = secret(&source, Some(&sec()), Ownership::default()).unwrap();
    assert_eq!(
        files(&p),
        [
            ("pass", "s3cr3t".into(), 0o644, None, None),
            ("user", "admin".into(), 0o644, None, None),
        ]
    );
    let source: SecretVolumeSource = from(json!({
        "secretName": "creds", "defaultMode": 0o440,
        "items": [{"key": "user", "path": "u"}, {"key": "pass", "path": "p", "mode": 0o400}]
    }));
    let p = secret(&source, Some(&sec()), Ownership::default()).unwrap();
    assert_eq!(
        files(&p),
        [
            ("p", "s3cr3t".into(), 0o400, None, None),
            ("u", "admin".into(), 0o440, None, None),
        ]
    );
    let source: SecretVolumeSource =
        from(json!({"secretName": "creds", "items": [{"key": "ignored", "path": "i"}]}));
    let err = secret(&source, Some(&sec()), Ownership::default()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "references non-existent secret key: ignored"
    );
}

#[test]
fn modes_outside_0777_are_refused() {
    let source = cm_source(json!({"name": "cfg", "defaultMode": 0o1000}));
    let err = config_map(&source, Some(&cm()), Ownership::default()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "defaultMode: Invalid value: 512: must be a number between 0 and 0777 (octal), both inclusive"
    );
    let source =
        cm_source(json!({"name": "cfg", "items": [{"key": "app.yaml", "path": "a", "mode": -1}]}));
    let err = config_map(&source, Some(&cm()), Ownership::default()).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("items[0].mode: Invalid value: -1:"),
        "{err}"
    );
}

#[test]
fn an_fs_group_adds_the_group_and_owner_and_group_read() {
    let owner = Ownership {
        fs_user: Some(1000),
        fs_group: Some(2000),
    };
    let source = cm_source(json!({
        "name": "cfg",
        "items": [
            {"key": "app.yaml", "path": "a", "mode": 0o600},
            {"key": "log.level", "path": "b", "mode": 0o000},
            {"key": "logo.bin", "path": "c", "mode": 0o755}
        ]
    }));
    let p = config_map(&source, Some(&cm()), owner).unwrap();
    let modes: Vec<_> = p.values().map(|f| (f.mode, f.uid, f.gid)).collect();
    assert_eq!(
        modes,
        [
            (0o640, None, Some(2000)),
            (0o440, None, Some(2000)),
            (0o755, None, Some(2000))
        ],
        "the fsUser is for tokens only"
    );
}

#[test]
fn ownership_follows_fs_group_and_fs_user_from() {
    let o = Ownership::of(&pod(
        json!({"securityContext": {"fsGroup": 2000, "runAsUser": 1000}}),
    ));
    assert_eq!(
        o,
        Ownership {
            fs_user: Some(1000),
            fs_group: Some(2000)
        }
    );
    // A container's runAsUser overrides the pod's; all (init) containers must agree.
    let o = Ownership::of(&pod(json!({
        "securityContext": {"runAsUser": 1000},
        "containers": [{"name": "a", "securityContext": {"runAsUser": 7}}, {"name": "b", "securityContext": {"runAsUser": 7}}],
        "initContainers": [{"name": "i", "securityContext": {"runAsUser": 7}}]
    })));
    assert_eq!(
        o,
        Ownership {
            fs_user: Some(7),
            fs_group: None
        }
    );
    let o = Ownership::of(&pod(json!({
        "securityContext": {"runAsUser": 1000},
        "containers": [{"name": "a"}, {"name": "b", "securityContext": {"runAsUser": 7}}]
    })));
    assert_eq!(o.fs_user, None, "two users");
    let o = Ownership::of(&pod(json!({
        "containers": [{"name": "a"}, {"name": "b", "securityContext": {"runAsUser": 7}}]
    })));
    assert_eq!(o.fs_user, None, "one container without a user");
    assert_eq!(Ownership::of(&pod(json!({}))), Ownership::default());
}

#[test]
fn pod_fields_are_extracted_as_upstream() {
    let p = pod(json!({}));
    assert_eq!(field_value(&p, "metadata.name").unwrap(), "web-0");
    assert_eq!(field_value(&p, "metadata.namespace").unwrap(), "shop");
    assert_eq!(field_value(&p, "metadata.uid").unwrap(), "0f3c-11");
    assert_eq!(
        field_value(&p, "metadata.labels").unwrap(),
        "app=\"web\"\ntier=\"front\""
    );
    assert_eq!(
        field_value(&p, "metadata.annotations").unwrap(),
        "a.example.com/x=\"é\\u00a0\\\\\"\nnote=\"say \\\"hi\\\"\\nnow\""
    );
    assert_eq!(field_value(&p, "metadata.labels['app']").unwrap(), "web");
    assert_eq!(field_value(&p, "metadata.labels['absent']").unwrap(), "");
    assert_eq!(
        field_value(&p, "metadata.annotations['A.example.com/X']").unwrap(),
        ""
    );
    assert_eq!(
        field_value(&p, "metadata.annotations['a.example.com/x']").unwrap(),
        "é\u{a0}\\"
    );
    assert_eq!(
        field_value(&p, "spec.nodeName").unwrap_err(),
        "unsupported fieldPath: spec.nodeName"
    );
    assert_eq!(
        field_value(&p, "metadata.name['x']").unwrap_err(),
        "fieldPath \"metadata.name['x']\" does not support subscript"
    );
    assert_eq!(
        field_value(&p, "metadata.labels['-bad']").unwrap_err(),
        "invalid key subscript in metadata.labels['-bad']: name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
    );
    let err = field_value(&p, "metadata.labels['Bad_Prefix/x']").unwrap_err();
    assert!(
        err.contains(": prefix part a lowercase RFC 1123 subdomain"),
        "{err}"
    );
    let err = field_value(&p, "metadata.labels['a/b/c']").unwrap_err();
    assert!(err.contains(": a qualified name must consist of"), "{err}");
}

#[test]
fn maps_are_formatted_as_go_does() {
    let m: BTreeMap<String, String> = [("b".into(), "2".into()), ("a".into(), "1".into())].into();
    assert_eq!(format_map(Some(&m)), "a=\"1\"\nb=\"2\"");
    assert_eq!(format_map(None), "");
}

fn with_resources(resources: Value) -> Pod {
    pod(json!({
        "containers": [{"name": "app", "resources": resources}],
        "initContainers": [{"name": "init", "resources": {"limits": {"cpu": "2"}}}]
    }))
}

fn selector(resource: &str, divisor: Option<&str>) -> ResourceFieldSelector {
    from(json!({"containerName": "app", "resource": resource, "divisor": divisor}))
}

fn allocatable() -> BTreeMap<String, Quantity> {
    [
        ("cpu", "4"),
        ("memory", "8Gi"),
        ("ephemeral-storage", "100Gi"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), Quantity(v.into())))
    .collect()
}

#[test]
fn resources_are_divided_and_rounded_up() {
    let p = with_resources(json!({
        "limits": {"cpu": "250m", "memory": "100Mi", "ephemeral-storage": "1G", "hugepages-2Mi": "4Mi"},
        "requests": {"cpu": "1.5", "memory": "1000", "hugepages-2Mi": "4Mi"}
    }));
    let node = allocatable();
    let value = |r: &str, d: Option<&str>| resource_value(&selector(r, d), &p, &node).unwrap();
    assert_eq!(value("limits.cpu", None), "1", "250m rounds up to 1 cpu");
    assert_eq!(value("limits.cpu", Some("1m")), "250");
    assert_eq!(value("limits.cpu", Some("0")), "1", "a zero divisor is 1");
    assert_eq!(value("requests.cpu", None), "2");
    assert_eq!(value("requests.cpu", Some("1m")), "1500");
    assert_eq!(value("limits.memory", None), "104857600");
    assert_eq!(value("limits.memory", Some("1Mi")), "100");
    assert_eq!(
        value("limits.memory", Some("1G")),
        "1",
        "104857600 B is 0.1 G, rounded up"
    );
    assert_eq!(
        value("requests.memory", Some("1Ki")),
        "1",
        "1000 B rounds up to 1 Ki"
    );
    assert_eq!(value("limits.ephemeral-storage", Some("1M")), "1000");
    assert_eq!(
        value("requests.ephemeral-storage", None),
        "0",
        "an unset request is 0"
    );
    assert_eq!(value("limits.hugepages-2Mi", Some("1Mi")), "4");
    assert_eq!(value("requests.hugepages-2Mi", Some("1Mi")), "4");
    assert_eq!(
        value("limits.hugepages-1Gi", None),
        "0",
        "hugepages never default to the node"
    );
}

#[test]
fn an_unset_or_zero_limit_is_the_node_allocatable() {
    let p = with_resources(json!({"limits": {"cpu": "0"}}));
    let node = allocatable();
    let value = |r: &str, d: Option<&str>| resource_value(&selector(r, d), &p, &node).unwrap();
    assert_eq!(value("limits.cpu", None), "4");
    assert_eq!(value("limits.memory", Some("1Gi")), "8");
    assert_eq!(value("limits.ephemeral-storage", Some("1Gi")), "100");
    assert_eq!(
        resource_value(&selector("limits.memory", None), &p, &BTreeMap::new()).unwrap(),
        "0"
    );
    let init: ResourceFieldSelector =
        from(json!({"containerName": "init", "resource": "limits.cpu", "divisor": "1m"}));
    assert_eq!(
        resource_value(&init, &p, &node).unwrap(),
        "2000",
        "init containers are found too"
    );
}

#[test]
fn resource_errors_use_upstream_wording() {
    let p = with_resources(json!({}));
    let node = allocatable();
    let missing: ResourceFieldSelector =
        from(json!({"containerName": "nope", "resource": "limits.cpu"}));
    assert_eq!(
        resource_value(&missing, &p, &node).unwrap_err(),
        "container nope not found"
    );
    assert_eq!(
        resource_value(&selector("limits.gpu", None), &p, &node).unwrap_err(),
        "unsupported container resource : limits.gpu"
    );
    let err = resource_value(&selector("limits.cpu", Some("lots")), &p, &node).unwrap_err();
    assert!(err.contains("invalid quantity"), "{err}");
}

#[test]
fn a_downward_api_volume_collects_every_item_and_every_error() {
    let p = with_resources(json!({"limits": {"memory": "64Mi"}}));
    let source: DownwardAPIVolumeSource = from(json!({
        "defaultMode": 0o444,
        "items": [
            {"path": "name", "fieldRef": {"fieldPath": "metadata.name"}},
            {"path": "./meta//labels", "fieldRef": {"fieldPath": "metadata.labels"}, "mode": 0o400},
            {"path": "mem", "resourceFieldRef": {"containerName": "app", "resource": "limits.memory", "divisor": "1Mi"}}
        ]
    }));
    let got = downward_api(&source, &p, &allocatable(), Ownership::default()).unwrap();
    assert_eq!(
        files(&got),
        [
            ("mem", "64".into(), 0o444, None, None),
            (
                "meta/labels",
                "app=\"web\"\ntier=\"front\"".into(),
                0o400,
                None,
                None
            ),
            ("name", "web-0".into(), 0o444, None, None),
        ]
    );
    let bad: DownwardAPIVolumeSource = from(json!({"items": [
        {"path": "a", "fieldRef": {"fieldPath": "spec.nodeName"}},
        {"path": "b", "fieldRef": {"fieldPath": "metadata.uid"}},
        {"path": "c", "resourceFieldRef": {"containerName": "x", "resource": "limits.cpu"}}
    ]}));
    let err = downward_api(&bad, &p, &allocatable(), Ownership::default()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "[unsupported fieldPath: spec.nodeName, container x not found]"
    );
}

fn objects() -> ApiObjects {
    let token_key = TokenRequestKey {
        audience: String::new(),
        expiration_seconds: 3607,
    };
    ApiObjects {
        config_maps: [
            (
                "kube-root-ca.crt".to_string(),
                Ok(Some(from(
                    json!({"metadata": {"name": "kube-root-ca.crt"}, "data": {"ca.crt": "CA"}}),
                ))),
            ),
            ("cfg".to_string(), Ok(Some(cm()))),
            ("gone".to_string(), Ok(None)),
        ]
        .into(),
        secrets: [
            ("creds".to_string(), Ok(Some(sec()))),
            (
                "broken".to_string(),
                Err("secrets \"broken\" is forbidden".to_string()),
            ),
        ]
        .into(),
        tokens: [
            (token_key, Ok(b"eyJtoken".to_vec())),
            (
                TokenRequestKey {
                    audience: "vault".into(),
                    expiration_seconds: 600,
                },
                Err("serviceaccounts \"default\" not found".into()),
            ),
        ]
        .into(),
        node_allocatable: allocatable(),
        claimed: Default::default(),
    }
}

/// The volume an API server adds to every pod with a service account.
fn kube_api_access() -> Volume {
    from(json!({
        "name": "kube-api-access-x7k2p",
        "projected": {
            "defaultMode": 420,
            "sources": [
                {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}
            ]
        }
    }))
}

#[test]
fn the_kube_api_access_volume_is_token_ca_and_namespace() {
    let got = volume_payload(&kube_api_access(), &pod(json!({})), &objects())
        .unwrap()
        .unwrap();
    assert_eq!(
        files(&got),
        [
            ("ca.crt", "CA".into(), 0o644, None, None),
            ("namespace", "shop".into(), 0o644, None, None),
            ("token", "eyJtoken".into(), 0o644, None, None),
        ]
    );
}

#[test]
fn a_token_is_0600_for_the_fs_user_and_0640_with_an_fs_group() {
    let user_only = pod(json!({"securityContext": {"runAsUser": 1000}}));
    let got = volume_payload(&kube_api_access(), &user_only, &objects())
        .unwrap()
        .unwrap();
    let token = &got["token"];
    assert_eq!(
        (token.mode, token.uid, token.gid),
        (0o600, Some(1000), None)
    );
    assert_eq!((got["ca.crt"].mode, got["ca.crt"].uid), (0o644, None));

    let both = pod(json!({"securityContext": {"runAsUser": 1000, "fsGroup": 3000}}));
    let got = volume_payload(&kube_api_access(), &both, &objects())
        .unwrap()
        .unwrap();
    let token = &got["token"];
    assert_eq!(
        (token.mode, token.uid, token.gid),
        (0o640, Some(1000), Some(3000))
    );
    assert_eq!((got["ca.crt"].mode, got["ca.crt"].gid), (0o644, Some(3000)));

    let group_only = pod(json!({"securityContext": {"fsGroup": 3000}}));
    let got = volume_payload(&kube_api_access(), &group_only, &objects())
        .unwrap()
        .unwrap();
    let token = &got["token"];
    assert_eq!(
        (token.mode, token.uid, token.gid),
        (0o640, None, Some(3000))
    );
}

#[test]
fn projected_sources_combine_and_a_later_source_wins_a_shared_path() {
    let source: ProjectedVolumeSource = from(json!({
        "defaultMode": 0o440,
        "sources": [
            {"configMap": {"name": "cfg", "items": [{"key": "app.yaml", "path": "shared"}, {"key": "log.level", "path": "level", "mode": 0o600}]}},
            {"secret": {"name": "creds", "items": [{"key": "user", "path": "shared"}]}},
            {"secret": {"name": "missing-but-optional", "optional": true}},
            {"configMap": {"name": "gone", "optional": true, "items": [{"key": "k", "path": "k"}]}},
            {}
        ]
    }));
    let mut objs = objects();
    objs.secrets.insert("missing-but-optional".into(), Ok(None));
    let got = projected(&source, &pod(json!({})), &objs, Ownership::default()).unwrap();
    assert_eq!(
        files(&got),
        [
            ("level", "debug".into(), 0o600, None, None),
            ("shared", "admin".into(), 0o440, None, None),
        ]
    );
}

#[test]
fn every_failing_projected_source_is_reported() {
    let source: ProjectedVolumeSource = from(json!({"sources": [
        {"configMap": {"name": "gone"}},
        {"secret": {"name": "broken"}},
        {"serviceAccountToken": {"audience": "vault", "expirationSeconds": 600, "path": "vault-token"}},
        {"configMap": {"name": "cfg", "items": [{"key": "nope", "path": "x"}]}},
        {"clusterTrustBundle": {"path": "bundle.pem", "name": "b"}},
        {"configMap": {"name": "never-fetched"}}
    ]}));
    let err = projected(&source, &pod(json!({})), &objects(), Ownership::default()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "[configmaps \"gone\" not found, secrets \"broken\" is forbidden, \
         serviceaccounts \"default\" not found, configmap references non-existent config key: nope, \
         clusterTrustBundle projections are not supported by this node agent yet, \
         configmaps \"never-fetched\" was not fetched]"
    );
    let one: ProjectedVolumeSource = from(json!({"sources": [{"configMap": {"name": "gone"}}]}));
    let err = projected(&one, &pod(json!({})), &objects(), Ownership::default()).unwrap_err();
    assert_eq!(
        err,
        PayloadError::NotFound {
            resource: "configmaps",
            name: "gone".into()
        }
    );
}

#[test]
fn references_list_what_to_fetch() {
    let p = pod(json!({"volumes": [
        {"name": "a", "configMap": {"name": "cfg"}},
        {"name": "b", "secret": {"secretName": "creds"}},
        {"name": "c", "emptyDir": {}},
        {"name": "d", "downwardAPI": {"items": [{"path": "n", "fieldRef": {"fieldPath": "metadata.name"}}]}},
        {"name": "e", "projected": {"sources": [
            {"serviceAccountToken": {"path": "t"}},
            {"serviceAccountToken": {"path": "v", "audience": "vault", "expirationSeconds": 600}},
            {"secret": {"name": "tls"}},
            {"configMap": {"name": "cfg"}}
        ]}}
    ]}));
    let refs = References::of_pod(&p);
    assert_eq!(refs.config_maps, BTreeSet::from(["cfg".to_string()]));
    assert_eq!(
        refs.secrets,
        BTreeSet::from(["creds".to_string(), "tls".to_string()])
    );
    assert_eq!(
        refs.tokens,
        BTreeSet::from([
            TokenRequestKey {
                audience: String::new(),
                expiration_seconds: 3600
            },
            TokenRequestKey {
                audience: "vault".into(),
                expiration_seconds: 600
            },
        ])
    );
    assert!(!refs.node_allocatable);
    assert!(
        References::of_volume(&from(json!({"name": "r", "downwardAPI": {"items": [
            {"path": "m", "resourceFieldRef": {"containerName": "c", "resource": "limits.memory"}}
        ]}})))
        .node_allocatable
    );
}

#[test]
fn volume_payload_dispatches_by_kind() {
    let p = pod(json!({}));
    let objs = objects();
    let vol = |v: Value| -> Volume { from(v) };
    let empty = vol(json!({"name": "e", "emptyDir": {}}));
    assert_eq!(plugin_dir(&empty), None);
    assert_eq!(volume_payload(&empty, &p, &objs).unwrap(), None);
    let c = vol(
        json!({"name": "c", "configMap": {"name": "cfg", "items": [{"key": "app.yaml", "path": "a"}]}}),
    );
    assert_eq!(plugin_dir(&c), Some("kubernetes.io~configmap"));
    assert_eq!(
        volume_payload(&c, &p, &objs).unwrap().unwrap()["a"].data,
        b"a: 1"
    );
    let s = vol(
        json!({"name": "s", "secret": {"secretName": "creds", "items": [{"key": "user", "path": "u"}]}}),
    );
    assert_eq!(plugin_dir(&s), Some("kubernetes.io~secret"));
    assert_eq!(
        volume_payload(&s, &p, &objs).unwrap().unwrap()["u"].data,
        b"admin"
    );
    let d = vol(
        json!({"name": "d", "downwardAPI": {"items": [{"path": "n", "fieldRef": {"fieldPath": "metadata.name"}}]}}),
    );
    assert_eq!(plugin_dir(&d), Some("kubernetes.io~downward-api"));
    assert_eq!(
        volume_payload(&d, &p, &objs).unwrap().unwrap()["n"].data,
        b"web-0"
    );
    assert_eq!(
        plugin_dir(&kube_api_access()),
        Some("kubernetes.io~projected")
    );
    let gone = vol(json!({"name": "g", "configMap": {"name": "gone"}}));
    assert_eq!(
        volume_payload(&gone, &p, &objs).unwrap_err().to_string(),
        "configmaps \"gone\" not found"
    );
    let gone_optional = vol(json!({"name": "g", "configMap": {"name": "gone", "optional": true}}));
    assert_eq!(
        volume_payload(&gone_optional, &p, &objs).unwrap(),
        Some(Payload::new())
    );
    let broken = vol(json!({"name": "b", "secret": {"secretName": "broken", "optional": true}}));
    assert_eq!(
        volume_payload(&broken, &p, &objs).unwrap_err(),
        PayloadError::Fetch("secrets \"broken\" is forbidden".into()),
        "optional covers a missing object, not a failed fetch"
    );
}

#[test]
fn a_payload_is_written_as_the_volume() {
    let got = volume_payload(&kube_api_access(), &pod(json!({})), &objects())
        .unwrap()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    assert!(crate::atomic_writer::write(dir.path(), &got).unwrap());
    assert_eq!(
        std::fs::read_to_string(dir.path().join("namespace")).unwrap(),
        "shop"
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("token")).unwrap(),
        "eyJtoken"
    );
    // A hostile item path reaches the writer intact and is refused there.
    let hostile: Volume = from(json!({"name": "h", "configMap": {"name": "cfg", "items": [
        {"key": "app.yaml", "path": "a/../../etc"}
    ]}}));
    let payload = volume_payload(&hostile, &pod(json!({})), &objects())
        .unwrap()
        .unwrap();
    let err = crate::atomic_writer::write(dir.path(), &payload).unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid path: must not contain '..': a/../../etc"
    );
}
