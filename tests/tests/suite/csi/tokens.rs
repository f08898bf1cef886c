//! A CSI driver with `tokenRequests` and `requiresRepublish` (issue 32), as the
//! secrets-store CSI driver uses them, against the real containerd and the test API
//! server's TokenRequest. Judged by upstream's csi_mounter.go `podServiceAccountTokenAttrs`:
//! `NodePublishVolume`'s volume context carries `csi.storage.k8s.io/serviceAccount.tokens`,
//! a JSON object of TokenRequest statuses (`token`, `expirationTimestamp`) by audience, each
//! token for the pod's service account, bound to the pod, with the audience and lifetime
//! the CSIDriver asks for; and by the volume manager's remount of a volume whose driver
//! `requiresRepublish` (`NodePublishVolume` again at later syncs, never an unpublish).

use super::claims::start_with_driver;
use super::*;
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

/// The claims of a JWT, read here without the product's code.
fn jwt_claims(token: &str) -> Value {
    let payload = token.split('.').nth(1).expect("a JWT has three parts");
    serde_json::from_slice(&URL_SAFE_NO_PAD.decode(payload).expect("base64url")).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_driver_with_token_requests_gets_the_pods_tokens_and_is_republished() {
    if !require_runtime("csi") {
        return;
    }
    let csidriver: CSIDriver = serde_json::from_value(json!({
        "apiVersion": "storage.k8s.io/v1", "kind": "CSIDriver",
        "metadata": {"name": DRIVER},
        "spec": {"attachRequired": false, "podInfoOnMount": false,
                 "volumeLifecycleModes": ["Ephemeral"],
                 "tokenRequests": [{"audience": "vault", "expirationSeconds": 900},
                                   {"audience": ""}],
                 "requiresRepublish": true},
    }))
    .unwrap();
    let (_server, node, pods, driver) = start_with_driver("csi-tokens", csidriver, "", &[]).await;
    let name = node.pod_name("tokened");
    pods.create(&PostParams::default(), &csi_pod(&name, &node))
        .await
        .unwrap();
    eventually("the pod Ready", DEADLINE, || ready(&pods, &name)).await;
    let uid = uid_of(&pods, &name).await;
    let target = node.path(&format!(
        "root/pods/{uid}/volumes/kubernetes.io~csi/data/mount"
    ));

    let first = driver.calls("NodePublishVolume").remove(0);
    let tokens: Value = serde_json::from_str(
        first["volume_context"]["csi.storage.k8s.io/serviceAccount.tokens"]
            .as_str()
            .unwrap_or_else(|| panic!("no tokens in {first}")),
    )
    .unwrap();
    let audiences: Vec<&String> = tokens.as_object().unwrap().keys().collect();
    assert_eq!(audiences, vec!["", "vault"], "{tokens}");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    for (audience, lifetime) in [("vault", 900), ("", 3600)] {
        let status = &tokens[audience];
        let keys: Vec<&String> = status.as_object().unwrap().keys().collect();
        assert_eq!(keys, vec!["expirationTimestamp", "token"], "{status}");
        let claims = jwt_claims(status["token"].as_str().unwrap());
        assert_eq!(
            claims["kubernetes.io"]["pod"]["name"],
            name.as_str(),
            "{claims}"
        );
        assert_eq!(
            claims["kubernetes.io"]["pod"]["uid"],
            uid.as_str(),
            "{claims}"
        );
        assert_eq!(
            claims["sub"], "system:serviceaccount:default:default",
            "{claims}"
        );
        let exp = claims["exp"].as_i64().unwrap();
        assert!(
            (exp - now - lifetime).abs() < 120,
            "{audience}: exp {exp}, now {now}"
        );
        if audience == "vault" {
            assert_eq!(claims["aud"], json!(["vault"]), "{claims}");
        } else {
            // No audience asked for: the API server's own.
            assert_ne!(claims["aud"], json!([""]), "{claims}");
        }
        assert!(
            status["expirationTimestamp"]
                .as_str()
                .is_some_and(|t| t.ends_with('Z') && t.len() == 20),
            "{status}"
        );
    }

    // requiresRepublish: published again at later syncs (every 2 s here), with the tokens,
    // the mount never taken away and the pod Ready throughout.
    eventually("a republish", DEADLINE, || async {
        let publishes = driver.calls("NodePublishVolume");
        (publishes.len() >= 3)
            .then_some(())
            .ok_or_else(|| format!("{} publishes", publishes.len()))
    })
    .await;
    for call in driver.calls("NodePublishVolume") {
        assert_eq!(call["target_path"], target.display().to_string());
        assert!(
            call["volume_context"]["csi.storage.k8s.io/serviceAccount.tokens"].is_string(),
            "{call}"
        );
    }
    assert!(driver.calls("NodeUnpublishVolume").is_empty());
    assert!(mount_points_under(&target).contains(&target));
    ready(&pods, &name).await.unwrap();
    node.stop().await;
}
