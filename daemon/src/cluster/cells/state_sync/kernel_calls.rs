//! Calls into `nbos_kernel.sync` inside a kernel (export, apply, digest, execution
//! count), run silently through the kernel's shell.

use std::time::Duration;

use anyhow::Context;

use crate::kernel::LocalKernel;

/// `s` as a Python string literal.
pub(super) fn py_str(s: &str) -> String {
    // A JSON string is a valid Python string literal for what we pass (paths).
    serde_json::Value::from(s).to_string()
}

/// The namespace digest of `kernel` (`nbos_kernel.sync.namespace_digest()`): equal on
/// two replicas with equal state.
pub async fn namespace_digest(kernel: &LocalKernel, timeout: Duration) -> anyhow::Result<String> {
    let v = call_sync(kernel, "namespace_digest()", timeout).await?;
    let text = v.as_str().context("namespace_digest returned no text")?;
    Ok(text.trim_matches('\'').to_owned())
}

/// Calls `nbos_kernel.sync.{call}` silently in `kernel` and returns its value: the JSON
/// of a `SyncResult`, else the text repr. A Python exception is an error naming it.
pub(super) async fn call_sync(
    kernel: &LocalKernel,
    call: &str,
    timeout: Duration,
) -> anyhow::Result<serde_json::Value> {
    let expr = format!("__import__('nbos_kernel.sync', fromlist=['sync']).{call}");
    let content = kernel.run_internal("", &serde_json::json!({ "r": expr }), timeout).await?;
    let r = &content["user_expressions"]["r"];
    anyhow::ensure!(
        r["status"] == "ok",
        "nbos_kernel.sync.{} failed in the kernel: {}: {}",
        call.split('(').next().unwrap_or(call),
        r["ename"].as_str().unwrap_or("?"),
        r["evalue"].as_str().unwrap_or("?")
    );
    let data = &r["data"];
    Ok(data.get("application/json").cloned().unwrap_or_else(|| data["text/plain"].clone()))
}
