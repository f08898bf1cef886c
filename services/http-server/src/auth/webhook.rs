//! Creating a review object (TokenReview, SubjectAccessReview) on the API server, with
//! upstream's webhook retry back-off (`DefaultAuthWebhookRetryBackoff`: 500 ms, ×1.5,
//! 5 attempts) for transport errors, 429 and 5xx, and a timeout per attempt.

use kube::api::{Api, PostParams};
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::fmt::Debug;
use std::time::Duration;

/// One attempt's time limit (the delegated authenticator's TokenReview timeout).
pub const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(10);
const FIRST_BACKOFF: Duration = Duration::from_millis(500);
const ATTEMPTS: u32 = 5;

/// POSTs `review` (a cluster-scoped create-only kind) and returns the server's answer.
pub async fn create<K>(client: &kube::Client, review: &K) -> Result<K, String>
where
    K: kube::Resource<DynamicType = ()> + Clone + Debug + Serialize + DeserializeOwned,
{
    let api: Api<K> = Api::all(client.clone());
    let mut backoff = FIRST_BACKOFF;
    let mut attempt = 1;
    loop {
        let result =
            tokio::time::timeout(ATTEMPT_TIMEOUT, api.create(&PostParams::default(), review)).await;
        let error = match result {
            Ok(Ok(answer)) => return Ok(answer),
            Ok(Err(e)) if !retriable(&e) => return Err(describe::<K>(&e.to_string())),
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("no answer within {ATTEMPT_TIMEOUT:?}"),
        };
        if attempt >= ATTEMPTS {
            return Err(describe::<K>(&format!(
                "{error} (after {attempt} attempts)"
            )));
        }
        tracing::debug!(kind = %K::kind(&()), attempt, %error, "webhook review failed; retrying");
        tokio::time::sleep(backoff).await;
        backoff = backoff.mul_f64(1.5);
        attempt += 1;
    }
}

fn describe<K: kube::Resource<DynamicType = ()>>(error: &str) -> String {
    format!("creating a {} on the API server: {error}", K::kind(&()))
}

fn retriable(e: &kube::Error) -> bool {
    match e {
        kube::Error::Api(status) => status.code == 429 || status.code >= 500,
        kube::Error::HyperError(_) | kube::Error::Service(_) => true,
        _ => false,
    }
}
