//! Whether the socket listening on one of a kernel's ports is the kernel's own.
//!
//! The daemon picks a kernel's ports, releases them, and the kernel binds them: in between,
//! any local process can bind one first, and the daemon would connect to it (issue 29: such
//! a process could send the frame that aborted the daemon, with no credential at all). So
//! before it connects, the daemon looks the listener up in `/proc/net/tcp{,6}` and checks
//! that its socket is one of the kernel process's open files.

use std::net::IpAddr;

/// Who listens on a port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listener {
    /// Nothing yet.
    Nobody,
    /// The kernel process (and nothing else that would take the connection).
    Kernel,
    /// Another process: the connection could reach it.
    Another,
}

/// A kernel port that another process listens on.
#[derive(Debug, thiserror::Error)]
#[error("port {port} is held by a process that is not the kernel (pid {pid}): not connecting to it")]
pub struct PortTaken {
    /// The port.
    pub port: u16,
    /// The kernel's pid.
    pub pid: u32,
}

/// Who listens on `ip:port` (or on the wildcard address and `port`, which would also take a
/// connection to `ip`), as seen from the kernel `pid`.
pub fn listener(ip: IpAddr, port: u16, pid: u32) -> anyhow::Result<Listener> {
    use anyhow::Context;
    let mut inodes = Vec::new();
    let tables = [procfs::net::tcp(), procfs::net::tcp6()];
    for table in tables {
        // A host without IPv6 has no tcp6 table.
        let Ok(entries) = table else { continue };
        inodes.extend(
            entries
                .into_iter()
                .filter(|e| e.state == procfs::net::TcpState::Listen && e.local_address.port() == port)
                .filter(|e| e.local_address.ip() == ip || e.local_address.ip().is_unspecified())
                .map(|e| e.inode),
        );
    }
    if inodes.is_empty() {
        return Ok(Listener::Nobody);
    }
    let pid_i32 = i32::try_from(pid).context("pid out of range")?;
    let process = procfs::process::Process::new(pid_i32).with_context(|| format!("reading /proc/{pid}"))?;
    let own: Vec<u64> = process
        .fd()
        .with_context(|| format!("listing /proc/{pid}/fd"))?
        .filter_map(Result::ok)
        .filter_map(|fd| match fd.target {
            procfs::process::FDTarget::Socket(inode) => Some(inode),
            _ => None,
        })
        .collect();
    Ok(if inodes.iter().all(|i| own.contains(i)) { Listener::Kernel } else { Listener::Another })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, TcpListener};

    const LOOPBACK: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

    #[test]
    fn a_listener_of_this_process_is_the_kernels_and_of_another_is_not() {
        let l = TcpListener::bind((LOOPBACK, 0)).expect("bind");
        let port = l.local_addr().expect("addr").port();
        assert_eq!(listener(LOOPBACK, port, std::process::id()).expect("lookup"), Listener::Kernel);
        // The same socket seen as another process's (pid 1 holds no socket of ours).
        assert_eq!(listener(LOOPBACK, port, 1).expect("lookup"), Listener::Another);
        drop(l);
        assert_eq!(listener(LOOPBACK, port, std::process::id()).expect("lookup"), Listener::Nobody);
    }

    #[test]
    fn a_wildcard_listener_of_another_process_counts_as_another() {
        // A child process listening on 0.0.0.0 would take connections to 127.0.0.1 too.
        let mut child = std::process::Command::new("python3")
            .args([
                "-c",
                "import socket,sys\ns=socket.socket()\ns.bind(('0.0.0.0',0))\ns.listen()\nprint(s.getsockname()[1],flush=True)\nsys.stdin.read()",
            ])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("python3");
        let mut line = String::new();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(child.stdout.as_mut().expect("stdout")), &mut line)
            .expect("port");
        let port: u16 = line.trim().parse().expect("port number");
        let seen = listener(LOOPBACK, port, std::process::id()).expect("lookup");
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(seen, Listener::Another);
    }
}
