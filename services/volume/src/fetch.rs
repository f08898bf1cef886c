//! Fetches what a pod's configMap, secret, downwardAPI and projected volumes need from the
//! API server: config maps and secrets (a GET on every set-up, so an update reaches the
//! files at the next pod sync), service account tokens by TokenRequest (cached, refreshed as
//! upstream's `pkg/kubelet/token` manager does), and the node's allocatable.
//!
//! A node with no API server (standalone, static pods only) cannot fetch objects: such a
//! volume fails with a clear error, as upstream's kubelet fails it ("cannot get ... without
//! kube client"). The node's allocatable then comes from the machine itself.

use crate::payload::{ApiObjects, Fetched, References, TokenRequestKey};
use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod, Secret, ServiceAccount};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{Api, PostParams};
use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

/// Upstream's `maxTTL`: a token older than this is refreshed whatever its lifetime.
const MAX_TOKEN_AGE: Duration = Duration::from_secs(24 * 60 * 60);
/// A token is refreshed once 80 % of its lifetime has passed (upstream's 20 % rule).
const REFRESH_REMAINING_PERCENT: u32 = 20;

/// One cached token: the pod, its service account and the request's audience and lifetime.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct TokenKey {
    namespace: String,
    service_account: String,
    pod_uid: String,
    request: TokenRequestKey,
}

#[derive(Debug, Clone)]
struct CachedToken {
    token: Vec<u8>,
    issued: SystemTime,
    expires: SystemTime,
}

/// A token as the API server's TokenRequest status gives it (what a CSI driver with
/// `tokenRequests` gets).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct TokenStatus {
    pub token: String,
    /// RFC 3339, seconds, UTC (metav1.Time).
    #[serde(rename = "expirationTimestamp")]
    pub expiration_timestamp: String,
}

impl CachedToken {
    /// Upstream `requiresRefresh`: past 80 % of the lifetime the API server granted (which
    /// may be shorter than the one asked for), or older than a day.
    fn needs_refresh(&self, now: SystemTime) -> bool {
        let lifetime = self.expires.duration_since(self.issued).unwrap_or_default();
        let keep = lifetime * REFRESH_REMAINING_PERCENT / 100;
        let refresh_at = self.expires.checked_sub(keep).unwrap_or(self.expires);
        now >= refresh_at || now >= self.issued + MAX_TOKEN_AGE
    }

    fn expired(&self, now: SystemTime) -> bool {
        now >= self.expires
    }
}

/// Cheap to clone: the clones share the token cache.
#[derive(Clone)]
pub struct Fetcher {
    api: Option<kube::Client>,
    node_name: String,
    tokens: std::sync::Arc<Mutex<HashMap<TokenKey, CachedToken>>>,
}

impl Fetcher {
    pub fn new(api: Option<kube::Client>, node_name: String) -> Self {
        Self {
            api,
            node_name,
            tokens: Default::default(),
        }
    }

    pub fn client(&self) -> Option<&kube::Client> {
        self.api.as_ref()
    }

    /// The node this service runs on (events name it as their source host).
    pub fn node_name(&self) -> &str {
        &self.node_name
    }

    /// Everything `refs` names, each fetched independently: one missing object fails only
    /// the volumes that use it.
    pub async fn objects(&self, pod: &Pod, refs: &References) -> ApiObjects {
        let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
        let mut objects = ApiObjects::default();
        for name in &refs.config_maps {
            let got = self.get::<ConfigMap>(ns, name).await;
            objects.config_maps.insert(name.clone(), got);
        }
        for name in &refs.secrets {
            let got = self.get::<Secret>(ns, name).await;
            objects.secrets.insert(name.clone(), got);
        }
        for key in &refs.tokens {
            let got = self.token(pod, key).await;
            objects.tokens.insert(key.clone(), got);
        }
        if refs.node_allocatable {
            objects.node_allocatable = self.node_allocatable().await;
        }
        objects
    }

    async fn get<K>(&self, ns: &str, name: &str) -> Fetched<K>
    where
        K: kube::Resource<Scope = kube::core::NamespaceResourceScope>
            + Clone
            + serde::de::DeserializeOwned
            + std::fmt::Debug,
        K::DynamicType: Default,
    {
        let plural = K::plural(&K::DynamicType::default()).into_owned();
        let Some(client) = &self.api else {
            return Err(format!(
                "cannot get {plural} {name:?}: this node runs standalone, without an API server"
            ));
        };
        let api: Api<K> = Api::namespaced(client.clone(), ns);
        match api.get_opt(name).await {
            Ok(found) => Ok(found),
            Err(e) => Err(format!("cannot get {plural} {ns}/{name}: {e}")),
        }
    }

    /// The node's allocatable from its Node object; the machine's capacity when there is no
    /// API server or the Node cannot be read.
    pub async fn node_allocatable(&self) -> BTreeMap<String, Quantity> {
        if let Some(client) = &self.api {
            let nodes: Api<Node> = Api::all(client.clone());
            match nodes.get_opt(&self.node_name).await {
                Ok(Some(node)) => {
                    if let Some(a) = node.status.and_then(|s| s.allocatable) {
                        return a;
                    }
                }
                Ok(None) => {}
                Err(e) => tracing::warn!(error = %e, "cannot read the node's allocatable"),
            }
        }
        BTreeMap::from([
            (
                "cpu".to_string(),
                Quantity(nodeagent_config::machine::cpus().to_string()),
            ),
            (
                "memory".to_string(),
                Quantity(nodeagent_config::machine::memory_bytes().to_string()),
            ),
        ])
    }

    /// A token for the pod's service account, bound to the pod, from the cache while it is
    /// fresh. A failed refresh keeps using the cached token until it expires (upstream).
    async fn token(&self, pod: &Pod, request: &TokenRequestKey) -> Result<Vec<u8>, String> {
        self.cached_token(pod, request).await.map(|c| c.token)
    }

    /// A token for the pod's service account, bound to the pod, with its expiry: the same
    /// cache and refresh as a projected token's (upstream's CSI `tokenRequests` go through
    /// the same token manager).
    pub async fn token_status(
        &self,
        pod: &Pod,
        request: &TokenRequestKey,
    ) -> Result<TokenStatus, String> {
        let cached = self.cached_token(pod, request).await?;
        let seconds = cached
            .expires
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs() as i64;
        let expiration = k8s_openapi::jiff::Timestamp::from_second(seconds)
            .map_err(|e| format!("token expiry {seconds}: {e}"))?;
        Ok(TokenStatus {
            token: String::from_utf8_lossy(&cached.token).into_owned(),
            expiration_timestamp: expiration.strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
        })
    }

    async fn cached_token(
        &self,
        pod: &Pod,
        request: &TokenRequestKey,
    ) -> Result<CachedToken, String> {
        let spec = pod.spec.as_ref();
        let service_account = spec
            .and_then(|s| s.service_account_name.clone())
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "default".into());
        let key = TokenKey {
            namespace: pod
                .metadata
                .namespace
                .clone()
                .unwrap_or_else(|| "default".into()),
            service_account,
            pod_uid: pod.metadata.uid.clone().unwrap_or_default(),
            request: request.clone(),
        };
        let now = SystemTime::now();
        let cached = self.tokens.lock().unwrap().get(&key).cloned();
        if let Some(c) = &cached
            && !c.needs_refresh(now)
        {
            return Ok(c.clone());
        }
        match self.request_token(pod, &key).await {
            Ok(fresh) => {
                self.tokens.lock().unwrap().insert(key, fresh.clone());
                Ok(fresh)
            }
            Err(e) => match cached {
                Some(c) if !c.expired(now) => {
                    tracing::warn!(error = %e, "token refresh failed; the current token stays until it expires");
                    Ok(c)
                }
                _ => Err(e),
            },
        }
    }

    async fn request_token(&self, pod: &Pod, key: &TokenKey) -> Result<CachedToken, String> {
        let Some(client) = &self.api else {
            return Err(format!(
                "cannot request a token for service account {:?}: this node runs standalone, without an API server",
                key.service_account
            ));
        };
        // No audience: the API server's own (upstream sends none then).
        let audiences =
            (!key.request.audience.is_empty()).then(|| vec![key.request.audience.clone()]);
        let request = TokenRequest {
            spec: Some(TokenRequestSpec {
                audiences,
                expiration_seconds: Some(key.request.expiration_seconds),
                bound_object_ref: Some(BoundObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Pod".into()),
                    name: pod.metadata.name.clone(),
                    uid: pod.metadata.uid.clone(),
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let api: Api<ServiceAccount> = Api::namespaced(client.clone(), &key.namespace);
        let answer = api
            .create_token_request(&key.service_account, &PostParams::default(), &request)
            .await
            .map_err(|e| format!("failed to fetch token: {e}"))?;
        let status = answer
            .status
            .ok_or_else(|| "failed to fetch token: the answer has no status".to_string())?;
        let issued = SystemTime::now();
        // The lifetime granted (the server may shorten it): what the answer's spec says.
        let seconds = answer
            .spec
            .and_then(|s| s.expiration_seconds)
            .unwrap_or(key.request.expiration_seconds)
            .max(0) as u64;
        let expires = status
            .expiration_timestamp
            .and_then(|t| system_time(&t.0))
            .unwrap_or(issued + Duration::from_secs(seconds));
        // Upstream counts the lifetime back from the expiry: iat = exp - expirationSeconds.
        let issued = expires
            .checked_sub(Duration::from_secs(seconds))
            .filter(|t| *t <= issued)
            .unwrap_or(issued);
        tracing::info!(
            service_account = %key.service_account,
            audience = %key.request.audience,
            seconds,
            "requested a service account token"
        );
        Ok(CachedToken {
            token: status
                .token
                .filter(|t| !t.is_empty())
                .ok_or_else(|| "failed to fetch token: the answer has no token".to_string())?
                .into_bytes(),
            issued,
            expires,
        })
    }

    /// Drops the cached tokens of a pod that is gone.
    pub fn forget_pod(&self, uid: &str) {
        self.tokens.lock().unwrap().retain(|k, _| k.pod_uid != uid);
    }
}

fn system_time(t: &k8s_openapi::jiff::Timestamp) -> Option<SystemTime> {
    let secs = u64::try_from(t.as_second()).ok()?;
    Some(SystemTime::UNIX_EPOCH + Duration::from_secs(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(lifetime: u64) -> (CachedToken, SystemTime) {
        let issued = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let t = CachedToken {
            token: b"t".to_vec(),
            issued,
            expires: issued + Duration::from_secs(lifetime),
        };
        (t, issued)
    }

    #[test]
    fn a_token_is_refreshed_at_80_percent_of_its_lifetime_or_after_a_day() {
        let (t, at) = token(3600);
        assert!(!t.needs_refresh(at));
        assert!(!t.needs_refresh(at + Duration::from_secs(2879)));
        assert!(t.needs_refresh(at + Duration::from_secs(2880)));
        assert!(!t.expired(at + Duration::from_secs(3599)));
        assert!(t.expired(at + Duration::from_secs(3600)));
        let (t, at) = token(7 * 24 * 3600);
        assert!(!t.needs_refresh(at + Duration::from_secs(23 * 3600)));
        assert!(t.needs_refresh(at + MAX_TOKEN_AGE));
    }

    #[tokio::test]
    async fn a_standalone_node_says_why_it_cannot_fetch() {
        let fetcher = Fetcher::new(None, "n".into());
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
            "spec": {"containers": [], "volumes": [
                {"name": "c", "configMap": {"name": "cm"}},
                {"name": "t", "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]}},
                {"name": "d", "downwardAPI": {"items": [{"path": "l", "resourceFieldRef": {"containerName": "c", "resource": "limits.memory"}}]}}
            ]}
        }))
        .unwrap();
        let objects = fetcher.objects(&pod, &References::of_pod(&pod)).await;
        assert_eq!(
            objects.config_maps["cm"].as_ref().unwrap_err(),
            "cannot get configmaps \"cm\": this node runs standalone, without an API server"
        );
        let token = objects.tokens.values().next().unwrap();
        assert!(token.as_ref().unwrap_err().contains("standalone"));
        assert!(objects.node_allocatable.contains_key("memory"));
    }
}
