//! The answer cache in front of the TokenReview and SubjectAccessReview webhooks, as
//! upstream's token cache and the webhook authorizer's response cache: an answer is kept
//! for a TTL chosen from the answer (success and failure may differ), concurrent asks for
//! the same key share one review (upstream's singleflight), and errors are never kept.

use futures::FutureExt;
use futures::future::{BoxFuture, Shared};
use std::collections::HashMap;
use std::future::Future;
use std::hash::Hash;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Answers kept at most (upstream keeps 1024 authorization answers and a striped token
/// cache of similar size); a full cache first drops expired answers, then stops keeping
/// new ones until some expire.
pub const CAPACITY: usize = 4096;

type Review<V> = Shared<BoxFuture<'static, Result<V, String>>>;

enum Entry<V> {
    Ready { value: V, expires: Instant },
    Pending(Review<V>),
}

pub struct ReviewCache<K, V> {
    entries: Mutex<HashMap<K, Entry<V>>>,
    capacity: usize,
}

impl<K, V> ReviewCache<K, V>
where
    K: Hash + Eq + Clone,
    V: Clone + Send + Sync + 'static,
{
    pub fn new(capacity: usize) -> Self {
        Self {
            entries: Mutex::new(HashMap::new()),
            capacity,
        }
    }

    /// The kept answer for `key`, or the answer of `review` (shared with every concurrent
    /// caller for the same key), kept for `ttl(&answer)` when that is not zero.
    pub async fn get_or_review<F>(
        &self,
        key: K,
        review: F,
        ttl: impl Fn(&V) -> Duration,
    ) -> Result<V, String>
    where
        F: Future<Output = Result<V, String>> + Send + 'static,
    {
        let pending = {
            let mut entries = self.lock();
            match entries.get(&key) {
                Some(Entry::Ready { value, expires }) if *expires > Instant::now() => {
                    return Ok(value.clone());
                }
                Some(Entry::Pending(p)) => p.clone(),
                _ => {
                    let p = review.boxed().shared();
                    entries.insert(key.clone(), Entry::Pending(p.clone()));
                    p
                }
            }
        };
        let answer = pending.await;
        let mut entries = self.lock();
        // The first caller to finish files the answer; later ones find it filed.
        if matches!(entries.get(&key), Some(Entry::Pending(_))) {
            entries.remove(&key);
            if let Ok(value) = &answer {
                let ttl = ttl(value);
                if !ttl.is_zero() && self.make_room(&mut entries) {
                    let expires = Instant::now() + ttl;
                    let value = value.clone();
                    entries.insert(key, Entry::Ready { value, expires });
                }
            }
        }
        answer
    }

    /// How many answers are kept or under review.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().len()
    }

    fn make_room(&self, entries: &mut HashMap<K, Entry<V>>) -> bool {
        if entries.len() < self.capacity {
            return true;
        }
        let now = Instant::now();
        entries.retain(|_, e| match e {
            Entry::Ready { expires, .. } => *expires > now,
            Entry::Pending(_) => true,
        });
        entries.len() < self.capacity
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<K, Entry<V>>> {
        // A panic while holding the lock leaves a map that is still consistent.
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn counted(
        calls: &Arc<AtomicUsize>,
        answer: Result<u32, String>,
    ) -> BoxFuture<'static, Result<u32, String>> {
        let calls = calls.clone();
        async move {
            calls.fetch_add(1, Ordering::SeqCst);
            tokio::task::yield_now().await;
            answer
        }
        .boxed()
    }

    #[tokio::test]
    async fn answers_are_kept_for_their_ttl_and_errors_not_at_all() {
        let cache = ReviewCache::new(8);
        let calls = Arc::new(AtomicUsize::new(0));
        let long = |_: &u32| Duration::from_secs(60);
        for _ in 0..3 {
            let v = cache.get_or_review("a", counted(&calls, Ok(1)), long).await;
            assert_eq!(v, Ok(1));
        }
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        for _ in 0..2 {
            let v = cache
                .get_or_review("b", counted(&calls, Err("down".into())), long)
                .await;
            assert!(v.is_err());
        }
        assert_eq!(calls.load(Ordering::SeqCst), 3, "errors are asked again");
        let zero = |_: &u32| Duration::ZERO;
        cache
            .get_or_review("c", counted(&calls, Ok(2)), zero)
            .await
            .unwrap();
        cache
            .get_or_review("c", counted(&calls, Ok(2)), zero)
            .await
            .unwrap();
        assert_eq!(calls.load(Ordering::SeqCst), 5, "a zero TTL keeps nothing");
        let short = |_: &u32| Duration::from_millis(20);
        cache
            .get_or_review("d", counted(&calls, Ok(3)), short)
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(40)).await;
        cache
            .get_or_review("d", counted(&calls, Ok(3)), short)
            .await
            .unwrap();
        assert_eq!(
            calls.load(Ordering::SeqCst),
            7,
            "an expired answer is asked again"
        );
    }

    #[tokio::test]
    async fn concurrent_asks_share_one_review() {
        let cache = Arc::new(ReviewCache::new(8));
        let calls = Arc::new(AtomicUsize::new(0));
        let asks = (0..20).map(|_| {
            let cache = cache.clone();
            let review = counted(&calls, Ok(7));
            async move {
                cache
                    .get_or_review("k", review, |_| Duration::from_secs(60))
                    .await
            }
        });
        let answers = futures::future::join_all(asks).await;
        assert!(answers.iter().all(|a| *a == Ok(7)));
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_full_cache_keeps_no_more_answers() {
        let cache = ReviewCache::new(2);
        let calls = Arc::new(AtomicUsize::new(0));
        let long = |_: &u32| Duration::from_secs(60);
        for key in ["a", "b", "c"] {
            cache
                .get_or_review(key, counted(&calls, Ok(1)), long)
                .await
                .unwrap();
        }
        assert_eq!(cache.len(), 2);
        cache
            .get_or_review("c", counted(&calls, Ok(1)), long)
            .await
            .unwrap();
        assert_eq!(calls.load(Ordering::SeqCst), 4, "c was not kept");
    }
}
