//! `list-s3`: the "straight from the store with a parallel S3 client"
//! reference of W4. The whole prefix tree is listed with delimiter `/`,
//! descending into every common prefix as it is found, with up to N
//! listings in flight; each prefix is paged with continuation tokens (its
//! pages one after another, as S3 requires). Only counting, no file system:
//! what listing the dataset costs at the least.

use std::collections::VecDeque;
use std::future::Future;
use std::time::{Duration, Instant};

use anyhow::anyhow;
use aws_sdk_s3::Client;
use futures_util::stream::{FuturesUnordered, StreamExt};

use super::client::error_text;
use crate::listing::ListPass;
use crate::manifest::Manifest;
use crate::s3::upload::MARKER_NAME;

/// Problems kept verbatim at most.
const MAX_PROBLEMS: usize = 20;

/// One page of a delimited listing.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Page {
    /// Keys (full) and sizes.
    pub keys: Vec<(String, u64)>,
    /// Common prefixes (full, ending in the delimiter).
    pub prefixes: Vec<String>,
    /// The continuation token of the next page of the same prefix.
    pub next: Option<String>,
}

/// What a listing counted so far.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ListCount {
    pub keys: u64,
    pub bytes: u64,
    /// Common prefixes found (each listed in turn).
    pub prefixes: u64,
    /// Keys left out: the dataset marker under the root prefix.
    pub ignored: u64,
    /// LIST requests made (failed ones included).
    pub requests: u64,
    pub errors: u64,
    pub problems: Vec<String>,
}

/// Lists everything under `root` through `list(prefix, token)` (one LIST
/// request: a page of `prefix` with delimiter `/`), with up to `parallel`
/// requests in flight, into `count`. A failed request is counted as an
/// error and its prefix is not listed further (the count then falls short).
pub async fn list_tree<F, Fut>(root: &str, parallel: usize, list: F, count: &mut ListCount)
where
    F: Fn(String, Option<String>) -> Fut,
    Fut: Future<Output = anyhow::Result<Page>>,
{
    let marker = format!("{root}{MARKER_NAME}");
    let mut pending: VecDeque<(String, Option<String>)> =
        VecDeque::from([(root.to_string(), None)]);
    let mut inflight = FuturesUnordered::new();
    loop {
        while inflight.len() < parallel.max(1) {
            let Some((prefix, token)) = pending.pop_front() else {
                break;
            };
            let page = list(prefix.clone(), token);
            inflight.push(async move { (prefix, page.await) });
        }
        let Some((prefix, result)) = inflight.next().await else {
            break;
        };
        count.requests += 1;
        match result {
            Ok(page) => {
                for (key, size) in page.keys {
                    if key == marker {
                        count.ignored += 1;
                    } else {
                        count.keys += 1;
                        count.bytes += size;
                    }
                }
                count.prefixes += page.prefixes.len() as u64;
                // Finish a prefix's pages before starting new prefixes.
                if let Some(token) = page.next {
                    pending.push_front((prefix, Some(token)));
                }
                pending.extend(page.prefixes.into_iter().map(|p| (p, None)));
            }
            Err(e) => {
                count.errors += 1;
                if count.problems.len() < MAX_PROBLEMS {
                    count.problems.push(format!("error: {e:#}"));
                }
            }
        }
    }
}

/// Lists the dataset of `manifest` in `bucket` with `parallel` LISTs in
/// flight (pages of up to 1,000 keys), stopped at `timeout`, and checks the
/// count and sizes against the manifest.
pub async fn list_store(
    s3: &Client,
    manifest: &Manifest,
    bucket: &str,
    parallel: usize,
    timeout: Option<Duration>,
) -> ListPass {
    let root = manifest.header.prefix.clone();
    let list = |prefix: String, token: Option<String>| async move {
        let mut req = s3
            .list_objects_v2()
            .bucket(bucket)
            .prefix(&prefix)
            .delimiter("/")
            .max_keys(1000);
        if let Some(t) = token {
            req = req.continuation_token(t);
        }
        let out = req
            .send()
            .await
            .map_err(|e| anyhow!("list {bucket}/{prefix}: {}", error_text(&e)))?;
        let next = out
            .next_continuation_token()
            .filter(|_| out.is_truncated() == Some(true))
            .map(str::to_string);
        Ok(Page {
            keys: out
                .contents()
                .iter()
                .filter_map(|o| Some((o.key()?.to_string(), o.size().unwrap_or(0).max(0) as u64)))
                .collect(),
            prefixes: out
                .common_prefixes()
                .iter()
                .filter_map(|p| p.prefix().map(str::to_string))
                .collect(),
            next,
        })
    };
    let mut count = ListCount::default();
    let started = Instant::now();
    let timed_out = match timeout {
        Some(t) => tokio::time::timeout(t, list_tree(&root, parallel, list, &mut count))
            .await
            .is_err(),
        None => {
            list_tree(&root, parallel, list, &mut count).await;
            false
        }
    };
    let elapsed = started.elapsed().as_secs_f64();
    ListPass {
        tool: "list-s3".into(),
        phase: "list".into(),
        source: format!("s3://{bucket}/{root}"),
        parallel,
        objects: count.keys,
        bytes: Some(count.bytes),
        expected_objects: manifest.header.objects as u64,
        expected_bytes: manifest.header.bytes,
        ignored: count.ignored,
        list_requests: Some(count.requests),
        elapsed_s: elapsed,
        objects_per_s: 0.0,
        timed_out_s: timed_out.then_some(elapsed),
        errors: count.errors,
        wrong: false,
        problems: count.problems,
    }
    .finish()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Mutex;

    use super::*;

    /// A store's delimited listing over `keys`, `page` keys and prefixes a
    /// page, the token being the last entry returned, as S3 does.
    fn fake_page(
        keys: &BTreeMap<String, u64>,
        prefix: &str,
        token: Option<&str>,
        page: usize,
    ) -> Page {
        let mut entries: Vec<(String, Option<u64>)> = Vec::new();
        for (k, &size) in keys.range(prefix.to_string()..) {
            let Some(rest) = k.strip_prefix(prefix) else {
                break;
            };
            match rest.find('/') {
                Some(i) => {
                    let p = format!("{prefix}{}", &rest[..=i]);
                    if entries.last().map(|(e, _)| e) != Some(&p) {
                        entries.push((p, None));
                    }
                }
                None => entries.push((k.clone(), Some(size))),
            }
        }
        let start = token.map_or(0, |t| {
            entries
                .iter()
                .position(|(e, _)| e.as_str() == t)
                .map_or(entries.len(), |i| i + 1)
        });
        let mut out = Page::default();
        let chunk: Vec<_> = entries.iter().skip(start).take(page).collect();
        for (e, size) in &chunk {
            match size {
                Some(s) => out.keys.push((e.clone(), *s)),
                None => out.prefixes.push(e.clone()),
            }
        }
        if start + chunk.len() < entries.len() {
            out.next = chunk.last().map(|(e, _)| e.clone());
        }
        out
    }

    fn w4_keys(prefix: &str) -> BTreeMap<String, u64> {
        crate::dataset::Plan::new(crate::dataset::Workload::W4, 0.01, 3)
            .expect("plan")
            .objects
            .into_iter()
            .map(|o| (format!("{prefix}{}", o.key), o.size))
            .collect()
    }

    #[tokio::test(flavor = "current_thread")]
    async fn lists_every_key_of_the_w4_tree_once_with_pages_and_prefixes() {
        let mut keys = w4_keys("ds/");
        let total: u64 = keys.values().sum();
        keys.insert(format!("ds/{MARKER_NAME}"), 40);
        keys.insert("other/x".into(), 1);
        let in_flight = AtomicU64::new(0);
        let most = AtomicU64::new(0);
        let calls = Mutex::new(Vec::new());
        let list = |prefix: String, token: Option<String>| {
            let keys = &keys;
            let (in_flight, most, calls) = (&in_flight, &most, &calls);
            async move {
                let n = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(n, Ordering::SeqCst);
                tokio::task::yield_now().await;
                calls.lock().unwrap().push(prefix.clone());
                in_flight.fetch_sub(1, Ordering::SeqCst);
                Ok(fake_page(keys, &prefix, token.as_deref(), 300))
            }
        };
        let mut count = ListCount::default();
        list_tree("ds/", 8, list, &mut count).await;
        // 1,000 flat + 10 prefixes of 1,000: the marker left out.
        assert_eq!(count.keys, 11_000);
        assert_eq!(count.bytes, total);
        assert_eq!(count.ignored, 1);
        assert_eq!(count.prefixes, 2 + 10);
        // ds/ (1 page: the marker and 2 prefixes), flat/ (4 pages of 300),
        // tree/ (1), each tree/pNNNN/ (4).
        assert_eq!(count.requests, 1 + 4 + 1 + 10 * 4);
        assert_eq!(count.errors, 0);
        assert!(most.load(Ordering::SeqCst) > 1, "listings overlap");
        assert!(most.load(Ordering::SeqCst) <= 8);
        let calls = calls.into_inner().unwrap();
        assert_eq!(calls.iter().filter(|p| *p == "ds/flat/").count(), 4);
        assert!(!calls.iter().any(|p| p.starts_with("other")));
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_failed_listing_is_an_error_and_its_keys_are_missing() {
        let keys = w4_keys("");
        let list = |prefix: String, token: Option<String>| {
            let keys = &keys;
            async move {
                if prefix == "tree/p0003/" {
                    return Err(anyhow!("list tree/p0003/: SlowDown"));
                }
                Ok(fake_page(keys, &prefix, token.as_deref(), 1000))
            }
        };
        let mut count = ListCount::default();
        list_tree("", 64, list, &mut count).await;
        assert_eq!(count.keys, 10_000);
        assert_eq!(count.errors, 1);
        assert!(
            count.problems[0].contains("SlowDown"),
            "{:?}",
            count.problems
        );
        assert_eq!(count.requests, 1 + 1 + 1 + 10);
    }
}
