//! `GET /api/kernelspecs[/{name}]` and `GET /kernelspecs/{name}/{resource}`.

use axum::extract::Path;
use axum::Json;

use super::error::ApiError;
use crate::kernel::spec;

/// All kernelspecs and the default.
pub async fn list() -> Json<serde_json::Value> {
    let specs: serde_json::Map<String, serde_json::Value> = spec::all()
        .into_iter()
        .map(|s| {
            let name = s.name.clone();
            (name, serde_json::to_value(s).unwrap_or_default())
        })
        .collect();
    Json(serde_json::json!({ "default": spec::DEFAULT_SPEC, "kernelspecs": specs }))
}

/// One kernelspec.
pub async fn get(Path(name): Path<String>) -> Result<Json<spec::KernelSpecModel>, ApiError> {
    spec::get(&name).map(Json).ok_or_else(|| ApiError::not_found(format!("Kernel spec {name} not found")))
}

/// A kernelspec resource file. No spec ships resources (logos), so this is 404
/// for everything; it distinguishes an unknown spec from an unknown resource.
pub async fn resource(Path((name, resource)): Path<(String, String)>) -> ApiError {
    if spec::get(&name).is_none() {
        return ApiError::not_found(format!("Kernel spec {name} not found"));
    }
    ApiError::not_found(format!("Kernel spec {name} has no resource {resource}"))
}
