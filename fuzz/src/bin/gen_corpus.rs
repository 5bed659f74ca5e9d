//! Writes the seed corpus, `fuzz/corpus/<target>/`, from messages the real encoders produce
//! (and the shipped config files): `make fuzz-corpus`. The files are committed, so this runs
//! only when a format changes; it writes into the source tree, wherever it is built.

use std::path::Path;
use std::time::{Duration, UNIX_EPOCH};

use bytes::Bytes;
use nbos_fuzz::{join_frames, WIRE_KEY};
use nbos_lease_proto::{encode, Message as Lease};
use notebookosd::jupyter::ws::{to_legacy_binary, to_v1_binary};
use notebookosd::jupyter::{wire, Channel, Message, Signer};
use raft_store::transport::frame;
use serde_json::json;

fn main() -> std::io::Result<()> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
    let write = |target: &str, name: &str, bytes: &[u8]| -> std::io::Result<()> {
        let dir = root.join(target);
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join(name), bytes)
    };

    // Lease protocol: each message as the shim or the daemon sends it, and a shim's session.
    let gpu = *b"GPU-0123456789ab";
    let lease = [
        Lease::Register { kernel_id: "6f1c1a7e-2b9d-4c3e-8f00-0123456789ab".into(), replica: 1, pid: 4242 },
        Lease::Registered {
            device_count: 2,
            activity_interval_ms: 500,
            memory_limit_bytes: 8 << 30,
            host_pid: 424_242,
            driver_path: "/usr/lib/x86_64-linux-gnu/libcuda.so.1".into(),
        },
        Lease::Request { gpus: 2 },
        Lease::Grant { lease: 7, gpus: vec![gpu, gpu] },
        Lease::Revoke { lease: 7 },
        Lease::Released { lease: 7 },
        Lease::Activity { calls: 1000, waits: 3 },
        Lease::Refused { reason: "too many lease connections for uid 1000".into() },
        Lease::GpusNotVisible { lease: 7, gpus: vec![gpu] },
    ];
    let mut session = Vec::new();
    for (i, m) in lease.iter().enumerate() {
        let mut f = Vec::new();
        encode(m, &mut f);
        write("lease_proto", &format!("msg-{}", m.tag()), &f)?;
        if i % 2 == 0 {
            session.extend_from_slice(&f);
        }
    }
    write("lease_proto", "session", &session)?;

    // Raft transport: the frames of a connection (HELLO first), forwarded requests and answers.
    let max = 1 << 20;
    write("raft_frame", "hello", &frame::hello(3))?;
    write("raft_frame", "keepalive", &frame::keepalive())?;
    let raft = frame::raft(1, b"\x08\x03\x10\x01\x18\x02\x20\x05", max).unwrap_or_default();
    write("raft_frame", "raft", &raft)?;
    let mut conn = frame::hello(2).to_vec();
    for (i, (answer, payload)) in raft_store::fuzz_forward_seeds().into_iter().enumerate() {
        let id = 100 + i as u64;
        let f = if answer { frame::answer(id, &payload, max) } else { frame::forward(id, &payload, max) };
        let f = f.unwrap_or_default();
        write("raft_frame", &format!("{}-{i}", if answer { "answer" } else { "forward" }), &f)?;
        conn.extend_from_slice(&f);
    }
    conn.extend_from_slice(&frame::keepalive());
    write("raft_frame", "connection", &conn)?;

    // Jupyter messages as a client and a kernel send them.
    let t = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    let execute = Message::new("execute_request", "sess-1", "msg-1", t, None, &json!({"code": "1+1", "silent": false}));
    let status =
        Message::new("status", "sess-k", "msg-2", t, Some(&execute.header), &json!({"execution_state": "busy"}));
    let info = Message::new("kernel_info_request", "sess-1", "msg-3", t, None, &json!({}));
    let mut comm = Message::new("comm_msg", "sess-1", "msg-4", t, None, &json!({"comm_id": "c1", "data": {}}));
    comm.buffers = vec![Bytes::from_static(b"\x00\x01\x02\x03"), Bytes::from_static(b"buffer two")];
    let signer = Signer::new(WIRE_KEY);
    let messages = [("execute", &execute), ("status", &status), ("info", &info), ("comm", &comm)];
    for (name, m) in messages {
        let frames = wire::serialize(&[Bytes::from_static(b"client-identity")], m, &signer);
        for mode in [0u8, 1] {
            let mut input = vec![mode];
            input.extend_from_slice(&join_frames(&frames));
            write("jupyter_wire", &format!("{name}-{mode}"), &input)?;
        }
    }

    // WebSocket frames: jupyter_server's JSON (no channel, float date), legacy binary, v1.
    let text = br#"{"header":{"msg_id":"m1","msg_type":"execute_request","date":1700000001.5,"session":"s","username":"u","version":"5.3"},"parent_header":{},"metadata":{},"content":{"code":"print(1)","silent":false}}"#;
    write("jupyter_ws", "text-gateway-client", &[&[0u8][..], text].concat())?;
    let text = br#"{"channel":"control","header":{"msg_id":"m2","msg_type":"interrupt_request","date":"2023-11-14T22:13:20.000000Z"},"content":{}}"#;
    write("jupyter_ws", "text-control", &[&[0u8][..], text].concat())?;
    for (name, ch, m) in [("shell", Channel::Shell, &comm), ("iopub", Channel::Iopub, &status)] {
        if let Ok(legacy) = to_legacy_binary(ch, m) {
            write("jupyter_ws", &format!("legacy-{name}"), &[&[1u8][..], &legacy].concat())?;
        }
        write("jupyter_ws", &format!("v1-{name}"), &[&[2u8][..], &to_v1_binary(ch, m)].concat())?;
    }

    // REST bodies as clients send them, and kernel ids.
    let bodies: [(&str, u8, &[u8]); 8] = [
        ("create-empty", 0, b""),
        (
            "create-gateway",
            0,
            br#"{"name":"python3","env":{"KERNEL_USERNAME":"ada","KERNEL_GPUS":"2","LD_PRELOAD":"/tmp/x.so"}}"#,
        ),
        (
            "create-gpus",
            0,
            br#"{"name":"python3","gpus":1,"gpu_memory_mib":4096,"env":{"JPY_SESSION_NAME":"nb.ipynb"}}"#,
        ),
        (
            "cluster-kernel",
            1,
            br#"{"id":"6f1c1a7e-2b9d-4c3e-8f00-0123456789ab","name":"python3","gpus":2,"env":{"KERNEL_X":"1"}}"#,
        ),
        ("cluster-member", 2, br#"{"node_id":4,"raft_addr":"10.0.0.4:8890"}"#),
        ("kernel-id", 3, b"6f1c1a7e-2b9d-4c3e-8f00-0123456789ab"),
        ("kernel-id-upper", 3, b"6F1C1A7E-2B9D-4C3E-8F00-0123456789AB"),
        ("kernel-id-path", 3, b"../../etc"),
    ];
    for (name, which, body) in bodies {
        write("gateway_bodies", name, &[&[which][..], body].concat())?;
    }

    // Config files: the shipped default and the cluster example of docs/cluster.md.
    let shipped = include_bytes!("../../../packaging/notebookosd.toml");
    write("config_file", "shipped", shipped)?;
    let cluster = br#"[node]
name = "gpu-host-2"
state_dir = "/var/lib/notebookos"

[http]
listen = "0.0.0.0:8888"
token_file = "/etc/notebookos/token"

[gpu]
driver = "fake"
fake_gpus = 4
idle_release = "1m 30s"

[cluster]
enabled = true
node_id = 2
raft_listen = "0.0.0.0:8890"
advertise_url = "http://gpu-host-2.example:8888"
seeds = ["1=gpu-host-1.example:8890", "2=gpu-host-2.example:8890", "3=gpu-host-3.example:8890"]
tls = { ca_cert = "/etc/notebookos/cluster-ca.pem", cert = "/etc/notebookos/node.pem", key = "/etc/notebookos/node-key.pem" }
object_store = "s3://notebookos-objects/cluster-a"
"#;
    write("config_file", "cluster", cluster)?;
    Ok(())
}
