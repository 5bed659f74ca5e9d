//! The large-object store against a real S3-compatible server (moto, started by the test)
//! and a local directory: every URL form keeps its keys under its prefix, a policy scoped
//! to the prefix allows every call the daemon makes, and a server that stalls or fails
//! mid-upload fails the write within its limits, after which writes work again.

#[path = "common/s3.rs"]
mod s3;

use std::time::Duration;

use bytes::Bytes;
use notebookosd::cluster::cells::objects::{sha256_hex, ObjectError, Objects, S3Options};
use object_store::ObjectStore;
use s3::{Fault, FaultProxy, S3Server};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime")
}

/// Every key of the bucket, as an unprefixed client sees it.
async fn bucket_keys(server: &S3Server) -> Vec<String> {
    use futures_util::StreamExt;
    let bucket = object_store::aws::AmazonS3Builder::new()
        .with_bucket_name(&server.bucket)
        .with_endpoint(&server.endpoint)
        .with_allow_http(true)
        .with_access_key_id(&server.admin.key)
        .with_secret_access_key(&server.admin.secret)
        .with_region(&server.region)
        .build()
        .expect("raw bucket client");
    let mut keys: Vec<String> = bucket.list(None).map(|m| m.expect("list").location.to_string()).collect().await;
    keys.sort();
    keys
}

fn open(server: &S3Server, prefix: &str, timeout: Duration) -> Objects {
    let opts = server.options(&server.admin, &server.endpoint, timeout);
    Objects::open_with(Some(&server.url(prefix)), std::path::Path::new("/nonexistent"), &opts).expect("open s3")
}

#[test]
fn an_s3_prefix_holds_every_key_and_two_prefixes_are_kept_apart() {
    let server = S3Server::start("nbos-prefixes", "cluster-a", false);
    runtime().block_on(async {
        let a = open(&server, "cluster-a", Duration::from_secs(30));
        let b = open(&server, "team/cluster-b", Duration::from_secs(30));
        let root = open(&server, "", Duration::from_secs(30));
        let (da, db, dr) = (Bytes::from(vec![1u8; 300_000]), Bytes::from(vec![2u8; 1000]), Bytes::from_static(b"root"));
        let (sa, sb, sr) = (
            a.put(da.clone()).await.expect("put a"),
            b.put(db).await.expect("put b"),
            root.put(dr).await.expect("put root"),
        );
        assert_eq!(
            bucket_keys(&server).await,
            {
                let mut want = vec![
                    format!("cluster-a/objects/{sa}"),
                    format!("objects/{sr}"),
                    format!("team/cluster-b/objects/{sb}"),
                ];
                want.sort();
                want
            },
            "each store's keys are under its URL's prefix"
        );
        let names = |l: Vec<notebookosd::cluster::cells::objects::StoredObject>| {
            l.into_iter().map(|o| o.sha256).collect::<Vec<_>>()
        };
        assert_eq!(names(a.list().await.expect("list a")), vec![sa.clone()], "a lists only its own");
        assert_eq!(names(b.list().await.expect("list b")), vec![sb.clone()]);
        // The unprefixed store lists `objects/` at the root only, not the clusters' objects.
        assert_eq!(names(root.list().await.expect("list root")), vec![sr.clone()]);
        assert!(matches!(b.get(&sa).await, Err(ObjectError::NotFound { .. })), "b cannot read a's object");
        assert_eq!(a.get(&sa).await.expect("get a"), da);
        b.delete(&sb).await.expect("delete b");
        b.delete(&sb).await.expect("deleting an absent object is no error");
        assert_eq!(a.get(&sa).await.expect("a untouched"), da);
        let head = a.head(&sa).await.expect("head").expect("present");
        assert_eq!((head.sha256.as_str(), head.size), (sa.as_str(), 300_000));
    });
}

#[test]
fn a_policy_scoped_to_the_prefix_allows_every_object_call_and_refuses_the_root() {
    let server = S3Server::start("nbos-policy", "cluster-a", true);
    runtime().block_on(async {
        let scoped = |url: &str| {
            let opts = server.options(&server.scoped, &server.endpoint, Duration::from_secs(30));
            Objects::open_with(Some(url), std::path::Path::new("/nonexistent"), &opts).expect("open")
        };
        let inside = scoped(&server.url("cluster-a"));
        let data = Bytes::from(vec![9u8; 200_000]);
        let sha = inside.put(data.clone()).await.expect("a write under the prefix is allowed");
        assert_eq!(inside.get(&sha).await.expect("read"), data);
        assert!(inside.head(&sha).await.expect("head").is_some());
        inside.delete(&sha).await.expect("delete");
        assert!(inside.head(&sha).await.expect("head").is_none());
        // What the daemon did before prefixes were honoured: keys at the bucket root.
        let err = scoped(&server.url("")).put(data).await.expect_err("a write outside the prefix is refused");
        assert!(format!("{err}").contains("Access Denied") || format!("{err}").contains("403"), "{err}");
    });
}

#[test]
fn a_file_url_keeps_objects_under_its_directory() {
    let dir = tempfile::tempdir().expect("tmp");
    runtime().block_on(async {
        let store = dir.path().join("store");
        let objects = Objects::open(Some(&format!("file://{}", store.display())), dir.path()).expect("open file://");
        let sha = objects.put(Bytes::from_static(b"payload")).await.expect("put");
        assert!(store.join("objects").join(&sha).is_file());
        assert_eq!(objects.list().await.expect("list").len(), 1);
        // Another tool's file in the store is not an object (nor collected).
        std::fs::write(store.join("objects").join("README"), "x").expect("write");
        assert_eq!(objects.list().await.expect("list").len(), 1);
    });
}

#[test]
fn a_stalled_or_failing_upload_fails_within_the_limits_and_the_next_write_works() {
    let server = S3Server::start("nbos-faults", "cluster-a", false);
    let proxy = FaultProxy::start(&server.endpoint);
    runtime().block_on(async {
        let opts: S3Options = server.options(&server.admin, &proxy.endpoint, Duration::from_secs(2));
        let objects = Objects::open_with(Some(&server.url("cluster-a")), std::path::Path::new("/nonexistent"), &opts)
            .expect("open");
        let big = |n: u8| Bytes::from(vec![n; 4 << 20]);
        objects.put(big(1)).await.expect("a write through the proxy");
        // The hang guard only: the store gives up after 2 s per request and one retry.
        let guard = Duration::from_secs(60);
        for fault in [Fault::Stall, Fault::Fail] {
            proxy.set(fault);
            let r = tokio::time::timeout(guard, objects.put(big(2))).await.expect("the write gave up, it did not hang");
            let err = r.expect_err("a write to a server that stalls or fails mid-upload fails");
            assert!(matches!(err, ObjectError::Backend { .. }), "{fault:?}: {err}");
            proxy.set(Fault::Pass);
            let sha =
                tokio::time::timeout(guard, objects.put(big(3))).await.expect("no hang").expect("the next write works");
            assert_eq!(sha, sha256_hex(&big(3)));
            assert_eq!(objects.get(&sha).await.expect("read back").len(), 4 << 20);
        }
    });
}
