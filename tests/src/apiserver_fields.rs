//! Server-side field validation as kube-apiserver does it (`fieldValidation=Strict|Warn|
//! Ignore` on create, update and patch), and the part of the OpenAPI v3 document kubectl
//! reads to learn that the server validates.
//!
//! kubectl (`--validate=true`, its default, is `Strict`) asks `/openapi/v3` whether each
//! kind's PATCH operation takes the `fieldValidation` query parameter
//! (`resource.NewQueryParamVerifierV3`); if so it sends the directive and leaves the
//! checking to the server, and if the document is missing it falls back to validating
//! against `/openapi/v2` itself and fails (`failed to download openapi`). So this server
//! serves, for every group version it stores, each resource's operations with their
//! `x-kubernetes-group-version-kind` and parameters: not the schemas (`kubectl explain`
//! does not work), and no request body on PATCH, so that `kubectl apply` computes its
//! patch from its built-in types as against a server without OpenAPI.
//!
//! Unknown fields are found as the typed decoding finds them: the body is decoded into
//! the kind's k8s-openapi type and encoded again; a field of the body that does not come
//! back is unknown. The words are upstream's (`field_validation_test.go`, and what kubectl
//! prints: `Pod in version "v1" cannot be handled as a Pod: strict decoding error:
//! unknown field "spec.containers[0].imagee"`); a key a JSON body repeats is `duplicate
//! field "paused"`, first, as upstream lists them.

use crate::apiserver::RESOURCES;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};

/// What a request asked for in `fieldValidation` (upstream's default is `Warn`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Directive {
    Strict,
    Warn,
    Ignore,
}

impl Directive {
    /// The directive of a request's `fieldValidation`, or the 400 upstream answers for
    /// another value.
    pub fn parse(value: Option<&str>) -> Result<Directive, String> {
        match value.unwrap_or_default() {
            "Strict" => Ok(Directive::Strict),
            "" | "Warn" => Ok(Directive::Warn),
            "Ignore" => Ok(Directive::Ignore),
            other => Err(format!(
                "fieldValidation: Unsupported value: \"{other}\": supported values: \"Ignore\", \"Strict\", \"Warn\""
            )),
        }
    }
}

/// The verdict on a body: `Err` the message of the 400 to answer ([`refused`]), `Ok` the
/// warnings to send with the answer (`Warning: 299 - "unknown field \"...\""`, as many as
/// there are fields).
pub type Checked = Result<Vec<String>, String>;

/// The answer to a body refused under `Strict`: upstream's BadRequest.
pub fn refused(message: String) -> Response {
    crate::apiserver::status(StatusCode::BAD_REQUEST, "BadRequest", message)
}

/// Checks `object` (a whole object of `kind`: a create or update body, or the result of a
/// patch) under `directive`. Fields `before` (the object a patch applies to) already had
/// are not the request's: this server keeps what it was given, where upstream drops the
/// unknown fields when it stores an object.
pub fn check(
    kind: &str,
    api_version: &str,
    directive: Directive,
    duplicates: &[String],
    object: &Value,
    before: &Value,
) -> Checked {
    if directive == Directive::Ignore {
        return Ok(Vec::new());
    }
    let old = if before.is_null() {
        Vec::new()
    } else {
        problems(kind, before)
    };
    // Upstream's order: the body's repeated keys as they come, then the unknown fields.
    let problems: Vec<String> = duplicates
        .iter()
        .map(|key| format!("duplicate field \"{key}\""))
        .chain(
            problems(kind, object)
                .into_iter()
                .filter(|p| !old.contains(p)),
        )
        .collect();
    if problems.is_empty() || directive == Directive::Warn {
        return Ok(problems);
    }
    let version = api_version.rsplit('/').next().unwrap_or(api_version);
    Err(format!(
        "{kind} in version \"{version}\" cannot be handled as a {kind}: strict decoding error: {}",
        problems.join(", ")
    ))
}

/// What the typed decoding of `object` finds wrong: its unknown fields, or why it cannot
/// be decoded at all.
fn problems(kind: &str, object: &Value) -> Vec<String> {
    match known_form(kind, object) {
        Some(Ok(known)) => {
            let mut unknown = Vec::new();
            unknown_fields(object, &known, "", &mut unknown);
            unknown
                .into_iter()
                .map(|path| format!("unknown field \"{path}\""))
                .collect()
        }
        Some(Err(e)) => vec![e],
        // A kind this file does not type: nothing to check against.
        None => Vec::new(),
    }
}

/// Adds `warnings` to `response` as upstream's `Warning` headers.
pub fn with_warnings(mut response: Response, warnings: &[String]) -> Response {
    for w in warnings {
        // Go's %q of upstream's warning text; the paths are printable, so escaping the
        // quote and the backslash is the whole of it.
        let text = format!("299 - \"{}\"", w.replace('\\', "\\\\").replace('"', "\\\""));
        if let Ok(value) = axum::http::HeaderValue::from_str(&text) {
            response.headers_mut().append("warning", value);
        }
    }
    response
}

/// The keys a JSON body repeats within one object, in the body's order (upstream names
/// the key alone: `duplicate field "paused"`); serde_json would keep the last silently.
pub fn duplicate_fields(json: &[u8]) -> Vec<String> {
    use k8s_openapi::serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
    struct Repeated(Vec<String>);
    impl<'de> Deserialize<'de> for Repeated {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            d.deserialize_any(Walk)
        }
    }
    struct Walk;
    impl<'de> Visitor<'de> for Walk {
        type Value = Repeated;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("JSON")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Repeated, A::Error> {
            let (mut seen, mut repeated) = (std::collections::HashSet::new(), Vec::new());
            while let Some(key) = map.next_key::<String>()? {
                if !seen.insert(key.clone()) {
                    repeated.push(key);
                }
                repeated.extend(map.next_value::<Repeated>()?.0);
            }
            Ok(Repeated(repeated))
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Repeated, A::Error> {
            let mut repeated = Vec::new();
            while let Some(inner) = seq.next_element::<Repeated>()? {
                repeated.extend(inner.0);
            }
            Ok(Repeated(repeated))
        }
        fn visit_bool<E: de::Error>(self, _: bool) -> Result<Repeated, E> {
            Ok(Repeated(Vec::new()))
        }
        fn visit_i64<E: de::Error>(self, _: i64) -> Result<Repeated, E> {
            Ok(Repeated(Vec::new()))
        }
        fn visit_u64<E: de::Error>(self, _: u64) -> Result<Repeated, E> {
            Ok(Repeated(Vec::new()))
        }
        fn visit_f64<E: de::Error>(self, _: f64) -> Result<Repeated, E> {
            Ok(Repeated(Vec::new()))
        }
        fn visit_str<E: de::Error>(self, _: &str) -> Result<Repeated, E> {
            Ok(Repeated(Vec::new()))
        }
        fn visit_unit<E: de::Error>(self) -> Result<Repeated, E> {
            Ok(Repeated(Vec::new()))
        }
    }
    serde_json::from_slice::<Repeated>(json)
        .map(|r| r.0)
        .unwrap_or_default()
}

/// `object` decoded as its kind's type and encoded again: `None` for a kind not typed here.
fn known_form(kind: &str, object: &Value) -> Option<Result<Value, String>> {
    use k8s_openapi::api::{certificates, coordination, core, node};
    fn round<T: k8s_openapi::serde::de::DeserializeOwned + k8s_openapi::serde::Serialize>(
        v: &Value,
    ) -> Result<Value, String> {
        let typed: T = serde_json::from_value(v.clone()).map_err(|e| e.to_string())?;
        serde_json::to_value(typed).map_err(|e| e.to_string())
    }
    Some(match kind {
        "Pod" => round::<core::v1::Pod>(object),
        "Node" => round::<core::v1::Node>(object),
        "ConfigMap" => round::<core::v1::ConfigMap>(object),
        "Secret" => round::<core::v1::Secret>(object),
        "ServiceAccount" => round::<core::v1::ServiceAccount>(object),
        "Event" => round::<core::v1::Event>(object),
        "Lease" => round::<coordination::v1::Lease>(object),
        "RuntimeClass" => round::<node::v1::RuntimeClass>(object),
        "CertificateSigningRequest" => round::<certificates::v1::CertificateSigningRequest>(object),
        _ => return None,
    })
}

/// The paths (upstream's form: `spec.containers[0].imagee`) of the fields of `given` that
/// `known` lacks. A null is no field.
fn unknown_fields(given: &Value, known: &Value, path: &str, out: &mut Vec<String>) {
    match (given, known) {
        (Value::Object(given), Value::Object(known)) => {
            for (key, value) in given {
                if value.is_null() {
                    continue;
                }
                let here = if path.is_empty() {
                    key.clone()
                } else {
                    format!("{path}.{key}")
                };
                match known.get(key) {
                    Some(k) => unknown_fields(value, k, &here, out),
                    None => out.push(here),
                }
            }
        }
        (Value::Array(given), Value::Array(known)) => {
            for (i, (g, k)) in given.iter().zip(known).enumerate() {
                unknown_fields(g, k, &format!("{path}[{i}]"), out);
            }
        }
        _ => {}
    }
}

/// The OpenAPI v3 documents at `path`, if `path` is one: `/openapi/v3` (the list of group
/// versions) and `/openapi/v3/<api|apis/group>/<version>`.
pub fn openapi_document(path: &str) -> Option<Response> {
    let path = path.trim_end_matches('/');
    let doc = if path == "/openapi/v3" {
        let mut paths = Map::new();
        for gv in group_versions() {
            let at = api_path(gv);
            paths.insert(
                at.clone(),
                json!({"serverRelativeURL": format!("/openapi/v3/{at}?hash={}", hash(gv))}),
            );
        }
        json!({ "paths": paths })
    } else {
        let at = path.strip_prefix("/openapi/v3/")?;
        let gv = group_versions().into_iter().find(|gv| api_path(gv) == at)?;
        group_version_document(gv)
    };
    Some(
        (
            StatusCode::OK,
            [("content-type", "application/json")],
            doc.to_string(),
        )
            .into_response(),
    )
}

fn group_versions() -> Vec<&'static str> {
    let mut gvs: Vec<&str> = RESOURCES.iter().map(|r| r.2).collect();
    gvs.sort();
    gvs.dedup();
    gvs
}

/// `api/v1` for the core group, `apis/<group>/<version>` for the others.
fn api_path(group_version: &str) -> String {
    if group_version.contains('/') {
        format!("apis/{group_version}")
    } else {
        format!("api/{group_version}")
    }
}

/// A stable hash of a group version's document (kubectl caches documents by it).
fn hash(group_version: &str) -> String {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    group_version_document(group_version)
        .to_string()
        .hash(&mut h);
    format!("{:016X}", h.finish())
}

/// A query parameter of upstream's operations.
fn query(name: &str, description: &str) -> Value {
    json!({"name": name, "in": "query", "description": description, "schema": {"type": "string", "uniqueItems": true}})
}

fn group_version_document(group_version: &str) -> Value {
    let (group, version) = group_version.split_once('/').unwrap_or(("", group_version));
    let field_validation = query(
        "fieldValidation",
        "fieldValidation instructs the server on how to handle objects in the request containing unknown or duplicate fields. Valid values are: - Ignore - Warn (the default) - Strict",
    );
    let field_manager = query(
        "fieldManager",
        "fieldManager is a name associated with the actor or entity that is making these changes.",
    );
    let dry_run = query(
        "dryRun",
        "When present, indicates that modifications should not be persisted.",
    );
    let mut paths = Map::new();
    for (plural, kind, _, namespaced) in RESOURCES.iter().filter(|r| r.2 == group_version) {
        let gvk = json!({"group": group, "version": version, "kind": kind});
        let ns = if *namespaced {
            "namespaces/{namespace}/"
        } else {
            ""
        };
        let base = format!("/{}/{ns}{plural}", api_path(group_version));
        let op = |action: &str, params: Vec<&Value>| {
            json!({
                "x-kubernetes-action": action,
                "x-kubernetes-group-version-kind": gvk,
                "parameters": params,
                "responses": {"200": {"description": "OK"}},
            })
        };
        let writes = vec![&dry_run, &field_manager, &field_validation];
        paths.insert(
            base.clone(),
            json!({
                "get": op("list", vec![]),
                "post": op("post", writes.clone()),
            }),
        );
        paths.insert(
            format!("{base}/{{name}}"),
            json!({
                "get": op("get", vec![]),
                "put": op("put", writes.clone()),
                "patch": op("patch", writes.clone()),
                "delete": op("delete", vec![&dry_run]),
            }),
        );
        paths.insert(
            format!("{base}/{{name}}/status"),
            json!({
                "get": op("get", vec![]),
                "put": op("put", writes.clone()),
                "patch": op("patch", writes),
            }),
        );
    }
    json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": format!("v{}.{}.0", crate::apiserver_discovery::MAJOR, crate::apiserver_discovery::MINOR)},
        "paths": paths,
        "components": {"schemas": {}},
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(m: String) -> (StatusCode, String) {
        let r = refused(m);
        let code = r.status();
        let body =
            futures::executor::block_on(axum::body::to_bytes(r.into_body(), 1 << 20)).unwrap();
        let v: Value = serde_json::from_slice(&body).unwrap();
        (code, v["message"].as_str().unwrap_or_default().to_string())
    }

    fn pod(container: Value) -> Value {
        json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "labels": {"any-key": "v"}, "creationTimestamp": null},
            "spec": {"containers": [container]}})
    }

    /// What kubectl shows for a typo'd manifest (upstream's text, as users report it:
    /// `Pod in version "v1" cannot be handled as a Pod: strict decoding error: unknown
    /// field "spec.containers[0].volumeMount", unknown field "spec.volumes[0]...`).
    #[test]
    fn strict_refuses_unknown_fields_with_upstreams_words() {
        let mut body = pod(json!({"name": "c", "image": "busybox", "volumeMount": []}));
        body["spec"]["volumes"] =
            json!([{"name": "v", "presistentVolumeClaim": {"claimName": "x"}}]);
        body["metadata"]["region"] = json!("eu");
        let (code, text) =
            message(check("Pod", "v1", Directive::Strict, &[], &body, &Value::Null).unwrap_err());
        assert_eq!(code, StatusCode::BAD_REQUEST);
        assert_eq!(
            text,
            "Pod in version \"v1\" cannot be handled as a Pod: strict decoding error: unknown field \"metadata.region\", unknown field \"spec.containers[0].volumeMount\", unknown field \"spec.volumes[0].presistentVolumeClaim\""
        );
    }

    #[test]
    fn warn_and_ignore_accept_and_a_known_body_passes_strict() {
        let body = pod(json!({"name": "c", "image": "busybox", "imagee": "x"}));
        assert_eq!(
            check("Pod", "v1", Directive::Warn, &[], &body, &Value::Null).unwrap(),
            vec!["unknown field \"spec.containers[0].imagee\"".to_string()]
        );
        assert!(
            check("Pod", "v1", Directive::Ignore, &[], &body, &Value::Null)
                .unwrap()
                .is_empty()
        );
        // Labels are a map (any key), quantities may be numbers, nulls are no fields.
        let good = pod(json!({"name": "c", "image": "busybox",
            "resources": {"limits": {"cpu": 1, "memory": "64Mi"}},
            "ports": [{"containerPort": 80}], "securityContext": null}));
        assert!(
            check("Pod", "v1", Directive::Strict, &[], &good, &Value::Null)
                .unwrap()
                .is_empty()
        );
        let lease = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": "n"}, "spec": {"holderIdentity": "n", "renewTime": "2026-11-27T10:00:00.000000Z"}});
        assert!(
            check(
                "Lease",
                "coordination.k8s.io/v1",
                Directive::Strict,
                &[],
                &lease,
                &Value::Null
            )
            .unwrap()
            .is_empty()
        );
        let mut bad_lease = lease.clone();
        bad_lease["spec"]["holder"] = json!("n");
        let (_, text) = message(
            check(
                "Lease",
                "coordination.k8s.io/v1",
                Directive::Strict,
                &[],
                &bad_lease,
                &Value::Null,
            )
            .unwrap_err(),
        );
        assert!(text.starts_with("Lease in version \"v1\" cannot be handled as a Lease: strict decoding error: unknown field \"spec.holder\""), "{text}");
    }

    /// A patch is judged on what it adds: a field the stored object already had (this
    /// server stores what it is given) is not the patch's.
    #[test]
    fn a_patch_answers_for_its_own_fields_only() {
        let before = pod(json!({"name": "c", "image": "busybox", "old": 1}));
        let mut after = before.clone();
        after["metadata"]["labels"]["new"] = json!("x");
        assert!(
            check("Pod", "v1", Directive::Strict, &[], &after, &before)
                .unwrap()
                .is_empty()
        );
        after["spec"]["nodeNmae"] = json!("n");
        let (_, text) =
            message(check("Pod", "v1", Directive::Strict, &[], &after, &before).unwrap_err());
        assert!(
            text.ends_with("strict decoding error: unknown field \"spec.nodeNmae\""),
            "{text}"
        );
    }

    /// `field_validation_test.go`'s SMP body: its repeated keys in its order, the key
    /// alone, nested ones too; a key repeated in two different objects is no repeat.
    #[test]
    fn repeated_keys_are_found_as_upstream_names_them() {
        let body = br#"{"spec": {"unknown1": "val1", "unknownDupe": "valDupe",
            "unknownDupe": "valDupe2", "paused": true, "paused": false,
            "selector": {"matchLabels": {"app": "nginx"}},
            "template": {"metadata": {"labels": {"app": "nginx"}},
              "spec": {"containers": [{"name": "nginx", "unknownNested": "val1",
                "imagePullPolicy": "Always", "imagePullPolicy": "Never"}]}}}}"#;
        assert_eq!(
            duplicate_fields(body),
            vec!["unknownDupe", "paused", "imagePullPolicy"]
        );
        assert!(duplicate_fields(br#"{"a": {"x": 1}, "b": {"x": [1, {"x": null}]}}"#).is_empty());
        let pod = pod(json!({"name": "c", "image": "busybox"}));
        let dups = vec!["image".to_string()];
        let (_, text) =
            message(check("Pod", "v1", Directive::Strict, &dups, &pod, &Value::Null).unwrap_err());
        assert!(
            text.ends_with("strict decoding error: duplicate field \"image\""),
            "{text}"
        );
        assert_eq!(
            check("Pod", "v1", Directive::Warn, &dups, &pod, &Value::Null).unwrap(),
            vec!["duplicate field \"image\"".to_string()]
        );
    }

    #[test]
    fn an_unsupported_directive_is_named() {
        assert_eq!(Directive::parse(Some("Strict")), Ok(Directive::Strict));
        assert_eq!(Directive::parse(None), Ok(Directive::Warn));
        assert!(
            Directive::parse(Some("strict"))
                .unwrap_err()
                .contains("supported values")
        );
    }

    /// The document as kubectl's `supportsQueryParamV3` reads it: for the group version's
    /// path, a PATCH operation whose `x-kubernetes-group-version-kind` is the kind and
    /// whose parameters include `fieldValidation` in the query; and no request body, so
    /// `gvkSupportsPatchOpenAPIV3` sends apply to its built-in types.
    #[test]
    fn each_kinds_patch_takes_field_validation() {
        for (_, kind, gv, _) in RESOURCES {
            let doc = group_version_document(gv);
            let (group, version) = gv.split_once('/').unwrap_or(("", gv));
            let patch = doc["paths"]
                .as_object()
                .unwrap()
                .values()
                .filter_map(|p| p.get("patch"))
                .find(|op| {
                    op["x-kubernetes-group-version-kind"]
                        == json!({"group": group, "version": version, "kind": kind})
                })
                .unwrap_or_else(|| panic!("no PATCH for {kind}"));
            assert!(
                patch["parameters"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|p| p["name"] == "fieldValidation" && p["in"] == "query"),
                "{patch}"
            );
            assert!(patch.get("requestBody").is_none());
        }
        let root = openapi_document("/openapi/v3").unwrap();
        let body =
            futures::executor::block_on(axum::body::to_bytes(root.into_body(), 1 << 20)).unwrap();
        let root: Value = serde_json::from_slice(&body).unwrap();
        let core = root["paths"]["api/v1"]["serverRelativeURL"]
            .as_str()
            .unwrap();
        assert!(core.starts_with("/openapi/v3/api/v1?hash="), "{core}");
        assert!(
            root["paths"]["apis/coordination.k8s.io/v1"].is_object(),
            "{root}"
        );
        assert!(openapi_document("/openapi/v3/api/v1").is_some());
        assert!(openapi_document("/openapi/v3/apis/apps/v1").is_none());
    }
}
