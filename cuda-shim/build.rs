//! Generates the shim's exports from `driver-api.list` (itself derived from cudarc's
//! bindings by `tools/gen-driver-api.py`): one pass-through per driver entry point
//! that `src/hooks.rs` or `src/memory_hooks.rs` do not define by hand, plus the symbol and address tables
//! `cuGetProcAddress` needs. Also gives the shared object the soname `libcuda.so.1`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;

/// Files of hand-written exports and their module paths: no pass-through is generated
/// for a `pub unsafe extern "C" fn` defined there.
const HOOK_FILES: &[(&str, &str)] = &[("src/hooks.rs", "crate::hooks"), ("src/memory_hooks.rs", "crate::memory_hooks")];

/// Calls answered without a lease: they touch no GPU state a checkpoint moves.
const UNGATED: &[&str] = &[
    "cuDriverGetVersion",
    "cuGetErrorString",
    "cuGetErrorName",
    "cuGetExportTable",
    "cuCheckpointProcessGetRestoreThreadId",
    "cuCheckpointProcessGetState",
    "cuCheckpointProcessLock",
    "cuCheckpointProcessCheckpoint",
    "cuCheckpointProcessRestore",
    "cuCheckpointProcessUnlock",
];

/// Device queries answered without a lease (`cuDeviceGet*`, `cuDeviceCanAccessPeer`,
/// `cuDeviceComputeCapability`, `cuDeviceTotalMem*`): they read properties of a GPU and
/// change nothing, so a process may plan before it asks for GPUs. `cuDevice*` calls that
/// change state (`cuDeviceSetMemPool`, `cuDeviceGraphMemTrim`, `cuDevicePrimaryCtx*`, ...)
/// are gated like everything else.
const DEVICE_QUERY_PREFIXES: &[&str] =
    &["cuDeviceGet", "cuDeviceCanAccessPeer", "cuDeviceComputeCapability", "cuDeviceTotalMem"];

/// Whether a generated pass-through skips the lease gate: the calls of [`UNGATED`] and
/// device queries with a device argument. Everything else (every launch, copy, memset,
/// allocation, synchronisation, context, module, stream, event and graph call) is gated.
fn is_ungated(name: &str, has_device: bool) -> bool {
    UNGATED.contains(&name) || (has_device && DEVICE_QUERY_PREFIXES.iter().any(|p| name.starts_with(p)))
}

fn rust_type(class: &str) -> Result<&'static str, String> {
    Ok(match class {
        "ptr" => "*mut ::core::ffi::c_void",
        "devout" => "*mut i32",
        "CUdevice" | "i32" => "i32",
        "ipc64" => "crate::abi::Ipc64",
        "memloc" => "crate::abi::MemLocation",
        "u32" => "u32",
        "u64" => "u64",
        "i64" => "i64",
        "usize" => "usize",
        "isize" => "isize",
        "u16" => "u16",
        "i16" => "i16",
        "u8" => "u8",
        "i8" => "i8",
        "f32" => "f32",
        "f64" => "f64",
        "CUresult" => "u32",
        other => return Err(format!("driver-api.list: unknown ABI class {other}")),
    })
}

/// The counters-file update a pass-through does before calling the driver (the same calls
/// and byte counts as `nbos-ebpf`'s `entry_points.rs` probes), or `None` for an uncounted call.
fn counting(name: &str, params: &[(String, String)]) -> Option<String> {
    let arg = |wanted: &[&str]| params.iter().find(|(_, c)| wanted.iter().any(|w| c == w)).map(|(p, _)| p.clone());
    let base = name.trim_end_matches("_ptsz").trim_end_matches("_ptds");
    if ["cuLaunchKernel", "cuLaunchKernelEx", "cuLaunchCooperativeKernel", "cuGraphLaunch"].contains(&base) {
        return Some("crate::counters::launch();".into());
    }
    if ["cuCtxSynchronize", "cuCtxSynchronize_v2", "cuStreamSynchronize", "cuEventSynchronize"].contains(&base) {
        return Some("crate::counters::sync();".into());
    }
    if let Some(rest) = base.strip_prefix("cuMemsetD") {
        let elem = if rest.contains("32") {
            4
        } else if rest.contains("16") {
            2
        } else {
            1
        };
        let bytes = if rest.starts_with("2D") {
            let w = arg(&["usize:Width"])?;
            let h = arg(&["usize:Height"])?;
            format!("({w} as u64).wrapping_mul({h} as u64).wrapping_mul({elem})")
        } else {
            format!("({} as u64).wrapping_mul({elem})", arg(&["usize:N"])?)
        };
        return Some(format!("crate::counters::memset({bytes});"));
    }
    if base.starts_with("cuMemcpy") && !base.contains("Batch") && !base.contains("WithAttributes") {
        // Linear copies carry their size as an argument; 2D/3D descriptors count as copies of 0 bytes.
        let bytes = arg(&["usize:ByteCount"]).map_or("0".to_owned(), |b| format!("{b} as u64"));
        return Some(format!("crate::counters::copy({bytes});"));
    }
    None
}

fn main() -> Result<(), String> {
    println!("cargo:rerun-if-changed=driver-api.list");
    for (file, _) in HOOK_FILES {
        println!("cargo:rerun-if-changed={file}");
    }
    // dlopen("libcuda.so.1") and -lcuda both find this library by its soname.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcuda.so.1");

    let list = std::fs::read_to_string("driver-api.list").map_err(|e| format!("driver-api.list: {e}"))?;
    // Hand-written exports, by name, with the module that defines them.
    let mut hooked: BTreeMap<String, &str> = BTreeMap::new();
    for (file, module) in HOOK_FILES {
        let text = std::fs::read_to_string(file).map_err(|e| format!("{file}: {e}"))?;
        for name in text
            .lines()
            .filter_map(|l| l.trim().strip_prefix("pub unsafe extern \"C\" fn "))
            .filter_map(|l| l.split('(').next())
        {
            hooked.insert(name.to_owned(), module);
        }
    }

    let mut names = Vec::new();
    let mut code = String::new();
    for line in list.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()) {
        let mut words = line.split_whitespace();
        let name = words.next().ok_or("empty line")?;
        let ret = rust_type(words.next().ok_or(format!("{name}: no return type"))?)?;
        let params: Vec<(String, String)> = words
            .enumerate()
            .map(|(i, w)| {
                let class = w.split_once(':').map_or(w, |(_, c)| c);
                (format!("a{i}"), class.to_owned())
            })
            .collect();
        // (argument, "class:name") pairs, so counting can find the size argument by its C name.
        let named: Vec<(String, String)> = line
            .split_whitespace()
            .skip(2)
            .enumerate()
            .map(|(i, w)| {
                let (n, c) = w.split_once(':').unwrap_or(("", w));
                (format!("a{i}"), format!("{c}:{n}"))
            })
            .collect();
        let idx = names.len();
        names.push(name.to_owned());
        if hooked.contains_key(name) {
            continue;
        }
        let mut sig = Vec::new();
        let mut types = Vec::new();
        for (p, c) in &params {
            let t = rust_type(c)?;
            sig.push(format!("{p}: {t}"));
            types.push(t);
        }
        let args: Vec<&str> = params.iter().map(|(p, _)| p.as_str()).collect();
        let has_device = params.iter().any(|(_, c)| c == "CUdevice" || c == "devout" || c == "memloc");
        let entry = if is_ungated(name, has_device) { "ungated" } else { "gated" };
        let lease = if has_device { "lease" } else { "_lease" };
        let _ = writeln!(code, "#[no_mangle]");
        let _ = writeln!(code, "pub unsafe extern \"C\" fn {name}({}) -> {ret} {{", sig.join(", "));
        let _ = writeln!(code, "    type F = unsafe extern \"C\" fn({}) -> {ret};", types.join(", "));
        let _ = writeln!(code, "    crate::gate::{entry}(|{lease}| {{");
        // A virtual ordinal whose leased GPU the driver does not list answers
        // CUDA_ERROR_INVALID_DEVICE here, before the driver could run it on another GPU.
        for (p, c) in &params {
            if c == "CUdevice" {
                let _ = writeln!(
                    code,
                    "        let {p} = match {lease}.physical({p}) {{ Ok(d) => d, Err(e) => return e }};"
                );
            }
            if c == "memloc" {
                // A device location names a virtual ordinal (CU_MEM_LOCATION_TYPE_DEVICE = 1).
                let _ = writeln!(
                    code,
                    "        let {p} = if {p}.kind == 1 {{ match {lease}.physical({p}.id) {{ Ok(d) => crate::abi::MemLocation {{ id: d, ..{p} }}, Err(e) => return e }} }} else {{ {p} }};"
                );
            }
        }
        let _ = writeln!(
            code,
            "        let Some(f) = crate::driver::function::<F>({idx}) else {{ return crate::abi::NOT_FOUND }};"
        );
        if let Some(count) = counting(name, &named) {
            let _ = writeln!(code, "        {count}");
        }
        let _ = writeln!(
            code,
            "        // SAFETY: `f` is the real driver's export of this very symbol, whose C signature\n        // driver-api.list records; the arguments are the caller's (device ordinals mapped to the lease's GPUs)."
        );
        let has_devout = params.iter().any(|(_, c)| c == "devout");
        if !has_devout {
            let _ = writeln!(code, "        unsafe {{ f({}) }}", args.join(", "));
            let _ = writeln!(code, "    }})");
            let _ = writeln!(code, "}}\n");
            continue;
        }
        let _ = writeln!(code, "        let r = unsafe {{ f({}) }};", args.join(", "));
        for (p, c) in &params {
            if c == "devout" {
                let _ = writeln!(
                    code,
                    "        // SAFETY: the driver just wrote a CUdevice through this caller-supplied pointer."
                );
                let _ = writeln!(
                    code,
                    "        if r == 0 && !{p}.is_null() {{ unsafe {{ *{p} = {lease}.virtual_of(*{p}) }} }}"
                );
            }
        }
        let _ = writeln!(code, "        r");
        let _ = writeln!(code, "    }})");
        let _ = writeln!(code, "}}\n");
    }

    let mut out = String::new();
    let _ = writeln!(out, "/// Number of driver entry points the shim exports.");
    let _ = writeln!(out, "pub const COUNT: usize = {};", names.len());
    let _ = writeln!(out, "/// Their names, sorted (index = position in the real-driver table).");
    let _ = writeln!(out, "pub static NAMES: [&::core::ffi::CStr; COUNT] = [");
    for n in &names {
        let _ = writeln!(out, "    c\"{n}\",");
    }
    let _ = writeln!(out, "];");
    let _ = writeln!(out, "/// The shim's own function for each name.");
    let _ = writeln!(out, "pub fn own_functions() -> [usize; COUNT] {{ [");
    for n in &names {
        let path = hooked.get(n.as_str()).map_or(String::new(), |m| format!("{m}::"));
        let _ = writeln!(out, "    {path}{n} as *const () as usize,");
    }
    let _ = writeln!(out, "] }}\n");
    out.push_str(&code);

    let dest = PathBuf::from(std::env::var("OUT_DIR").map_err(|e| e.to_string())?).join("driver_api.rs");
    std::fs::write(&dest, out).map_err(|e| format!("{}: {e}", dest.display()))?;
    Ok(())
}
