//! The test API server's service-account machinery, driven through kube-rs as the node
//! agent drives it: TokenRequest (`serviceaccounts/token`) with upstream's validation and
//! claims, TokenReview of those tokens (audiences, expiry, the bound pod), the `default`
//! ServiceAccount and the `kube-root-ca.crt` ConfigMap in every namespace in use,
//! discovery listing them, the ServiceAccount admission of pods (the `kube-api-access-*`
//! token volume) and a test's cap on token lifetimes. Needs no containerd.

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenReview};
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod, ServiceAccount};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use nodeagent_tests::apiserver::{ApiServer, ApiState};
use nodeagent_tests::apiserver_serviceaccount::ISSUER;
use serde_json::{Value, json};

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// A TokenRequest with `spec` for service account `name`, through kube-rs; the answer
/// as JSON.
async fn token_request(
    accounts: &Api<ServiceAccount>,
    name: &str,
    spec: Value,
) -> kube::Result<Value> {
    let request: TokenRequest = serde_json::from_value(json!({"spec": spec})).unwrap();
    let answer = accounts
        .create_token_request(name, &PostParams::default(), &request)
        .await?;
    Ok(serde_json::to_value(answer).unwrap())
}

/// The `expirationTimestamp` of a TokenRequest answer, in Unix seconds.
fn expires(answer: &Value) -> i64 {
    let at = answer["status"]["expirationTimestamp"].as_str().unwrap();
    at.parse::<k8s_openapi::jiff::Timestamp>()
        .unwrap()
        .as_second()
}

async fn create_pod(client: &kube::Client, ns: &str, name: &str, spec: Value) -> Pod {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    pods.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": name}, "spec": spec})).unwrap(),
    )
    .await
    .unwrap()
}

/// The TokenReview status of `token` for `audiences`, as JSON.
async fn review(client: &kube::Client, token: &str, audiences: &[&str]) -> Value {
    let reviews: Api<TokenReview> = Api::all(client.clone());
    let review: TokenReview = serde_json::from_value(json!({
        "spec": {"token": token, "audiences": audiences}
    }))
    .unwrap();
    let answer = reviews
        .create(&PostParams::default(), &review)
        .await
        .unwrap();
    serde_json::to_value(answer.status.unwrap()).unwrap()
}

/// The API error of `result`: (code, reason, message).
fn api_error<T: std::fmt::Debug>(result: kube::Result<T>) -> (u16, String, String) {
    match result {
        Err(kube::Error::Api(s)) => (s.code, s.reason.clone(), s.message.clone()),
        other => panic!("expected an API error, got {other:?}"),
    }
}

#[tokio::test]
async fn a_pod_bound_token_is_issued_reviewed_and_refused_once_the_pod_is_gone() {
    let server = ApiServer::start(ApiState::default(), 0).await;
    let client = server.client();
    let ns = "tokens";
    let nodes: Api<Node> = Api::all(client.clone());
    let node = nodes
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "n1"}})).unwrap(),
        )
        .await
        .unwrap();
    let spec = json!({"serviceAccountName": "default", "nodeName": "n1",
        "containers": [{"name": "c", "image": "busybox"}]});
    let pod = create_pod(&client, ns, "web", spec.clone()).await;
    let pod_uid = pod.metadata.uid.clone().unwrap();

    // The namespace's first pod brought its default service account along.
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), ns);
    let sa = accounts.get("default").await.unwrap();
    let sa_uid = sa.metadata.uid.clone().unwrap();

    let before = now();
    let answer = token_request(
        &accounts,
        "default",
        json!({
            "audiences": ["vault"], "expirationSeconds": 1200,
            "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": "web", "uid": pod_uid},
        }),
    )
    .await
    .unwrap();
    assert_eq!(answer["spec"]["audiences"], json!(["vault"]));
    assert_eq!(answer["spec"]["expirationSeconds"], 1200);
    assert_eq!(answer["metadata"]["name"], "default");
    let expires = expires(&answer);
    assert!(
        (before + 1200..=now() + 1200).contains(&expires),
        "expirationTimestamp {expires}, requested at {before}"
    );

    // A JWT with upstream's claims, signed by the server.
    let token = answer["status"]["token"].as_str().unwrap().to_string();
    assert_eq!(token.split('.').count(), 3, "{token}");
    let claims = server.state.service_accounts.verify(&token).unwrap();
    assert_eq!(claims["iss"], ISSUER);
    assert_eq!(claims["sub"], "system:serviceaccount:tokens:default");
    assert_eq!(claims["aud"], json!(["vault"]));
    let iat = claims["iat"].as_i64().unwrap();
    assert_eq!(claims["nbf"], iat);
    assert_eq!(claims["exp"], iat + 1200);
    assert_eq!(claims["exp"], expires);
    assert_eq!(
        claims["kubernetes.io"],
        json!({
            "namespace": ns,
            "serviceaccount": {"name": "default", "uid": sa_uid},
            "pod": {"name": "web", "uid": pod_uid},
            "node": {"name": "n1", "uid": node.metadata.uid.unwrap()},
        })
    );
    assert_eq!(
        server
            .state
            .service_accounts
            .token_requests(ns, "default")
            .len(),
        1
    );

    // Reviewed for its audience: the service account's user, with the pod in `extra`.
    let ok = review(&client, &token, &["vault", "other"]).await;
    assert_eq!(ok["authenticated"], true, "{ok}");
    assert_eq!(ok["audiences"], json!(["vault"]));
    assert_eq!(
        ok["user"]["username"],
        "system:serviceaccount:tokens:default"
    );
    assert_eq!(ok["user"]["uid"], sa_uid);
    assert_eq!(
        ok["user"]["groups"],
        json!([
            "system:serviceaccounts",
            "system:serviceaccounts:tokens",
            "system:authenticated"
        ])
    );
    let extra = &ok["user"]["extra"];
    assert_eq!(
        extra["authentication.kubernetes.io/pod-name"],
        json!(["web"])
    );
    assert_eq!(
        extra["authentication.kubernetes.io/pod-uid"],
        json!([pod_uid])
    );
    assert_eq!(
        extra["authentication.kubernetes.io/node-name"],
        json!(["n1"])
    );
    let jti = claims["jti"].as_str().unwrap();
    assert_eq!(
        extra["authentication.kubernetes.io/credential-id"],
        json!([format!("JTI={jti}")])
    );

    // Not for another audience, nor for the API server's own when the review names none.
    for audiences in [&["other"][..], &[]] {
        let refused = review(&client, &token, audiences).await;
        assert_eq!(refused["authenticated"], false, "{refused}");
        let error = refused["error"].as_str().unwrap();
        assert!(error.contains("token audiences"), "{error}");
    }
    // A token whose claims were changed is not the server's.
    let (head, rest) = token.split_once('.').unwrap();
    let (_, sig) = rest.split_once('.').unwrap();
    let payload = token.split('.').nth(1).unwrap();
    let forged = format!("{head}.{}A.{sig}", &payload[..payload.len() - 1]);
    let refused = review(&client, &forged, &["vault"]).await;
    assert_eq!(refused["authenticated"], false, "{refused}");

    // The pod is deleted: the token is invalidated, and stays so for a pod of the same
    // name, whose uid differs; a request naming the old uid conflicts.
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    pods.delete("web", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    let gone = review(&client, &token, &["vault"]).await;
    assert_eq!(gone["authenticated"], false);
    assert_eq!(gone["error"], "service account token has been invalidated");
    create_pod(&client, ns, "web", spec).await;
    let replaced = review(&client, &token, &["vault"]).await;
    assert_eq!(replaced["authenticated"], false);
    let error = replaced["error"].as_str().unwrap();
    assert!(
        error.contains("does not match service account pod ref claim"),
        "{error}"
    );
    let stale = token_request(
        &accounts,
        "default",
        json!({"boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": "web", "uid": pod_uid}}),
    )
    .await;
    let (code, reason, message) = api_error(stale);
    assert_eq!((code, reason.as_str()), (409, "Conflict"));
    assert!(
        message.contains("does not match the UID in record"),
        "{message}"
    );
    assert_eq!(
        server
            .state
            .service_accounts
            .token_requests(ns, "default")
            .len(),
        1,
        "a refused request is not counted"
    );
}

#[tokio::test]
async fn token_requests_are_validated_and_defaulted_as_upstream() {
    let server = ApiServer::start(ApiState::default(), 0).await;
    let client = server.client();
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), "default");

    // Shorter than ten minutes: 422 Invalid, in upstream's words.
    let short = token_request(&accounts, "default", json!({"expirationSeconds": 599})).await;
    let (code, reason, message) = api_error(short);
    assert_eq!((code, reason.as_str()), (422, "Invalid"));
    assert_eq!(
        message,
        "TokenRequest.authentication.k8s.io \"\" is invalid: spec.expirationSeconds: Invalid value: 599: may not specify a duration less than 10 minutes"
    );
    let shortest = token_request(&accounts, "default", json!({"expirationSeconds": 600}))
        .await
        .unwrap();
    assert_eq!(shortest["spec"]["expirationSeconds"], 600);

    // No such service account: 404.
    let unknown = token_request(&accounts, "builder", json!({})).await;
    let (code, reason, message) = api_error(unknown);
    assert_eq!((code, reason.as_str()), (404, "NotFound"));
    assert_eq!(message, "serviceaccounts \"builder\" not found");

    // A bound pod must exist, run as that service account, and be a Pod.
    let bind = |kind: &str, name: &str| json!({"boundObjectRef": {"apiVersion": "v1", "kind": kind, "name": name}});
    let absent = token_request(&accounts, "default", bind("Pod", "nowhere")).await;
    assert_eq!(api_error(absent).0, 404);
    // (A pod's service account must exist: admission refuses the pod otherwise.)
    accounts
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "builder"}})).unwrap(),
        )
        .await
        .unwrap();
    create_pod(
        &client,
        "default",
        "other",
        json!({"serviceAccountName": "builder", "containers": [{"name": "c", "image": "busybox"}]}),
    )
    .await;
    let (code, _, message) =
        api_error(token_request(&accounts, "default", bind("Pod", "other")).await);
    assert_eq!(code, 400);
    assert!(
        message.contains("different serviceaccount name"),
        "{message}"
    );
    let (code, _, message) =
        api_error(token_request(&accounts, "default", bind("ConfigMap", "kube-root-ca.crt")).await);
    assert_eq!(code, 400);
    assert_eq!(
        message,
        "cannot bind token to object of type /v1, Kind=ConfigMap"
    );

    // Defaults: an hour, for the API server; a review naming no audience accepts it.
    let plain = token_request(&accounts, "default", json!({}))
        .await
        .unwrap();
    assert_eq!(plain["spec"]["audiences"], json!([ISSUER]));
    assert_eq!(plain["spec"]["expirationSeconds"], 3600);
    let token = plain["status"]["token"].as_str().unwrap();
    let claims = server.state.service_accounts.verify(token).unwrap();
    assert_eq!(
        claims["exp"].as_i64().unwrap() - claims["iat"].as_i64().unwrap(),
        3600
    );
    assert!(claims["kubernetes.io"].get("pod").is_none());
    let ok = review(&client, token, &[]).await;
    assert_eq!(ok["authenticated"], true, "{ok}");
    assert_eq!(ok["audiences"], json!([ISSUER]));
    assert!(
        ok["user"]["extra"]
            .get("authentication.kubernetes.io/pod-name")
            .is_none()
    );

    // The kubelet's default 3607 s for a pod: upstream's one-year token that warns after
    // 3607 s, while the answer's expiry stays the requested one.
    create_pod(
        &client,
        "default",
        "mine",
        json!({"serviceAccountName": "default", "containers": [{"name": "c", "image": "busybox"}]}),
    )
    .await;
    let before = now();
    let mut projected = bind("Pod", "mine");
    projected["expirationSeconds"] = 3607.into();
    let extended = token_request(&accounts, "default", projected)
        .await
        .unwrap();
    let expires = expires(&extended);
    assert!(
        (before + 3607..=now() + 3607).contains(&expires),
        "{expires}"
    );
    let token = extended["status"]["token"].as_str().unwrap();
    let claims = server.state.service_accounts.verify(token).unwrap();
    let iat = claims["iat"].as_i64().unwrap();
    assert_eq!(claims["exp"], iat + 365 * 24 * 3600);
    assert_eq!(claims["kubernetes.io"]["warnafter"], iat + 3607);
    assert_eq!(
        server
            .state
            .service_accounts
            .token_requests("default", "default")
            .len(),
        3,
        "600 s, the defaults and the projected one"
    );

    // The explicit tokens a test names keep working beside these.
    server
        .state
        .auth
        .add_token("alice-token", "alice", &["dev"]);
    let alice = review(&client, "alice-token", &[]).await;
    assert_eq!(alice["authenticated"], true);
    assert_eq!(alice["user"]["username"], "alice");
    let nobody = review(&client, "not-a-token", &[]).await;
    assert_eq!(nobody["authenticated"], false);
}

#[tokio::test]
async fn every_namespace_in_use_has_a_default_service_account_and_the_root_ca() {
    let server = ApiServer::start(ApiState::default(), 0).await;
    let client = server.client();
    let ca = server.state.root_ca_pem().to_string();
    assert!(ca.starts_with("-----BEGIN CERTIFICATE-----"), "{ca}");
    let has_both = |ns: &'static str| {
        let client = client.clone();
        let ca = ca.clone();
        async move {
            let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), ns);
            let sa = accounts.get("default").await.unwrap();
            let maps: Api<ConfigMap> = Api::namespaced(client, ns);
            let cm = maps.get("kube-root-ca.crt").await.unwrap();
            assert_eq!(
                cm.data.unwrap().get("ca.crt"),
                Some(&ca),
                "kube-root-ca.crt in {ns}"
            );
            (sa, cm.metadata.uid.unwrap())
        }
    };
    for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
        has_both(ns).await;
    }
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), "apps");
    assert_eq!(api_error(accounts.get("default").await).0, 404);

    // A namespace is in use from its first object on.
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), "apps");
    maps.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "settings"}})).unwrap(),
    )
    .await
    .unwrap();
    let (sa, cm_uid) = has_both("apps").await;

    // Deleted, they come back (new objects); changed, the bundle is put back.
    accounts
        .delete("default", &DeleteParams::default())
        .await
        .unwrap();
    let (again, _) = has_both("apps").await;
    assert_ne!(again.metadata.uid, sa.metadata.uid);
    maps.delete("kube-root-ca.crt", &DeleteParams::default())
        .await
        .unwrap();
    let (_, new_uid) = has_both("apps").await;
    assert_ne!(new_uid, cm_uid);
    maps.patch(
        "kube-root-ca.crt",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"ca.crt": "tampered"}})),
    )
    .await
    .unwrap();
    has_both("apps").await;

    // Discovery lists them, as kubectl reads it.
    let core = client.list_core_api_resources("v1").await.unwrap();
    let find = |name: &str| core.resources.iter().find(|r| r.name == name).cloned();
    let sa = find("serviceaccounts").unwrap();
    assert_eq!((sa.kind.as_str(), sa.namespaced), ("ServiceAccount", true));
    assert_eq!(sa.short_names, Some(vec!["sa".to_string()]));
    let token = find("serviceaccounts/token").unwrap();
    assert_eq!(token.kind, "TokenRequest");
    assert_eq!(token.group.as_deref(), Some("authentication.k8s.io"));
    assert_eq!(token.verbs, ["create"]);
}

const TOKEN_PATH: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// The pod's volumes and each container's mounts, as JSON.
fn volumes_and_mounts(pod: &Pod) -> (Value, Vec<Value>) {
    let spec = serde_json::to_value(pod.spec.as_ref().unwrap()).unwrap();
    let mut mounts = Vec::new();
    for list in ["initContainers", "containers"] {
        for c in spec[list].as_array().into_iter().flatten() {
            mounts.push(c["volumeMounts"].clone());
        }
    }
    (spec["volumes"].clone(), mounts)
}

#[tokio::test]
async fn a_created_pod_runs_as_default_with_the_kube_api_access_volume_in_every_container() {
    let server = ApiServer::start(ApiState::default(), 0).await;
    let client = server.client();
    // A namespace's first object is this pod: its `default` account is there in time.
    let ns = "admitted";
    let own = json!({"name": "own", "mountPath": TOKEN_PATH});
    let pod = create_pod(
        &client,
        ns,
        "web",
        json!({
            "initContainers": [{"name": "init", "image": "busybox"}],
            "containers": [
                {"name": "app", "image": "busybox",
                 "volumeMounts": [{"name": "data", "mountPath": "/data"}]},
                {"name": "mine", "image": "busybox", "volumeMounts": [own]},
            ],
            "volumes": [{"name": "data", "emptyDir": {}}, {"name": "own", "emptyDir": {}}],
        }),
    )
    .await;
    let spec = pod.spec.clone().unwrap();
    assert_eq!(spec.service_account_name.as_deref(), Some("default"));
    assert_eq!(spec.service_account.as_deref(), Some("default"));

    let (volumes, mounts) = volumes_and_mounts(&pod);
    let volumes = volumes.as_array().unwrap();
    assert_eq!(volumes.len(), 3, "{volumes:?}");
    let name = volumes[2]["name"].as_str().unwrap().to_string();
    let suffix = name.strip_prefix("kube-api-access-").unwrap();
    assert_eq!(suffix.len(), 5, "{name}");
    assert!(
        suffix
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit()),
        "{name}"
    );
    assert_eq!(
        volumes[2]["projected"],
        json!({
            "defaultMode": 420,
            "sources": [
                {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [{"path": "namespace",
                    "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}},
            ],
        })
    );
    let token = json!({"name": name, "readOnly": true, "mountPath": TOKEN_PATH});
    assert_eq!(
        mounts,
        vec![
            json!([token]),
            json!([{"name": "data", "mountPath": "/data"}, token]),
            json!([own]),
        ],
        "the init container and `app` get the token; `mine` keeps its own mount"
    );
    // As stored, and for watchers.
    let stored = server.state.object("pods", ns, "web").unwrap();
    assert_eq!(stored["spec"]["volumes"][2]["name"], name.as_str());

    // The kubelet's token for that volume: bound to the pod, of its defaulted account.
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), ns);
    let bound = token_request(
        &accounts,
        "default",
        json!({"expirationSeconds": 3607, "boundObjectRef": {"apiVersion": "v1", "kind": "Pod",
            "name": "web", "uid": pod.metadata.uid.unwrap()}}),
    )
    .await
    .unwrap();
    assert_eq!(bound["spec"]["expirationSeconds"], 3607);
}

#[tokio::test]
async fn automount_false_on_the_pod_or_its_account_mounts_nothing_and_the_pod_wins() {
    let server = ApiServer::start(ApiState::default(), 0).await;
    let client = server.client();
    let containers = json!([{"name": "c", "image": "busybox"}]);
    let off = create_pod(
        &client,
        "default",
        "off",
        json!({"automountServiceAccountToken": false, "containers": containers}),
    )
    .await;
    assert_eq!(
        off.spec.as_ref().unwrap().service_account_name.as_deref(),
        Some("default")
    );
    assert_eq!(volumes_and_mounts(&off), (Value::Null, vec![Value::Null]));

    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), "default");
    accounts
        .create(
            &PostParams::default(),
            &serde_json::from_value(
                json!({"metadata": {"name": "quiet"}, "automountServiceAccountToken": false}),
            )
            .unwrap(),
        )
        .await
        .unwrap();
    let quiet = create_pod(
        &client,
        "default",
        "quiet",
        json!({"serviceAccountName": "quiet", "containers": containers}),
    )
    .await;
    assert_eq!(volumes_and_mounts(&quiet), (Value::Null, vec![Value::Null]));
    let wanted = create_pod(
        &client,
        "default",
        "wanted",
        json!({"serviceAccountName": "quiet", "automountServiceAccountToken": true,
            "containers": containers}),
    )
    .await;
    let (volumes, mounts) = volumes_and_mounts(&wanted);
    assert_eq!(volumes.as_array().map(Vec::len), Some(1), "{volumes}");
    assert_eq!(mounts[0][0]["mountPath"], TOKEN_PATH);
}

#[tokio::test]
async fn a_pod_naming_a_missing_service_account_is_forbidden() {
    let server = ApiServer::start(ApiState::default(), 0).await;
    let client = server.client();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "apps");
    let pod: Pod = serde_json::from_value(json!({"metadata": {"name": "web"},
        "spec": {"serviceAccountName": "builder", "containers": [{"name": "c", "image": "busybox"}]}}))
    .unwrap();
    let (code, reason, message) = api_error(pods.create(&PostParams::default(), &pod).await);
    assert_eq!((code, reason.as_str()), (403, "Forbidden"));
    assert_eq!(
        message,
        "pods \"web\" is forbidden: error looking up service account apps/builder: serviceaccount \"builder\" not found"
    );
    assert_eq!(api_error(pods.get("web").await).0, 404, "nothing stored");

    // Once the account exists, the same pod is admitted.
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), "apps");
    accounts
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "builder"}})).unwrap(),
        )
        .await
        .unwrap();
    let admitted = pods.create(&PostParams::default(), &pod).await.unwrap();
    assert_eq!(
        admitted.spec.unwrap().service_account_name.as_deref(),
        Some("builder")
    );
}

/// The ServiceAccount admission leaves a mirror pod alone (no account, no token volume);
/// kube-apiserver's DefaultTolerationSeconds admission has no such exception, so its two
/// 300 s tolerations are the only change.
#[tokio::test]
async fn a_mirror_pod_is_stored_as_sent() {
    let server = ApiServer::start(ApiState::default(), 0).await;
    let pods: Api<Pod> = Api::namespaced(server.client(), "kube-system");
    let sent: Pod = serde_json::from_value(json!({
        "metadata": {"name": "static-web-n1", "annotations": {
            "kubernetes.io/config.mirror": "abc", "kubernetes.io/config.source": "file"}},
        "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "busybox"}]},
    }))
    .unwrap();
    let stored = pods.create(&PostParams::default(), &sent).await.unwrap();
    let mut expected = serde_json::to_value(&sent.spec).unwrap();
    expected["tolerations"] = json!([
        {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
        {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}
    ]);
    assert_eq!(serde_json::to_value(&stored.spec).unwrap(), expected);
    let spec = stored.spec.unwrap();
    assert_eq!(spec.service_account_name, None);
    assert_eq!(spec.volumes, None);
}

#[tokio::test]
async fn a_capped_token_lifetime_shortens_the_answer_the_jwt_and_the_extension() {
    let server = ApiServer::start(ApiState::default(), 0).await;
    let client = server.client();
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), "default");
    // The test's clone of the state: the running server sees the cap.
    server
        .state
        .service_accounts
        .set_max_expiration_seconds(Some(20));
    assert_eq!(
        server.state.service_accounts.max_expiration_seconds(),
        Some(20)
    );

    let before = now();
    let capped = token_request(&accounts, "default", json!({"expirationSeconds": 3600}))
        .await
        .unwrap();
    assert_eq!(capped["spec"]["expirationSeconds"], 20);
    let expires = expires(&capped);
    assert!(
        (before + 20..=now() + 20).contains(&expires),
        "expirationTimestamp {expires}, requested at {before}"
    );
    let token = capped["status"]["token"].as_str().unwrap();
    let claims = server.state.service_accounts.verify(token).unwrap();
    assert_eq!(claims["exp"], claims["iat"].as_i64().unwrap() + 20);
    assert_eq!(claims["exp"], expires);

    // Validation still comes first: under ten minutes is refused, cap or not.
    let short = token_request(&accounts, "default", json!({"expirationSeconds": 599})).await;
    assert_eq!(api_error(short).0, 422);

    // The kubelet's 3607 s for a pod volume is capped too, and so not extended.
    create_pod(
        &client,
        "default",
        "web",
        json!({"containers": [{"name": "c", "image": "busybox"}]}),
    )
    .await;
    let projected = token_request(
        &accounts,
        "default",
        json!({"expirationSeconds": 3607,
            "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": "web"}}),
    )
    .await
    .unwrap();
    assert_eq!(projected["spec"]["expirationSeconds"], 20);
    let token = projected["status"]["token"].as_str().unwrap();
    let claims = server.state.service_accounts.verify(token).unwrap();
    assert_eq!(claims["exp"], claims["iat"].as_i64().unwrap() + 20);
    assert!(
        claims["kubernetes.io"].get("warnafter").is_none(),
        "{claims}"
    );

    // A cap above the request leaves it; no cap again: the full hour.
    server
        .state
        .service_accounts
        .set_max_expiration_seconds(Some(7200));
    let under = token_request(&accounts, "default", json!({"expirationSeconds": 3600}))
        .await
        .unwrap();
    assert_eq!(under["spec"]["expirationSeconds"], 3600);
    server
        .state
        .service_accounts
        .set_max_expiration_seconds(None);
    let uncapped = token_request(&accounts, "default", json!({}))
        .await
        .unwrap();
    assert_eq!(uncapped["spec"]["expirationSeconds"], 3600);
}

#[tokio::test]
async fn a_shortened_token_request_carries_upstreams_warning() {
    let server = ApiServer::start(ApiState::default(), 0).await;
    server
        .state
        .service_accounts
        .set_max_expiration_seconds(Some(30));
    let body = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
        "spec": {"expirationSeconds": 3600}});
    let request = http::Request::post("/api/v1/namespaces/default/serviceaccounts/default/token")
        .header("content-type", "application/json")
        .body(kube::client::Body::from(body.to_string().into_bytes()))
        .unwrap();
    let response = server.client().send(request).await.unwrap();
    let status = response.status().as_u16();
    let warning = response
        .headers()
        .get("warning")
        .map(|w| w.to_str().unwrap().to_string());
    assert_eq!(status, 201);
    assert_eq!(
        warning.as_deref(),
        Some("299 - \"requested expiration of 3600 seconds shortened to 30 seconds\"")
    );
}
