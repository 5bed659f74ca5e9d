//! Request bodies of the HTTP APIs (daemon/src/gateway, daemon/src/cluster/http.rs), and the
//! kernel ids in their paths: what any API client (with the token, or on loopback) sends.
//!
//! Input: the first byte picks the surface, the rest is the body:
//! 0: `POST /api/kernels` ([`CreateKernel`]), 1: `POST /api/v1/cluster/kernels`
//! ([`KernelSpec`]), 2: `POST /api/v1/cluster/members` ([`PeerRecord`]), 3: a kernel id
//! from a URL path.
//!
//! Invariants: the GPU memory limit is accepted only as a number in its range; only
//! client-settable variables (`KERNEL_*`, `JPY_SESSION_NAME`, plain names) survive the
//! environment filter and every other one is counted; the cluster bodies round-trip; a
//! kernel id is accepted only in canonical UUID form (never a path), and the 404 for a bad
//! one does not echo more than 64 characters of it.

use notebookosd::cluster::control::meta::PeerRecord;
use notebookosd::cluster::KernelSpec;
use notebookosd::gateway::error::ApiError;
use notebookosd::gateway::kernel_request::CreateKernel;
use notebookosd::kernel::client_env::{is_client_settable, settable};
use notebookosd::kernel::is_kernel_id;
use notebookosd::kernel::registry::{parse_gpu_memory_mib, GPU_MEMORY_ENV, MAX_GPU_MEMORY_MIB};

fn main() {
    afl::fuzz!(|data: &[u8]| {
        let Some((&which, body)) = data.split_first() else { return };
        match which % 4 {
            0 => create_kernel(body),
            1 => {
                let Ok(spec) = serde_json::from_slice::<KernelSpec>(body) else { return };
                let again = serde_json::to_vec(&spec).expect("serialises");
                assert_eq!(serde_json::from_slice::<KernelSpec>(&again).expect("re-parses"), spec);
                check_env(spec.env.into_iter().collect());
            }
            2 => {
                let Ok(peer) = serde_json::from_slice::<PeerRecord>(body) else { return };
                let again = serde_json::to_vec(&peer).expect("serialises");
                assert_eq!(serde_json::from_slice::<PeerRecord>(&again).expect("re-parses"), peer);
            }
            _ => kernel_id(body),
        }
    });
}

/// As `gateway::kernels::create` reads the body: blank means the defaults.
fn create_kernel(body: &[u8]) {
    let req: CreateKernel = if body.iter().all(u8::is_ascii_whitespace) {
        CreateKernel::default()
    } else {
        match serde_json::from_slice(body) {
            Ok(r) => r,
            Err(e) => {
                assert!(!e.to_string().is_empty());
                return;
            }
        }
    };
    if let Some(mib) = req.gpu_memory_mib {
        check_memory_limit(&mib.to_string());
    }
    if let Some(v) = req.env.get(GPU_MEMORY_ENV) {
        check_memory_limit(v);
    }
    check_env(req.env.into_iter().collect());
}

fn check_memory_limit(value: &str) {
    match parse_gpu_memory_mib(value) {
        Ok(mib) => {
            assert!((1..=MAX_GPU_MEMORY_MIB).contains(&mib), "{value:?} accepted as {mib} MiB");
            assert_eq!(value.trim().parse::<u64>().ok(), Some(mib), "{value:?} is not the number {mib}");
        }
        Err(e) => assert!(e.contains(GPU_MEMORY_ENV), "{e}"),
    }
}

fn check_env(env: Vec<(String, String)>) {
    let n = env.len();
    let (kept, dropped) = settable(env);
    assert_eq!(kept.len() + dropped, n, "a variable neither kept nor counted");
    for (k, _) in &kept {
        assert!(is_client_settable(k));
        let plain = !k.is_empty() && k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
        assert!(plain && (k.starts_with("KERNEL_") || k == "JPY_SESSION_NAME"), "{k:?} was let through");
    }
}

fn kernel_id(raw: &[u8]) {
    let Ok(id) = std::str::from_utf8(raw) else { return };
    let accepted = is_kernel_id(id);
    assert_eq!(ApiError::check_kernel_id(id).is_ok(), accepted);
    if accepted {
        assert_eq!(id.len(), 36, "{id:?}");
        for (i, b) in id.bytes().enumerate() {
            let hyphen = matches!(i, 8 | 13 | 18 | 23);
            assert!(if hyphen { b == b'-' } else { matches!(b, b'0'..=b'9' | b'a'..=b'f') }, "{id:?}");
        }
    } else {
        let message = ApiError::no_kernel(id).message;
        assert!(message.chars().count() <= "Kernel does not exist: ".len() + 64, "{message:?}");
    }
}
