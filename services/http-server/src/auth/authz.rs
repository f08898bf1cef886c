//! What a request may do, as upstream's kubelet authorizer: the request becomes
//! attributes of the node object (`GetRequestAttributes`: verb from the method, resource
//! `nodes`, name the node, a subresource from the path, with `KubeletFineGrainedAuthz`'s
//! finer subresource first, on by default since 1.33), each checked in turn until one is
//! allowed; `AlwaysAllow` or `Webhook` (SubjectAccessReview, answers cached for
//! `cacheAuthorizedTTL` / `cacheUnauthorizedTTL`).

use super::UserInfo;
use super::cache::{CAPACITY, ReviewCache};
use axum::http::Method;
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use std::time::Duration;

/// The attributes of one check (they differ only by subresource).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attributes {
    pub verb: &'static str,
    pub subresource: &'static str,
}

/// Upstream's verb mapping; any other method (HEAD, OPTIONS) gets the empty verb, as
/// upstream, which no RBAC rule grants.
pub fn verb(method: &Method) -> &'static str {
    match *method {
        Method::POST => "create",
        Method::GET => "get",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE => "delete",
        _ => "",
    }
}

/// Upstream's `isSubpath`: `path` is `prefix` (its trailing slash ignored) or below it.
fn is_subpath(path: &str, prefix: &str) -> bool {
    let prefix = prefix.strip_suffix('/').unwrap_or(prefix);
    path == prefix
        || path
            .strip_prefix(prefix)
            .is_some_and(|r| r.starts_with('/'))
}

/// The subresources to try, in order: a fine-grained one (`pods`, `healthz`, `configz`,
/// `statusz`) if the path has one, then `stats`, `metrics`, `log`, `checkpoint` or
/// `proxy`.
pub fn subresources(path: &str) -> Vec<&'static str> {
    let mut out = Vec::with_capacity(2);
    let fine = [
        ("/pods", "pods"),
        ("/healthz", "healthz"),
        ("/configz", "configz"),
        ("/statusz", "statusz"),
        ("/runningpods/", "pods"),
        // The node's web page (issue 34): a subresource of its own, as the fine-grained
        // ones above, then `proxy`.
        ("/ui", "ui"),
    ];
    if let Some((_, s)) = fine.iter().find(|(p, _)| is_subpath(path, p)) {
        out.push(*s);
    }
    let coarse = [
        ("/stats/", "stats"),
        ("/metrics", "metrics"),
        ("/logs/", "log"),
        ("/checkpoint/", "checkpoint"),
    ];
    out.push(
        coarse
            .iter()
            .find(|(p, _)| is_subpath(path, p))
            .map_or("proxy", |(_, s)| *s),
    );
    out
}

pub fn attributes(method: &Method, path: &str) -> Vec<Attributes> {
    let verb = verb(method);
    subresources(path)
        .into_iter()
        .map(|subresource| Attributes { verb, subresource })
        .collect()
}

/// The checks a request must pass, each a list of alternatives (one allowed is enough):
/// its path's own, then, for the node page's data calls, those of the path the same data
/// comes from on its own, so that `nodes/ui` shows nobody more than the raw API would: a
/// pod's events, probes, volumes and traces need what `/pods` needs, the history what
/// `/stats/summary` needs.
pub fn checks(method: &Method, path: &str) -> Vec<Vec<Attributes>> {
    let mut out = vec![attributes(method, path)];
    let same_data_as = match path {
        "/ui/api/pod" => Some("/pods"),
        "/ui/api/history" => Some("/stats/summary"),
        _ => None,
    };
    out.extend(same_data_as.map(|p| attributes(method, p)));
    out
}

/// A check's outcome.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    Allow,
    /// Not allowed, with the reason to log.
    Deny(String),
}

pub enum Authorizer {
    AlwaysAllow,
    /// `Webhook` on a node without an API server: nothing can be allowed.
    Unavailable,
    Webhook(Box<SarWebhook>),
}

pub struct SarWebhook {
    client: kube::Client,
    node: String,
    allowed_ttl: Duration,
    denied_ttl: Duration,
    /// The review's spec (JSON) -> (allowed, reason).
    cache: ReviewCache<String, (bool, String)>,
}

impl Authorizer {
    pub fn new(
        authz: &nodeagent_config::KubeletAuthorization,
        node: &str,
        api: Option<kube::Client>,
    ) -> Self {
        match (authz.mode.as_str(), api) {
            ("AlwaysAllow", _) => Authorizer::AlwaysAllow,
            (_, None) => {
                tracing::warn!(
                    "authorization.mode is Webhook but the node has no API server \
                     (--kubeconfig): every request to the kubelet API gets 403; set \
                     authorization.mode: AlwaysAllow for a standalone node"
                );
                Authorizer::Unavailable
            }
            (_, Some(client)) => Authorizer::Webhook(Box::new(SarWebhook {
                client,
                node: node.to_string(),
                allowed_ttl: authz.webhook.cache_authorized_ttl,
                denied_ttl: authz.webhook.cache_unauthorized_ttl,
                cache: ReviewCache::new(CAPACITY),
            })),
        }
    }

    /// Err when the webhook could not be asked (upstream answers 500).
    pub async fn authorize(&self, user: &UserInfo, attrs: &Attributes) -> Result<Decision, String> {
        let webhook = match self {
            Authorizer::AlwaysAllow => return Ok(Decision::Allow),
            Authorizer::Unavailable => {
                return Ok(Decision::Deny(
                    "authorization mode Webhook needs an API server; this node runs standalone"
                        .into(),
                ));
            }
            Authorizer::Webhook(webhook) => webhook,
        };
        let spec = review_spec(user, attrs, &webhook.node);
        let key = serde_json::to_string(&spec).map_err(|e| e.to_string())?;
        let review = review_access(webhook.client.clone(), spec);
        let (allowed_ttl, denied_ttl) = (webhook.allowed_ttl, webhook.denied_ttl);
        let ttl = move |(allowed, _): &(bool, String)| {
            if *allowed { allowed_ttl } else { denied_ttl }
        };
        let (allowed, reason) = webhook.cache.get_or_review(key, review, ttl).await?;
        Ok(if allowed {
            Decision::Allow
        } else {
            Decision::Deny(reason)
        })
    }
}

fn review_spec(user: &UserInfo, attrs: &Attributes, node: &str) -> SubjectAccessReviewSpec {
    SubjectAccessReviewSpec {
        user: Some(user.name.clone()),
        uid: (!user.uid.is_empty()).then(|| user.uid.clone()),
        groups: Some(user.groups.clone()),
        extra: (!user.extra.is_empty()).then(|| user.extra.clone()),
        resource_attributes: Some(ResourceAttributes {
            namespace: Some(String::new()),
            verb: Some(attrs.verb.to_string()),
            group: Some(String::new()),
            version: Some("v1".into()),
            resource: Some("nodes".into()),
            subresource: Some(attrs.subresource.to_string()),
            name: Some(node.to_string()),
            ..ResourceAttributes::default()
        }),
        non_resource_attributes: None,
    }
}

async fn review_access(
    client: kube::Client,
    spec: SubjectAccessReviewSpec,
) -> Result<(bool, String), String> {
    let review = SubjectAccessReview {
        spec,
        ..SubjectAccessReview::default()
    };
    let answer = super::webhook::create(&client, &review).await?;
    let status = answer.status.unwrap_or_default();
    if let Some(e) = status.evaluation_error.as_deref().filter(|e| !e.is_empty()) {
        tracing::debug!(error = %e, "SubjectAccessReview evaluation error");
    }
    Ok((status.allowed, status.reason.unwrap_or_default()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_map_to_upstreams_subresources() {
        let cases: &[(&str, &[&str])] = &[
            ("/stats/summary", &["stats"]),
            ("/stats", &["stats"]),
            ("/statsfoo", &["proxy"]),
            ("/metrics", &["metrics"]),
            ("/metrics/cadvisor", &["metrics"]),
            ("/metricsx", &["proxy"]),
            ("/logs/", &["log"]),
            ("/logs/syslog", &["log"]),
            ("/checkpoint/ns/pod/c", &["checkpoint"]),
            ("/pods", &["pods", "proxy"]),
            ("/pods/", &["pods", "proxy"]),
            ("/runningpods/", &["pods", "proxy"]),
            ("/healthz", &["healthz", "proxy"]),
            ("/healthz/ping", &["healthz", "proxy"]),
            ("/configz", &["configz", "proxy"]),
            ("/ui/", &["ui", "proxy"]),
            ("/ui/api/node", &["ui", "proxy"]),
            ("/uix", &["proxy"]),
            ("/exec/ns/pod/c", &["proxy"]),
            ("/containerLogs/ns/pod/c", &["proxy"]),
            ("/", &["proxy"]),
        ];
        for (path, want) in cases {
            assert_eq!(subresources(path), *want, "{path}");
        }
    }

    #[test]
    fn the_node_pages_data_needs_what_the_same_data_needs_on_its_own_path() {
        let subs = |path| -> Vec<Vec<&str>> {
            checks(&Method::GET, path)
                .into_iter()
                .map(|alts| alts.into_iter().map(|a| a.subresource).collect())
                .collect()
        };
        assert_eq!(subs("/ui/"), [vec!["ui", "proxy"]]);
        assert_eq!(subs("/ui/api/node"), [vec!["ui", "proxy"]]);
        assert_eq!(
            subs("/ui/api/pod"),
            [vec!["ui", "proxy"], vec!["pods", "proxy"]]
        );
        assert_eq!(
            subs("/ui/api/history"),
            [vec!["ui", "proxy"], vec!["stats"]]
        );
        assert_eq!(subs("/pods"), [vec!["pods", "proxy"]]);
        assert_eq!(subs("/stats/summary"), [vec!["stats"]]);
    }

    #[test]
    fn methods_map_to_upstreams_verbs() {
        assert_eq!(verb(&Method::GET), "get");
        assert_eq!(verb(&Method::POST), "create");
        assert_eq!(verb(&Method::PUT), "update");
        assert_eq!(verb(&Method::PATCH), "patch");
        assert_eq!(verb(&Method::DELETE), "delete");
        assert_eq!(verb(&Method::HEAD), "");
    }

    #[test]
    fn the_review_names_the_node_and_the_user() {
        let user = UserInfo {
            name: "alice".into(),
            groups: vec!["system:authenticated".into()],
            ..UserInfo::default()
        };
        let attrs = &attributes(&Method::GET, "/stats/summary")[0];
        let spec = serde_json::to_value(review_spec(&user, attrs, "node-1")).unwrap();
        assert_eq!(
            spec,
            serde_json::json!({
                "user": "alice",
                "groups": ["system:authenticated"],
                "resourceAttributes": {
                    "namespace": "", "verb": "get", "group": "", "version": "v1",
                    "resource": "nodes", "subresource": "stats", "name": "node-1",
                },
            })
        );
    }

    #[tokio::test]
    async fn webhook_mode_without_an_api_server_denies_with_a_reason() {
        let authz = nodeagent_config::KubeletAuthorization::default();
        assert_eq!(authz.mode, "Webhook", "the v1beta1 default");
        let a = Authorizer::new(&authz, "n", None);
        let attrs = &attributes(&Method::GET, "/pods")[0];
        let d = a.authorize(&UserInfo::default(), attrs).await.unwrap();
        assert!(matches!(d, Decision::Deny(r) if r.contains("standalone")));
    }
}
